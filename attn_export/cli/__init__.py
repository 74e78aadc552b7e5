"""The ``attn-export`` command line: one module per command, all on one typer app.

``main`` is the console entry point (``attn_export.cli:main``); see ``cli.app`` for the
exit codes every command shares. Importing this package imports nothing else, so Ctrl-C or
SIGTERM while the command's own imports load (typer, torch) is handled like at any other
moment: "interrupted", exit 130 or 143. The typer app is ``attn_export.cli.app.app``.
"""

from __future__ import annotations

__all__ = ["main"]


def main(argv: list[str] | None = None) -> int:
    """Console entry point: ``attn_export.cli.app.main`` with the signal handlers in place first."""
    import signal
    import sys

    from attn_export.host.preflight import environment_problem

    problem = environment_problem(sys.argv[1:] if argv is None else argv)  # first: torch aborts without a cwd
    if problem:
        print(f"attn-export: error: {problem}", file=sys.stderr)
        return 2

    from attn_export.host.signals import Terminated, announce, interrupt_signals, raise_if_interrupted

    with interrupt_signals():
        try:
            from attn_export.cli.app import main as app_main

            raise_if_interrupted()  # a signal some import swallowed
            return app_main(argv)
        except KeyboardInterrupt:
            return announce(signal.SIGINT)
        except Terminated:
            return announce(signal.SIGTERM)

