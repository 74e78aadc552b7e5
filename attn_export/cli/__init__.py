"""The ``attn-export`` command line: one module per command, all on one typer app.

``main`` is the console entry point (``attn_export.cli:main``); see ``cli.app`` for the
exit codes every command shares.
"""

from __future__ import annotations

from attn_export.cli.app import app, fill_optional_values, main

__all__ = ["app", "fill_optional_values", "main"]
