"""Report plots: no legend over a bar or marker, no overlapping labels, no label crossing its plot's frame.

Measured with matplotlib's own renderer (``Text.get_window_extent``) on the figures the plot
functions build, for the reports that broke them (issue 23) and for crowded ones.
"""

from __future__ import annotations

import numpy as np
import pytest
from test_headline import checkpoint_report, layer_int8_report

from attn_export.validate import Accuracy, Latency, Report, Stage, plots
from attn_export.validate.error_histogram import error_histogram
from attn_export.validate.plot_layout import layout_problems, place_labels


@pytest.fixture
def problems(monkeypatch):
    """Every figure a plot function saves -> its layout problems (recorded before the figure is closed)."""
    found: dict[str, list[str]] = {}
    save = plots._save

    def checked(fig, path):
        found[str(path)] = layout_problems(fig)
        return save(fig, path)

    monkeypatch.setattr(plots, "_save", checked)
    return found


def crowded_report() -> dict:
    """Eight stages with long names, two pairs at nearly the same latency and accuracy, one slower than eager."""
    rng = np.random.default_rng(0)
    ref = rng.standard_normal(2048)
    r = Report(model={"layer": "transformer", "d_model": 64, "heads": 4}, inputs={"batch": 8, "seq_len": 128})
    eager = Latency(100.0, 110.0, 120.0)
    for name, sqnr, p50 in (("onnx-fp32", 137.0, 50.0), ("onnx-fp16", 70.0, 45.0), ("lowrank-fp32", 30.0, 40.0), ("lowrank-distill-fp32", 31.0, 40.5),
                            ("int8-static", 38.7, 20.0), ("int8-dynamic", 40.0, 19.8), ("lowrank-int8-static", 25.0, 15.0),
                            ("int8-torchao", 39.0, 130.0)):  # fmt: skip
        out = ref + 10 ** (-sqnr / 20) * rng.standard_normal(ref.size)
        r.add(Stage(name, f"{name}.onnx", "int8" if "int8" in name else "fp32", Accuracy(0.01, 0.001, 0.01, 0.999, sqnr),
                    {"artifact": Latency(p50, p50 * 1.3, p50 * 1.4), "eager": eager}, 100.0 / p50, passed=True,
                    details={"error_histogram": error_histogram(ref, out)}))  # fmt: skip
    return r.to_dict()


@pytest.mark.parametrize("make", [lambda: layer_int8_report().to_dict(), lambda: checkpoint_report().to_dict(), crowded_report],
                         ids=["layer-int8", "checkpoint", "crowded"])  # fmt: skip
def test_report_plots_have_a_clean_layout(make, tmp_path, problems):
    report = make()
    for draw in (plots.plot_latency, plots.plot_pareto, plots.plot_error_histograms, plots.plot_sensitivity):
        draw(report, tmp_path / f"{draw.__name__}.png")
    assert problems and all(not p for p in problems.values()), {k: v for k, v in problems.items() if v}


def test_the_layout_check_finds_what_issue_23_saw():
    """A legend on a bar, two labels on each other, a label past the frame: each is reported (the check can fail)."""
    fig = plots._figure(figsize=(4, 3))  # on an Agg canvas of its own, as the report's plots; no backend switch
    ax = fig.subplots()
    ax.bar([0, 1], [10, 10], label="eager")
    ax.legend(loc="upper left")
    ax.annotate("int8-static", (0.5, 5), xytext=(0, 0), textcoords="offset points")
    ax.annotate("int8-dynamic", (0.5, 5), xytext=(2, 2), textcoords="offset points")
    ax.annotate("eager", (1.4, 9.9), xytext=(4, 4), textcoords="offset points")
    found = " | ".join(layout_problems(fig))
    assert "covers a bar" in found and "'int8-static' and 'int8-dynamic' overlap" in found and "'eager' crosses the frame" in found, found


def test_labels_are_placed_clear_of_each_other_and_inside_the_frame():
    fig = plots._figure(figsize=(5, 4))  # on an Agg canvas of its own, as the report's plots; no backend switch
    ax = fig.subplots()
    xy = np.array([[0.2, 40.0], [0.201, 40.2], [0.2, 39.8], [1.0, 160.0], [0.05, 20.0]])  # three points on top of each other, two at the edges
    ax.scatter(xy[:, 0], xy[:, 1])
    ax.margins(0.18)
    place_labels(ax, xy, ["int8-dynamic", "int8-static", "lowrank-int8", "eager", "fastest"], [True, False, False, True, False])
    found = layout_problems(fig)
    assert found == []


def _sensitivity_report(stages: int = 2) -> dict:
    """Static int8 stages with long group names; one stage's sensitivities all within one decade (crowded log ticks)."""
    r = checkpoint_report().to_dict()
    r["model"]["subject"] = "encoder"
    for i, s in enumerate(r["stages"][:stages]):
        gemms = [{"gemm": f"g{j}", "group": f"encoder.layers.{j // 4}.{('qkv', 'attn_out', 'mlp.w_in', 'mlp.w_out')[j % 4]}",
                  "precision": "fp32" if j == 0 else "int8", "sensitivity": (2.11 + 0.001 * j) * 1e-5 if i else 10 ** (-12 + j / 3), "rank": j}
                 for j in range(8)]  # fmt: skip
        s["details"]["mixed_precision"] = {"gemms": gemms, "float_precision": "fp32", "mode": "auto"}
    return r


def test_sensitivity_panels_keep_their_labels_apart(tmp_path, problems):
    """Issue 33: the right panel's group names ran over the left panel, and a stage whose values sit in one decade got
    overlapping minor-tick labels; each panel now has whole decades and room for its own names."""
    assert plots.plot_sensitivity(_sensitivity_report(), tmp_path / "sensitivity.png") is not None
    assert list(problems.values()) == [[]], problems


def test_the_layout_check_finds_tick_labels_running_into_the_next_plot():
    fig = plots._figure(figsize=(6, 2))  # the old sensitivity layout: two panels side by side, no room for long names
    for ax in fig.subplots(1, 2):
        ax.barh([0, 1], [1, 2])
        ax.set_yticks([0, 1], ["encoder.layers.1.mlp.w_out.something", "encoder.layers.0.attn_out.something"])
        ax.set_title("panel")
    assert any("tick labels of 'panel' run into the plot 'panel'" in p for p in layout_problems(fig)), layout_problems(fig)


def test_attention_maps_have_a_colour_scale_per_kind_and_a_clean_layout(tmp_path, problems, monkeypatch):
    rng = np.random.default_rng(0)
    eager = rng.random((1, 3, 10, 10))
    eager /= eager.sum(-1, keepdims=True)
    saved = {}
    save = plots._save

    def keep(fig, path):
        saved["fig"] = fig
        return save(fig, path)

    monkeypatch.setattr(plots, "_save", keep)
    plots.plot_attention_maps(eager, eager + 1e-4 * rng.random(eager.shape), tmp_path / "maps.png", label="int8")
    labels = sorted(filter(None, (ax.get_xlabel() for ax in saved["fig"].axes)))  # the maps have none: the colour bars' labels
    assert labels == ["attention probability", "|eager - exported|"], labels
    assert list(problems.values()) == [[]], problems
