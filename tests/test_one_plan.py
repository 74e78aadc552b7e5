"""One planner: the main command, the sweep and the bench build their stages with the same configs.

Each of the three reaches its stages through ``make_plan`` of a ``RunConfig``; these tests build
the plans of one shape through all three front ends and compare the method configs, the
tolerance keys and the low-rank targets, so a default changed in one place changes all of them.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest
import typer

from attn_export.campaigns.bench.variants import VARIANTS
from attn_export.compress.registry import Method, compose_key, methods, precisions, route_names
from attn_export.config.run import RunConfig
from attn_export.pipeline.plan import make_plan
from attn_export.campaigns.sweep import SweepConfig, SweepPoint

CALIB = Path(__file__).resolve().parents[1] / "attn_export" / "data" / "calibration" / "synthetic_d512.npz"


def _method_steps(cfg: RunConfig) -> dict[str, tuple[Method, str]]:
    """Stage name -> (method config, the tolerance key its artifact is held to)."""
    plan = make_plan(cfg)
    keys: dict[str, str] = {"subject": "fp32"}
    out = {}
    for step in plan.steps:
        if isinstance(step.config, Method):
            keys[step.name] = compose_key(keys[step.source], step.config.tolerance)
            out[step.name] = (step.config, keys[step.name])
        else:
            keys[step.name] = step.config.precision
    return out


def _bench(variant: str) -> RunConfig:
    run = dict(VARIANTS[variant].run or {})
    return RunConfig(d_model=512, heads=8, mask="padding", seed=0, calib=CALIB, render=False, **run)


@pytest.mark.parametrize("route", ["static", "dynamic"])
def test_int8_routes_are_the_same_configs_in_main_sweep_and_bench(route):
    main = _method_steps(RunConfig(quantize="int8", int8_mode=route, calib=CALIB))[f"int8-{route}"]
    point = SweepPoint(None, None, "int8", route, "minmax" if route == "static" else None, "fp32")
    sweep = _method_steps(SweepConfig(base={"calib": CALIB}, low_rank=(None,), distill=(None,), quantize=("int8",), int8_mode=(route,),
                                      calib_method=("minmax",), precision=("fp32",)).run_config(point))[f"int8-{route}"]  # fmt: skip
    bench = _method_steps(_bench(f"ort-int8-{route}"))[f"int8-{route}"]
    assert main == sweep == bench
    if route == "static":
        assert main[0].fallback == "auto"  # the shipped default, in all three
    assert main[1] == "int8"


def test_low_rank_targets_and_tolerances_agree_in_main_sweep_and_bench():
    main = _method_steps(RunConfig(low_rank=0.5, quantize="int8", int8_mode="dynamic", calib=CALIB))
    point = SweepPoint(0.5, None, "int8", "dynamic", None, "fp32")
    sweep = _method_steps(SweepConfig(base={"calib": CALIB}, low_rank=(0.5,), distill=(None,), int8_mode=("dynamic",), quantize=("int8",),
                                      precision=("fp32",)).run_config(point))  # fmt: skip
    bench = _method_steps(_bench("ort-lowrank-int8-dynamic"))
    assert main == sweep == bench
    assert main["lowrank"][0].targets == ("q", "k", "v", "o") and main["lowrank"][1] == "lowrank"
    assert main["lowrank-int8-dynamic"][1] == "lowrank-int8"


def test_a_checkpoint_sweep_point_is_the_main_commands_plan():
    """``attn-export sweep --checkpoint minilm``: a point's stages, configs and tolerance keys are the main command's
    (the encoder's int8 bar, not fp32's); the whole sweep run is the slow test_sweep_over_a_checkpoint."""
    base = {"checkpoint": "minilm", "encoder_form": "padded"}
    main = _method_steps(RunConfig(quantize="int8", int8_mode="dynamic", **base))
    point = SweepPoint(None, None, "int8", "dynamic", None, "fp32")
    sweep = _method_steps(SweepConfig(base=base, low_rank=(None,), distill=(None,), quantize=("int8",), int8_mode=("dynamic",),
                                      calib_method=("minmax",), precision=("fp32",)).run_config(point))  # fmt: skip
    assert main == sweep and main["int8-dynamic"][1] == "int8"
    assert main["int8-dynamic"][0].smoothquant_alpha == "auto" and main["int8-dynamic"][0].quantize_embeddings  # the checkpoint's defaults


def _params(name: str | None) -> dict[str, typer.core.click.Parameter]:  # type: ignore[name-defined]
    """The long options of the main command (``name`` None) or of a subcommand."""
    from attn_export.cli.app import _register, app

    _register()
    click_app = typer.main.get_command(app)
    cmd = click_app if name is None else click_app.commands[name]  # type: ignore[attr-defined]
    return {p.opts[0]: p for p in cmd.params if p.opts and p.opts[0].startswith("--")}


def test_option_names_and_values_agree_across_main_sweep_and_bench():
    """Every option sweep or bench shares with the main command takes the main command's values: an axis a comma
    list of them (plus none), any other option one of them, meaning the same thing."""
    from attn_export.cli.sweep import sweep_axis

    main, sweep, bench = _params(None), _params("sweep"), _params("bench")
    shared = (set(sweep) | set(bench)) & set(main)
    assert {"--low-rank", "--distill", "--quantize", "--int8-mode", "--calib-method", "--precision", "--checkpoint", "--d-model", "--heads",
            "--threads", "--seed", "--batch", "--seq-len", "--calib", "--target"} <= shared  # fmt: skip
    axes = {"--low-rank": float, "--distill": int, "--quantize": str, "--int8-mode": str, "--calib-method": str, "--precision": str}
    grid = SweepConfig()
    defaults = {"--low-rank": grid.low_rank, "--distill": grid.distill, "--quantize": grid.quantize, "--int8-mode": grid.int8_mode,
                "--calib-method": grid.calib_method, "--precision": grid.precision}  # fmt: skip
    for flag, kind in axes.items():
        values = sweep_axis(",".join("none" if v is None else str(v) for v in defaults[flag]), flag, kind)
        assert values == defaults[flag]
        for value in values or ():
            if value is None:
                continue
            field = flag[2:].replace("-", "_")
            extra = {"quantize": "int8"} if field in ("int8_mode", "calib_method") else {"low_rank": 0.5} if field == "distill" else {}
            RunConfig(**{field: value, **extra})  # the main command accepts every default grid value
    # every --int8-mode/--quantize value the main command takes, the sweep takes too, and nothing else
    modes = {"auto", *[r for p in precisions() for r in route_names(p)]}
    for mode in modes:
        RunConfig(quantize="int8", int8_mode=mode)
    for flag in shared - set(axes):
        for cmd in (sweep, bench):
            if flag in cmd:
                assert type(cmd[flag].bare_type) is type(main[flag].bare_type), flag  # same value type: the same option


def test_registry_describes_every_method_and_the_plan_names_none():
    """A method says what it is; plan.py never names one (a new method is a module and a registry line)."""
    for m in methods():
        assert m.role in ("transform", "route", "refine") and m.stage and m.tolerance, m
        assert dataclasses.is_dataclass(m) and m.__dataclass_params__.frozen, m  # type: ignore[attr-defined]
        if m.role == "refine":
            assert m.refines is not None and m.refines.role == "route"
    plan_src = (Path(__file__).resolve().parents[1] / "attn_export" / "pipeline" / "plan.py").read_text()
    for m in methods():
        assert m.__name__ not in plan_src, f"plan.py names {m.__name__}"
        if m.route:
            assert f'"{m.route}"' not in plan_src, f"plan.py branches on the route string {m.route!r}"
