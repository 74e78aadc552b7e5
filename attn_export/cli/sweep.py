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
    int_in,
    ints,
    out_console,
    progress_bar,
    strs,
    writing,
)

__all__ = ["register"]


def sweep(
    quick: Annotated[bool, typer.Option("--quick", help="Small grid: low-rank 1,0.5 x distill 0,40 x int8 none,dynamic,static(minmax) x fp32,fp16.", show_default="off")] = False,
    out: Annotated[Path, typer.Option("--out", help="Output folder for sweep.json, pareto.md and pareto.png.")] = Path("attn-export-sweep"),
    checkpoint: Annotated[str | None, typer.Option("--checkpoint", help="Sweep a checkpoint (DIR or minilm) instead of the reference layer.", show_default="off")] = None,
    layers: Annotated[str | None, typer.Option("--layers", help="With --checkpoint: all, or a layer index N.", show_default="all")] = None,
    max_texts: Annotated[int | None, typer.Option("--max-texts", help="With --checkpoint: texts per corpus split.", show_default="320")] = None,
    low_rank: Annotated[str | None, typer.Option("--low-rank", help="Low-rank ratios to try, 1 = none.", show_default="1,0.75,0.5,0.25")] = None,
    distill: Annotated[str | None, typer.Option("--distill", help="Distillation steps to try, 0 = none.", show_default="0,100,300")] = None,
    int8_mode: Annotated[str | None, typer.Option("--int8-mode", help="int8 routes to try: none|dynamic|static.", show_default="all three")] = None,
    calib_method: Annotated[str | None, typer.Option("--calib-method", help="Static calibrations to try: minmax|percentile|entropy.", show_default="all three")] = None,
    precision: Annotated[str | None, typer.Option("--precision", help="Export precisions to try: fp32|fp16.", show_default="fp32,fp16")] = None,
    low_rank_targets: Annotated[str | None, typer.Option("--low-rank-targets", help="Linears to factorize.", show_default="q,k,v,o,ffn for a layer; q,k for --checkpoint")] = None,
    d_model: Annotated[int, typer.Option("--d-model", help="Model width of the reference layer.")] = 512,
    heads: Annotated[int, typer.Option("--heads", help="Attention heads of the reference layer.")] = 8,
    seed: Annotated[int, typer.Option("--seed", help="Seed for weights, data and distillation.")] = 0,
    batch: Annotated[int, typer.Option("--batch", help="Batch size of the latency input.")] = 8,
    seq_len: Annotated[int, typer.Option("--seq-len", help="Sequence length of the latency input.")] = 128,
    repeats: Annotated[int | None, typer.Option("--repeats", help="Timed runs per configuration.", show_default="10, quick 5")] = None,
    calib: Annotated[Path | None, typer.Option("--calib", help="Calibration data (activations for a layer, .txt for a checkpoint).", show_default="the shipped set")] = None,
    threads: ThreadsFlag = None,
    quiet: QuietFlag = False,
    as_json: JsonFlag = False,
) -> None:
    """Grid over compression choices (each option takes a comma list); prints the Pareto front with a reproducible recipe per row."""
    from attn_export.sweep import (
        PARETO_COLUMNS,
        SweepConfig,
        pareto_rows,
        run_sweep,
        write_sweep,
    )

    grid = {
        "rank_ratios": floats(low_rank, "--low-rank"), "distill_steps": ints(distill, "--distill"),
        "int8_modes": strs(int8_mode), "calib_methods": strs(calib_method), "precisions": strs(precision),
        "low_rank_targets": strs(low_rank_targets), "repeats": repeats,
    }  # fmt: skip
    overrides: dict[str, Any] = {k: v for k, v in grid.items() if v is not None}
    overrides.update(d_model=d_model, heads=heads, seed=seed, batch=batch, seq_len=seq_len, threads=threads,
                     calibration=str(calib) if calib else None, checkpoint=checkpoint, layers=layers, max_texts=max_texts)  # fmt: skip
    cfg = SweepConfig.quick(**overrides) if quick else SweepConfig(**overrides)
    _preflight(cfg, out, calib)
    from attn_export.run_dir import claim

    config = {k: (list(v) if isinstance(v, tuple) else v) for k, v in overrides.items()}
    with claim(out, "--out", config={"command": "sweep", "quick": quick, **config}, seed=seed):
        with progress_bar(not (quiet or as_json), f"sweep ({len(cfg.points())} configs)") as cb:
            result = run_sweep(cfg, progress=cb)
        with writing(out, "--out"):
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


def _preflight(cfg: Any, out: Path, calib: Path | None) -> None:
    """The main command's bounds, paths and memory estimate for the sweep's subject, before any work."""
    from attn_export.config import LIMITS, RunConfig

    int_in("--repeats", cfg.repeats, 1, LIMITS["repeats"])
    for steps in cfg.distill_steps:
        int_in("--distill", steps, 0, LIMITS["distill"])
    subject: dict[str, Any] = {"checkpoint": cfg.checkpoint, "layers": cfg.layers} if cfg.checkpoint else {"d_model": cfg.d_model, "heads": cfg.heads}
    probe = RunConfig(**subject, seed=cfg.seed, batch=cfg.batch, seq_len=cfg.seq_len, threads=cfg.threads, out=out, render=False,
                      quantize="int8", low_rank=0.5 if any(r < 1.0 for r in cfg.rank_ratios) else None,
                      calib=calib)  # fmt: skip
    probe.check_paths()
    probe.check_memory()


def register(app: typer.Typer) -> None:
    app.command("sweep")(sweep)
