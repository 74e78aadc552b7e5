"""attn-export sweep: the grid, the Pareto table, and recipes that reproduce their accuracy exactly."""

from __future__ import annotations

import json
import shlex

import pytest
import typer
from typer.testing import CliRunner

from attn_export.errors import ConfigError
from attn_export.sweep import (
    SweepConfig,
    SweepPoint,
    pareto_rows,
    run_sweep,
    write_sweep,
)

TINY = {"d_model": 32, "heads": 4, "batch": 2, "seq_len": 16, "threads": 1, "repeats": 2, "warmup": 1}


def _app() -> typer.Typer:
    """A typer app with the result commands (sweep, bench, check, report), as the CLI registers them."""
    from attn_export.cli import bench, check, report, sweep

    app = typer.Typer()

    @app.callback()
    def _root() -> None:
        """attn-export (test app)."""

    for module in (sweep, bench, check, report):
        module.register(app)
    return app


def test_grid_drops_meaningless_combinations():
    cfg = SweepConfig(rank_ratios=(1.0, 0.5), distill_steps=(0, 10), int8_modes=("none", "static"), calib_methods=("minmax", "entropy"), precisions=("fp32", "fp16"))
    keys = [p.key for p in cfg.points()]
    assert "full-fp32" in keys and "r0.5-d10-static-entropy" in keys
    assert not any(k.startswith("full-d") for k in keys)  # distilling a full-rank layer is a no-op
    assert not any(p.int8 != "none" and p.precision == "fp16" for p in cfg.points())
    assert len(keys) == len(set(keys)) == 2 * (1 + 2 + 1) + 1 * (1 + 2 + 1)  # low-rank x 2 steps, full x 1
    with pytest.raises(ConfigError, match="grid is empty"):
        SweepConfig(rank_ratios=(1.0,), distill_steps=(5,))
    with pytest.raises(ConfigError, match="int8-modes"):
        SweepConfig(int8_modes=("int4",))
    assert SweepPoint(0.5, 0, "static", "minmax", "fp32").key == "r0.5-static-minmax"


def test_tiny_sweep_and_every_pareto_recipe_reproduces(tmp_path):
    cfg = SweepConfig(rank_ratios=(1.0, 0.5), distill_steps=(0, 3), int8_modes=("none", "dynamic"), calib_methods=("minmax",), precisions=("fp32",), **TINY)
    result = run_sweep(cfg)
    assert [p["key"] for p in result["points"]] == ["full-fp32", "full-dynamic", "r0.5-fp32", "r0.5-dynamic", "r0.5-d3-fp32", "r0.5-d3-dynamic"]
    assert result["pareto"] and set(result["pareto"]) <= {p["key"] for p in result["points"]}
    full = result["points"][0]
    assert full["accuracy"]["rel_l2"] < 1e-5 and full["params"] > result["points"][2]["params"]
    files = write_sweep(result, tmp_path / "out")
    assert set(files) == {"sweep.json", "pareto.md", "pareto.png"}
    md = files["pareto.md"].read_text()
    rows = pareto_rows(result)
    assert all(f"`{r[-1]}`" in md for r in rows)

    runner = CliRunner()
    by_key = {p["key"]: p for p in result["points"]}
    for row in rows[:2]:  # two recipes re-run here; the slow test below re-runs every row of a real sweep
        argv = shlex.split(row[-1])
        assert argv[:2] == ["attn-export", "sweep"]
        res = runner.invoke(_app(), argv[1:] + ["--json", "--out", str(tmp_path / row[0])])
        assert res.exit_code == 0, res.output
        again = json.loads(res.stdout)
        [point] = again["points"]
        assert point["key"] == row[0]
        for metric, value in by_key[row[0]]["accuracy"].items():
            assert point["accuracy"][metric] == pytest.approx(value, rel=1e-6, abs=1e-6), (row[0], metric)


@pytest.mark.slow
def test_quick_sweep_on_the_default_layer_reproduces_every_row(tmp_path):
    cfg = SweepConfig.quick(threads=2)
    result = run_sweep(cfg)
    by_key = {p["key"]: p for p in result["points"]}
    runner = CliRunner()
    for row in pareto_rows(result):
        res = runner.invoke(_app(), shlex.split(row[-1])[1:] + ["--json", "--out", str(tmp_path / row[0])])
        assert res.exit_code == 0, res.output
        [point] = json.loads(res.stdout)["points"]
        for metric, value in by_key[row[0]]["accuracy"].items():
            assert point["accuracy"][metric] == pytest.approx(value, rel=1e-6, abs=1e-6), (row[0], metric)
