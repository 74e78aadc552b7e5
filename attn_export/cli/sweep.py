"""``attn-export sweep``: a grid of main-command configurations and its accuracy/latency Pareto front.

Option names and values are the main command's: an axis takes a comma list of the values its
main-command flag takes, plus ``none`` for the flag left off (``--low-rank none,0.5``); every
other option is one value, meaning what it means for ``attn-export``.
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.table import Table

from attn_export.cli._common import out_console, progress_bar, writing
from attn_export.cli.help import one_of
from attn_export.cli.options import (
    BatchOpt,
    CalibOpt,
    CheckpointMainOpt,
    DModelOpt,
    ForceOpt,
    HeadsOpt,
    JsonOpt,
    LanguagesOpt,
    LayersMainOpt,
    LowRankTargetsOpt,
    MaxLenOpt,
    MaxTextsOpt,
    QuietOpt,
    SeedOpt,
    SeqLenOpt,
    TargetOpt,
    ThreadsOpt,
    WarmupOpt,
)
from attn_export.config.run import run_default
from attn_export.campaigns.sweep import MAX_POINTS, POINT_DEFAULTS, QUICK, QUICK_REPEATS, SweepConfig
from attn_export.compress.registry import precisions, route_choices
from attn_export.vocab.choices import CALIB_CHOICES
from attn_export.vocab.precisions import precision_names

__all__ = ["register", "sweep_axis"]

_AXES = "Sweep axes (comma lists; none = the option left off)"  # a panel title is cut, not wrapped: it fits 80 columns


def _axis(name: str) -> str:
    """An axis's default as its flag writes it (``none,0.75,0.5,0.25``): ``SweepConfig``'s, shown in ``--help``."""
    return _values(next(f.default for f in dataclasses.fields(SweepConfig) if f.name == name))


def _preset(axes: dict[str, tuple[Any, ...]]) -> str:
    """A grid as the flags that ask for it (``--low-rank none,0.5 --distill none,40 ...``)."""
    return " ".join(f"--{name.replace('_', '-')} {_values(values)}" for name, values in axes.items())


def _values(axis: tuple[Any, ...]) -> str:
    """An axis's values as its flag takes them (``none,0.5``)."""
    return ",".join("none" if v is None else f"{v:g}" if isinstance(v, float) else str(v) for v in axis)


def sweep_axis(text: str | None, flag: str, kind: type) -> tuple[Any, ...] | None:
    """``"none,0.5"`` -> ``(None, 0.5)`` for axis ``flag`` (values are checked by RunConfig, as the main command's)."""
    from attn_export.errors import ConfigError

    if text is None:
        return None
    values: list[Any] = []
    for part in (t.strip() for t in text.split(",")):
        if not part:
            continue
        if part.lower() == "none":
            values.append(None)
            continue
        try:
            values.append(kind(part))
        except ValueError:
            raise ConfigError(f"expected {flag} as a comma list of {kind.__name__} values or none, got {part!r} in {text!r}") from None
    if not values:
        raise ConfigError(f"expected {flag} to name at least one value, got {text!r}")
    if len(set(values)) != len(values):  # the grid's size is bounded by --max-points; a repeat is a typo, not a point
        repeated = next(v for v in values if values.count(v) > 1)
        raise ConfigError(f"expected each {flag} value once, got {'none' if repeated is None else repeated} {values.count(repeated)} times; "
                          f"use {flag} {','.join('none' if v is None else str(v) for v in dict.fromkeys(values))}")  # fmt: skip
    return tuple(values)


def sweep(
    quick: Annotated[bool, typer.Option("--quick", metavar="", help=f"Small grid: {_preset(QUICK)}; an axis flag given beside it replaces that axis.")] = False,
    out: Annotated[Path, typer.Option("--out", help="Output folder for sweep.json, pareto.md and pareto.png.")] = Path("attn-export-sweep"),
    low_rank: Annotated[str | None, typer.Option("--low-rank", help="Low-rank ratios (none = no factorization).", show_default=_axis("low_rank"), rich_help_panel=_AXES)] = None,
    distill: Annotated[str | None, typer.Option("--distill", help="Distillation steps (none = no distillation).", show_default=_axis("distill"), rich_help_panel=_AXES)] = None,
    quantize: Annotated[str | None, typer.Option("--quantize", help=f"8-bit precisions: {one_of((*precisions(), 'auto', 'none'))} (none = no quantization).", show_default=_axis("quantize"), rich_help_panel=_AXES)] = None,
    int8_mode: Annotated[str | None, typer.Option("--int8-mode", help="8-bit routes of each quantized point: " + one_of(route_choices(), {"auto": "the main command's selection"}) + ".", show_default=_axis("int8_mode"), rich_help_panel=_AXES)] = None,
    calib_method: Annotated[str | None, typer.Option("--calib-method", help=f"Static calibrations (static and auto points): {one_of(CALIB_CHOICES)}.", show_default=_axis("calib_method"), rich_help_panel=_AXES)] = None,
    precision: Annotated[str | None, typer.Option("--precision", help=f"Export precisions: {one_of(precision_names(export_float=True))}.", show_default=_axis("precision"), rich_help_panel=_AXES)] = None,
    checkpoint: CheckpointMainOpt = None,
    layers: LayersMainOpt = None,
    max_len: MaxLenOpt = None,
    max_texts: MaxTextsOpt = None,
    languages: LanguagesOpt = None,
    d_model: DModelOpt = None,
    heads: HeadsOpt = None,
    seed: SeedOpt = run_default("seed"),
    batch: BatchOpt = run_default("batch"),
    seq_len: SeqLenOpt = run_default("seq_len"),
    low_rank_targets: LowRankTargetsOpt = None,
    calib: CalibOpt = None,
    target: TargetOpt = run_default("target"),
    threads: ThreadsOpt = run_default("threads"),
    warmup: WarmupOpt = POINT_DEFAULTS["warmup"],
    repeats: Annotated[int | None, typer.Option("--repeats", help="Timed runs per configuration.", show_default=f"{POINT_DEFAULTS['repeats']}, quick {QUICK_REPEATS}")] = None,
    max_points: Annotated[int, typer.Option("--max-points", help="Refuse a grid with more points than this (each point is a pipeline run).")] = MAX_POINTS,
    yes: Annotated[bool, typer.Option("--yes", metavar="", help="Run a grid larger than --max-points anyway.")] = False,
    save_models: Annotated[bool, typer.Option("--save-models", metavar="", help="Keep the Pareto points' models in OUT/models/.")] = False,
    force: ForceOpt = False,
    quiet: QuietOpt = False,
    as_json: JsonOpt = False,
) -> None:
    """Grid over compression choices (each axis a comma list); prints the Pareto front with the main command that rebuilds each row."""
    from attn_export.campaigns.sweep import PARETO_COLUMNS, SweepConfig, pareto_rows, run_sweep, write_sweep

    axes = {
        "low_rank": sweep_axis(low_rank, "--low-rank", float), "distill": sweep_axis(distill, "--distill", int),
        "quantize": sweep_axis(quantize, "--quantize", str), "int8_mode": sweep_axis(int8_mode, "--int8-mode", str),
        "calib_method": sweep_axis(calib_method, "--calib-method", str), "precision": sweep_axis(precision, "--precision", str),
    }  # fmt: skip
    base = {"checkpoint": checkpoint, "layers": layers, "max_len": max_len, "max_texts": max_texts, "languages": languages, "d_model": d_model,
            "heads": heads, "seed": seed, "batch": batch, "seq_len": seq_len, "low_rank_targets": low_rank_targets, "calib": calib,
            "target": target, "threads": threads, "warmup": warmup, "repeats": repeats}  # fmt: skip
    base = {k: v for k, v in base.items() if v is not None}
    overrides: dict[str, Any] = {k: v for k, v in axes.items() if v is not None}
    limit = 2**31 if yes else max_points
    cfg = SweepConfig.quick(base=base, max_points=limit, **overrides) if quick else SweepConfig(base={"repeats": POINT_DEFAULTS["repeats"], **base}, max_points=limit, **overrides)
    for point in cfg.points():  # every point is a valid main command, refused as one before any work
        cfg.run_config(point, out)
    probe = max((cfg.run_config(p, out) for p in cfg.points()), key=lambda c: c.estimate_memory().total)
    probe.force = force  # --out is the sweep's: files attn-export did not write are refused, or moved aside with --force
    probe.preflight()
    from attn_export.outdir.claim import claim

    config = {"command": "sweep", "quick": quick, **{k: list(v) for k, v in overrides.items()}, **{k: str(v) for k, v in base.items()}}
    with claim(out, "--out", config=config, seed=seed, force=force):
        with progress_bar(not (quiet or as_json), f"sweep ({len(cfg.points())} configs)") as cb:
            result = run_sweep(cfg, progress=cb, save_models=out / "models" if save_models else None)
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


def register(app: typer.Typer) -> None:
    app.command("sweep")(sweep)
