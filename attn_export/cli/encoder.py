"""``attn-export encoder``: a pretrained checkpoint through every route at once.

It is the main command with a preset, not a second pipeline:

    attn-export encoder [OPTIONS]
      == attn-export --checkpoint minilm --precision fp16 --quantize int8 --low-rank --distill [OPTIONS]

Every main-command option is accepted and wins over the preset (``--checkpoint DIR``,
``--layers 3``, ``--out``, ``--distill 40``, ...). ``attn-export encoder --help`` therefore
lists the main command's options, under the preset.
"""

from __future__ import annotations

import copy
import inspect

import typer

__all__ = ["ENCODER_PRESET", "register"]

ENCODER_PRESET: tuple[str, ...] = ("--checkpoint", "minilm", "--precision", "fp16", "--quantize", "int8", "--low-rank", "0.5", "--distill", "200")


def register(app: typer.Typer) -> None:
    @app.command(
        "encoder",
        context_settings={"allow_extra_args": True, "ignore_unknown_options": True, "help_option_names": []},
        add_help_option=False,
    )
    def encoder(ctx: typer.Context) -> None:
        """Every route for a checkpoint: fp32, fp16, int8 (every route the target can deploy), low-rank + distillation.
        Same as `attn-export --checkpoint minilm --precision fp16 --quantize int8 --low-rank --distill`; takes every
        main-command option (see `attn-export --help`), which wins over the preset."""
        from attn_export.cli.app import fill_optional_values

        extra = list(ctx.args)
        if "--help" in extra or "-h" in extra:
            typer.echo(_help(ctx, inspect.cleandoc(encoder.__doc__ or "")))
            raise typer.Exit(0)
        argv = [*ENCODER_PRESET, *fill_optional_values(extra)]
        # click keeps the last value of a repeated option, so the user's options override the preset
        code = ctx.find_root().command.main(args=argv, prog_name="attn-export", standalone_mode=False)
        if code:
            raise typer.Exit(code=int(code))


def _help(ctx: typer.Context, doc: str) -> str:
    """The main command's option panels under this preset's description: the options ``encoder`` takes are exactly those."""
    root = ctx.find_root().command
    view = copy.copy(root)  # the root group without its subcommands, titled as this command
    view.commands = {}  # type: ignore[attr-defined]
    view.subcommand_metavar = ""  # type: ignore[attr-defined]
    preset = " ".join(ENCODER_PRESET)
    view.help = f"{doc}\n\nPreset: {preset} (replaces those defaults below; any option given wins over it)."
    with view.make_context("attn-export encoder", [], resilient_parsing=True) as view_ctx:
        return view.get_help(view_ctx)
