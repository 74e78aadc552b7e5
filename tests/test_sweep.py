"""attn-export sweep: the grid, the Pareto table, and recipes (main commands) that reproduce their accuracy exactly."""

from __future__ import annotations

import dataclasses
import json
import shlex

import pytest
import typer
from typer.testing import CliRunner

from attn_export.errors import ConfigError
from attn_export.campaigns.sweep import (
    SweepConfig,
    SweepPoint,
    pareto_rows,
    run_sweep,
    write_sweep,
)

TINY = {"d_model": 32, "heads": 4, "batch": 2, "seq_len": 16, "threads": 1, "repeats": 2, "warmup": 1}


def test_grid_drops_meaningless_combinations():
    cfg = SweepConfig(low_rank=(None, 0.5), distill=(None, 10), quantize=(None, "int8"), int8_mode=("static",), calib_method=("minmax", "entropy"),
                      precision=("fp32", "fp16"))  # fmt: skip
    keys = [p.key for p in cfg.points()]
    assert "full-fp32" in keys and "r0.5-d10-static-entropy" in keys
    assert not any(k.startswith("full-d") for k in keys)  # distilling a full-rank layer is a no-op
    assert not any(p.quantize and p.precision == "fp16" for p in cfg.points())
    assert len(keys) == len(set(keys)) == 2 * (1 + 2 + 1) + 1 * (1 + 2 + 1)  # low-rank x 2 steps, full x 1
    with pytest.raises(ConfigError, match="grid is empty"):
        SweepConfig(low_rank=(None,), distill=(5,))
    with pytest.raises(ConfigError, match="int8-mode"):  # the main command's own one-line error for the value
        SweepConfig(int8_mode=("int4",))
    with pytest.raises(ConfigError, match="--max-points 64"):
        SweepConfig(low_rank=(None, 0.9, 0.8, 0.7, 0.6, 0.5, 0.4, 0.3, 0.2, 0.1), calib_method=("minmax", "percentile", "entropy", "per-tensor"))
    assert SweepPoint(0.5, None, "int8", "static", "minmax", "fp32").key == "r0.5-static-minmax"


def _main_app() -> typer.Typer:
    """The attn-export app with every command registered (tests/validate/test_gate.py uses it too)."""
    from attn_export.cli.app import _register, app

    _register()
    return app


_app = _main_app


def test_tiny_sweep_and_every_pareto_recipe_reproduces(tmp_path):
    cfg = SweepConfig(low_rank=(None, 0.5), distill=(None, 3), quantize=(None, "int8"), int8_mode=("dynamic",), calib_method=("minmax",),
                      precision=("fp32",), base=TINY)  # fmt: skip
    assert [p.key for p in cfg.points()] == ["full-fp32", "full-dynamic", "r0.5-fp32", "r0.5-dynamic", "r0.5-d3-fp32", "r0.5-d3-dynamic"]
    cfg = dataclasses.replace(cfg, distill=(None,))  # the run: four points (a distilled point runs in the slow quick sweep)
    result = run_sweep(cfg, calib_dir=tmp_path / "calib")
    assert [p["key"] for p in result["points"]] == ["full-fp32", "full-dynamic", "r0.5-fp32", "r0.5-dynamic"]
    assert result["pareto"] and set(result["pareto"]) <= {p["key"] for p in result["points"]}
    full = result["points"][0]
    assert full["accuracy"]["rel_l2"] < 1e-5 and full["params"] > result["points"][2]["params"]
    # each point is judged with its own tolerance key, as the main command judges it
    assert {p["key"]: p["tolerance"] for p in result["points"]}["full-dynamic"] == {"rel_l2": 0.05, "cosine_min": 0.999}
    files = write_sweep(result, tmp_path / "out")
    assert set(files) == {"sweep.json", "pareto.md", "pareto.png"}
    md = files["pareto.md"].read_text()
    rows = pareto_rows(result)
    assert all(f"`{r[-1]}`" in md for r in rows)

    runner = CliRunner()
    by_key = {p["key"]: p for p in result["points"]}
    for row in rows[:1]:  # one recipe re-run here; the slow test below re-runs every row of a real sweep
        argv = shlex.split(row[-1])
        assert argv[0] == "attn-export" and argv[1].startswith("--"), argv  # the main command, not `sweep`
        res = runner.invoke(_main_app(), argv[1:] + ["--json", "--out", str(tmp_path / row[0])])
        assert res.exit_code == 0, res.output
        report = json.loads(res.stdout)
        stage = next(s for s in report["stages"] if s["name"] == by_key[row[0]]["stage"])
        for metric, value in by_key[row[0]]["accuracy"].items():
            assert stage["accuracy"][metric] == pytest.approx(value, rel=1e-6, abs=1e-6), (row[0], metric)


def test_save_models_keeps_the_pareto_points(tmp_path):
    cfg = SweepConfig(low_rank=(None,), distill=(None,), quantize=(None, "int8"), int8_mode=("dynamic",), calib_method=("minmax",),
                      precision=("fp32",), base=TINY)  # fmt: skip
    result = run_sweep(cfg, calib_dir=tmp_path, save_models=tmp_path / "models")
    saved = sorted(p.name for p in (tmp_path / "models").iterdir())
    assert saved == sorted(f"{k}.onnx" for k in result["pareto"]) and saved


@pytest.mark.slow
def test_quick_sweep_on_the_default_layer_reproduces_every_row(tmp_path):
    cfg = SweepConfig.quick(base={"threads": 2})
    result = run_sweep(cfg)
    by_key = {p["key"]: p for p in result["points"]}
    runner = CliRunner()
    for row in pareto_rows(result):
        res = runner.invoke(_main_app(), shlex.split(row[-1])[1:] + ["--json", "--out", str(tmp_path / row[0])])
        assert res.exit_code == 0, res.output
        report = json.loads(res.stdout)
        stage = next(s for s in report["stages"] if s["name"] == by_key[row[0]]["stage"])
        for metric, value in by_key[row[0]]["accuracy"].items():
            assert stage["accuracy"][metric] == pytest.approx(value, rel=1e-6, abs=1e-6), (row[0], metric)
