"""``attn-export calib``: generate and check calibration sets.

The shipped sets in ``attn_export/data/calibration/`` were made with ``calib generate``; the same
command makes sets for other layer widths, and ``calib check`` runs the loader's checks
on any file before a long compression run trips over it.
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer
from rich.console import Console

from attn_export.cli.help import App
from attn_export.errors import ConfigError

DEFAULT_MAX_BYTES = 512 * 2**20  # attn_export.compress.calib.data.DEFAULT_MAX_BYTES (not imported: it loads torch)

__all__ = ["calib_app", "register"]

calib_app = App(help="Generate and check calibration/validation activation sets.", no_args_is_help=True)
_console = Console()


@calib_app.command("generate")
def generate(
    out: Annotated[Path, typer.Option("--out", "-o", help="Output file (.npz or .safetensors).")],
    d_model: Annotated[int, typer.Option(help="Feature size D of the layer input.")] = 512,
    n_calib: Annotated[int, typer.Option(help="Sequences in the calibration split.")] = 32,
    n_val: Annotated[int, typer.Option(help="Sequences in the validation split.")] = 8,
    seq_len: Annotated[int, typer.Option(help="Sequence length L (shorter sequences are padded).")] = 64,
    seed: Annotated[int, typer.Option(help="Random seed; the same seed gives the same file.")] = 0,
    decay: Annotated[float, typer.Option(help="Covariance spectrum exponent: eigenvalue k ~ k^-decay.")] = 1.0,
    outliers: Annotated[int, typer.Option(help="Outlier channels with large gain and offset.")] = 4,
    dtype: Annotated[str, typer.Option(help="Storage dtype: float16 (half the size) or float32.")] = "float16",
    overwrite: Annotated[bool, typer.Option(metavar="", help="Replace an existing file.")] = False,
) -> None:
    """Write a synthetic set of LayerNorm-ed hidden states with padding masks (recipe: attn_export/data/calibration/README.md)."""
    from attn_export.cli._common import writing
    from attn_export.compress.calib.data import load_calibration
    from attn_export.compress.calib.generate import check_generate_args, generate_calibration
    from attn_export.host.paths import check_output_file

    # every argument, the size of the file and the memory it takes, before any work
    check_generate_args(out, d_model, n_calib, n_val, seq_len, seed, decay, outliers, 0.25, dtype)
    check_output_file(out, "--out")
    if out.exists() and not overwrite:
        raise ConfigError(f"--out {out} exists; pass --overwrite to replace it")
    with writing(out, "--out"):
        path = generate_calibration(out, d_model, n_calib, n_val, seq_len, seed, decay=decay, n_outliers=outliers, dtype=dtype)
    data = load_calibration(path, d_model)
    _console.print(f"wrote {path} ({path.stat().st_size} bytes)", markup=False)
    _console.print(data.describe(), markup=False, soft_wrap=True)


@calib_app.command("check")
def check(
    path: Annotated[Path, typer.Argument(help="Calibration file or directory to check.")],
    d_model: Annotated[int | None, typer.Option(help="Expected feature size (the layer's d_model).", show_default="any")] = None,
    max_bytes: Annotated[int, typer.Option(help="Refuse files larger than this.")] = DEFAULT_MAX_BYTES,
) -> None:
    """Load a calibration set with all checks (shape, dtype, NaN/Inf, values whose squares overflow float32, masks, disjoint splits)."""
    from attn_export.cli._common import int_in
    from attn_export.compress.calib.data import load_calibration
    from attn_export.config.run import LIMITS

    int_in("--d-model", d_model, 1, LIMITS["d_model"])
    int_in("--max-bytes", max_bytes, 1, 2**40)
    data = load_calibration(path, d_model, max_bytes=max_bytes)
    _console.print(f"ok: {data.describe()}", markup=False, soft_wrap=True)


def register(app: typer.Typer) -> None:
    """Add the ``calib`` command group to the main CLI."""
    app.add_typer(calib_app, name="calib")
