"""``attn-export bench``: every variant side by side over a grid of shapes (latency, memory, efficiency)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated, Any

import typer

from attn_export.cli._common import (
    QuietFlag,
    ThreadsFlag,
    int_in,
    ints,
    out_console,
    progress_bar,
    strs,
    writing,
)
from attn_export.campaigns.bench.grid import GRID, OPT_IN_VARIANTS, QUICK, VARIANT_NAMES  # light: the defaults --help shows
from attn_export.cli.help import one_of
from attn_export.cli.options import ForceOpt
from attn_export.subjects.kinds import KINDS  # the default reference layer's shape (BenchConfig's too)

__all__ = ["CEILING_SIZE", "register"]

# N of the NxN ceiling GEMMs: three N x N float32 matrices (8192: 768 MiB) and seconds per run.
CEILING_SIZE = (16, 8192)


def _ints(values: int | tuple[int, ...]) -> str:
    return ",".join(map(str, values)) if isinstance(values, tuple) else str(values)


def _quick(name: str) -> str:
    """A grid default as ``--help`` shows it: the plain run's, then ``--quick``'s (``grid.py``)."""
    return f"{_ints(GRID[name])}; quick {_ints(QUICK[name])}"


def bench(
    quick: Annotated[bool, typer.Option("--quick", metavar="", help=f"Small grid (L {_ints(QUICK['seqs'])} x B {_ints(QUICK['batches'])}) and fewer repeats (the time it took is printed at the end).")] = False,
    as_json: Annotated[bool, typer.Option("--json", metavar="", help="Print the results as JSON on stdout (they are always written to OUT/bench.json).")] = False,
    out: Annotated[Path, typer.Option("--out", help="Output folder for bench.json, bench.md and seq_scaling.png.")] = Path("attn-export-bench"),
    seqs: Annotated[str | None, typer.Option("--seqs", help="Sequence lengths, a comma list.", show_default=_quick("seqs"))] = None,
    batches: Annotated[str | None, typer.Option("--batches", help="Batch sizes, a comma list.", show_default=_quick("batches"))] = None,
    variants: Annotated[str | None, typer.Option("--variants", help=f"Comma list of variants: {one_of(VARIANT_NAMES)}.", show_default=f"all but {', '.join(OPT_IN_VARIANTS)}")] = None,
    d_model: Annotated[int, typer.Option("--d-model", help="Model width of the default TransformerLayer.")] = KINDS["layer"].defaults["d_model"],
    heads: Annotated[int, typer.Option("--heads", help="Attention heads.")] = KINDS["layer"].defaults["heads"],
    ceiling_size: Annotated[int | None, typer.Option("--ceiling-size", help="N of the NxN GEMMs that measure the ceilings.", show_default=_quick("ceiling_size"))] = None,
    threads: ThreadsFlag = None,
    force: ForceOpt = False,
    quiet: QuietFlag = False,
) -> None:
    """Every variant side by side: latency, ratio to eager, memory, efficiency vs measured GEMM ceilings."""
    from attn_export.config.run import LIMITS
    from attn_export.host.paths import check_output_dir
    from attn_export.outdir.claim import check_owned, claim
    from attn_export.vocab.choices import check_heads

    # every flag and the output folder before the first GEMM (the main command's bounds)
    int_in("--d-model", d_model, 1, LIMITS["d_model"])
    int_in("--heads", heads, 1, LIMITS["heads"])
    check_heads(d_model, heads)
    int_in("--threads", threads, 1, LIMITS["threads"])
    int_in("--ceiling-size", ceiling_size, CEILING_SIZE[0], CEILING_SIZE[1])
    seq_list, batch_list = ints(seqs, "--seqs"), ints(batches, "--batches")
    for flag, values, hi in (("--seqs", seq_list, LIMITS["seq_len"]), ("--batches", batch_list, LIMITS["batch"])):
        for v in values or ():
            int_in(flag, v, 1, hi)
    overrides: dict[str, Any] = {"d_model": d_model, "heads": heads, "threads": threads}
    for key, val in (("seqs", seq_list), ("batches", batch_list), ("variants", strs(variants, "--variants")), ("ceiling_size", ceiling_size)):
        if val is not None:
            overrides[key] = val
    check_output_dir(out, "--out")
    check_owned(out, "--out", force)  # before torch is imported: the user's bench.json is never overwritten
    import time

    from attn_export.campaigns.bench import BenchConfig, markdown_tables, results_table, run_bench, variants_table
    from attn_export.validate.plots import plot_seq_scaling
    from attn_export.validate.report import atomic_write_text

    cfg = BenchConfig.quick(**overrides) if quick else BenchConfig(**overrides)
    started = time.perf_counter()
    config = {k: (list(v) if isinstance(v, tuple) else v) for k, v in overrides.items()}
    with claim(out, "--out", config={"command": "bench", "quick": quick, **config}, seed=cfg.seed, force=force):
        with progress_bar(not (quiet or as_json), "bench") as cb:
            result = run_bench(cfg, progress=cb)
        target = out / "bench.json"
        with writing(out, "--out"):
            atomic_write_text(target, json.dumps(result, indent=2) + "\n")
            atomic_write_text(out / "bench.md", "# attn-export bench\n\n" + markdown_tables(result))
            plot_seq_scaling(result, out / "seq_scaling.png")
    if as_json:
        print(json.dumps(result, indent=2))
        return
    if not quiet:
        out_console.print(results_table(result))
        out_console.print(variants_table(result))
        for s in result["skipped"]:
            who = f"{s['variant']} at " if s.get("variant") else ""
            out_console.print(f"skipped {who}batch {s['batch']}, seq {s['seq']}: {s['reason']}", highlight=False)
    out_console.print(f"wrote {target}, {out / 'bench.md'}, {out / 'seq_scaling.png'} ({time.perf_counter() - started:.0f} s)", highlight=False)


def register(app: typer.Typer) -> None:
    app.command("bench")(bench)
