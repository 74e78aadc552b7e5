"""``attn-export sweep``: a grid over the compression choices and its accuracy/latency Pareto front."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.table import Table

from attn_export.cli._common import (
    JsonFlag,
    QuietFlag,
    ThreadsFlag,
    floats,
    ints,
    out_console,
    progress_bar,
    strs,
)

__all__ = ["register"]


def sweep(
    quick: Annotated[bool, typer.Option("--quick", help="Small grid: rank 1,0.5 x distill 0,40 x int8 none,dynamic,static(minmax) x fp32,fp16.")] = False,
    out: Annotated[Path, typer.Option("--out", help="Output folder for sweep.json, pareto.md and pareto.png.")] = Path("attn-export-sweep"),
    rank_ratios: Annotated[str | None, typer.Option("--rank-ratios", help="Low-rank ratios, 1 = none (default 1,0.75,0.5,0.25).")] = None,
    distill_steps: Annotated[str | None, typer.Option("--distill-steps", help="Distillation steps (default 0,100,300).")] = None,
    int8_modes: Annotated[str | None, typer.Option("--int8-modes", help="none|dynamic|static (default all).")] = None,
    calib_methods: Annotated[str | None, typer.Option("--calib-methods", help="Static int8 calibration: minmax|percentile|entropy (default all).")] = None,
    precisions: Annotated[str | None, typer.Option("--precisions", help="fp32|fp16 (default both).")] = None,
    low_rank_targets: Annotated[str | None, typer.Option("--low-rank-targets", help="Linears to factorize (default q,k,v,o,ffn).")] = None,
    d_model: Annotated[int, typer.Option("--d-model", help="Model width.")] = 512,
    heads: Annotated[int, typer.Option("--heads", help="Attention heads.")] = 8,
    seed: Annotated[int, typer.Option("--seed", help="Seed for weights, data and distillation.")] = 0,
    batch: Annotated[int, typer.Option("--batch", help="Batch size of the latency input.")] = 8,
    seq_len: Annotated[int, typer.Option("--seq-len", help="Sequence length of the latency input.")] = 128,
    repeats: Annotated[int | None, typer.Option("--repeats", help="Timed runs per configuration (default 10, quick 5).")] = None,
    calibration: Annotated[Path | None, typer.Option("--calibration", help="Calibration data (.npz/.safetensors); default: the shipped set.")] = None,
    threads: ThreadsFlag = None,
    quiet: QuietFlag = False,
    as_json: JsonFlag = False,
) -> None:
    """Grid over compression choices; prints the Pareto front with a reproducible recipe per row."""
    from attn_export.sweep import (
        PARETO_COLUMNS,
        SweepConfig,
        pareto_rows,
        run_sweep,
        write_sweep,
    )

    grid = {
        "rank_ratios": floats(rank_ratios, "--rank-ratios"), "distill_steps": ints(distill_steps, "--distill-steps"),
        "int8_modes": strs(int8_modes), "calib_methods": strs(calib_methods), "precisions": strs(precisions),
        "low_rank_targets": strs(low_rank_targets), "repeats": repeats,
    }  # fmt: skip
    overrides: dict[str, Any] = {k: v for k, v in grid.items() if v is not None}
    overrides.update(d_model=d_model, heads=heads, seed=seed, batch=batch, seq_len=seq_len, threads=threads,
                     calibration=str(calibration) if calibration else None)  # fmt: skip
    cfg = SweepConfig.quick(**overrides) if quick else SweepConfig(**overrides)
    with progress_bar(not (quiet or as_json), f"sweep ({len(cfg.points())} configs)") as cb:
        result = run_sweep(cfg, progress=cb)
    files = write_sweep(result, out)
    if as_json:
        print(json.dumps(result, indent=2))
        return
    table = Table(title=f"Pareto front: {len(result['pareto'])} of {len(result['points'])} configurations (SQNR vs p50 latency)")
    for col in PARETO_COLUMNS:
        table.add_column(col, justify="left" if col in ("config", "recipe") else "right", overflow="fold")
    for row in pareto_rows(result):
        table.add_row(*row)
    out_console.print(table)
    if not quiet:
        out_console.print(f"wrote {', '.join(str(p) for p in files.values())}", highlight=False)


def register(app: typer.Typer) -> None:
    app.command("sweep")(sweep)
