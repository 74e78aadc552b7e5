"""``attn-export encoder``: a pretrained checkpoint through every route at once.

It is the main command with a preset, not a second pipeline:

    attn-export encoder [OPTIONS]
      == attn-export --checkpoint minilm --precision fp16 --quantize int8 --low-rank --distill [OPTIONS]

Every main-command option is accepted and wins over the preset (``--checkpoint DIR``,
``--layers 3``, ``--out``, ``--distill 40``, ...).
"""

from __future__ import annotations

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
            typer.echo(encoder.__doc__ or "")
            raise typer.Exit(0)
        argv = [*ENCODER_PRESET, *fill_optional_values(extra)]
        # click keeps the last value of a repeated option, so the user's options override the preset
        code = ctx.find_root().command.main(args=argv, prog_name="attn-export", standalone_mode=False)
        if code:
            raise typer.Exit(code=int(code))
