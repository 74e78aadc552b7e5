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
