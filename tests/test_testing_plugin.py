"""attn_export.testing: the fixture passes an exact export and catches a perturbed one, saying where."""

from __future__ import annotations

import onnx_ir as ir
import pytest
from fixtures import feed_for, small_layer

from attn_export.errors import ToleranceError
from attn_export.export import ExportSpec, export_onnx
from attn_export.testing import assert_matches_eager, compare_to_eager

pytest_plugins = ["pytester"]


def _perturb(src, dst, delta: float = 0.05) -> str:
    """Add ``delta`` to one input row of the largest weight (a column would cancel after LayerNorm)."""
    model = ir.load(src)
    name, init = max(model.graph.initializers.items(), key=lambda kv: kv[1].const_value.size)
    arr = init.const_value.numpy().copy()
    arr[3] += delta
    init.const_value = ir.tensor(arr, name=name)
    ir.save(model, dst)
    return name


@pytest.fixture(scope="module")
def exported(tmp_path_factory):
    d = tmp_path_factory.mktemp("plugin")
    layer = small_layer("transformer", "padding")
    good = d / "good.onnx"
    export_onnx(layer, good, ExportSpec())
    bad = d / "bad.onnx"
    _perturb(good, bad)
    return layer, good, bad


def test_exact_export_passes(exported):
    layer, good, _ = exported
    feed = feed_for(layer, 2, 8)
    res = assert_matches_eager(layer, good, feed)
    assert res and res["y"].accuracy.max_abs < 1e-4
    assert compare_to_eager(layer, good, (feed["x"], feed["key_padding_mask"]))  # tuple in graph input order


def test_perturbed_export_is_caught_with_location(exported):
    layer, _, bad = exported
    feed = feed_for(layer, 2, 8)
    with pytest.raises(ToleranceError) as err:
        assert_matches_eager(layer, bad, feed, tol=1e-4)
    msg = str(err.value)
    assert "bad.onnx does not match eager" in msg and "y: FAIL" in msg
    assert "worst at [" in msg and "ref=" in msg and "got=" in msg and "elements off by > 0.0001" in msg
    assert "\n" not in msg


def test_wrong_inputs_are_config_errors(exported):
    from attn_export.errors import ConfigError

    layer, good, _ = exported
    feed = feed_for(layer, 2, 8)
    with pytest.raises(ConfigError, match="key_padding_mask"):
        assert_matches_eager(layer, good, {"x": feed["x"]})
    with pytest.raises(ConfigError, match="pass a dict"):
        assert_matches_eager(layer, good, (feed["x"],))


def test_fixture_in_a_user_project(exported, pytester):
    _, good, bad = exported
    pytester.makeconftest('pytest_plugins = ["attn_export.testing"]\n')
    pytester.makepyfile(
        test_user=f"""
import numpy as np
from attn_export.layers import MaskedLayer, build_layer

layer = MaskedLayer(build_layer("transformer", 64, 4, mask="padding"), "padding")
feed = {{"x": np.random.default_rng(0).standard_normal((2, 8, 64)).astype(np.float32),
        "key_padding_mask": np.ones((2, 8), np.int32)}}

def test_good(attn_export_compare):
    attn_export_compare(layer, {str(good)!r}, feed)

def test_bad(attn_export_compare):
    attn_export_compare(layer, {str(bad)!r}, feed, tol=1e-4)
"""
    )
    result = pytester.runpytest("-p", "no:cacheprovider")
    result.assert_outcomes(passed=1, failed=1)
    result.stdout.fnmatch_lines(["*test_bad*", "*does not match eager*worst at*ref=*got=*"])


def test_a_failure_is_one_message_without_third_party_debug_logs(exported, pytester):
    """issue 23: the message twice ("During handling of the above exception") and pages of DEBUG lines from the exporter.

    The user's project logs at DEBUG and exports inside the test; the failure shows the message
    once, no torch/onnxscript/onnx_ir DEBUG record, and every logger level is back afterwards.
    """
    _, good, _ = exported
    pytester.makeconftest('pytest_plugins = ["attn_export.testing"]\n')
    pytester.makeini("[pytest]\nlog_level = DEBUG\n")
    pytester.makepyfile(
        test_user="""
import logging
import numpy as np
import torch
from attn_export.export import ExportSpec, export_onnx
from attn_export.layers import MaskedLayer, build_layer

NAMES = ("torch.__trace", "torch.onnx", "onnxscript", "onnx_ir", "torch.onnx._internal.exporter._registration")

def test_export_then_compare(attn_export_compare, tmp_path):
    before = {n: logging.getLogger(n).level for n in NAMES}
    layer = MaskedLayer(build_layer("transformer", 64, 4, mask="padding"), "padding")
    export_onnx(layer, tmp_path / "m.onnx", ExportSpec())
    assert {n: logging.getLogger(n).level for n in NAMES} == before, "the export left another library's log level changed"
    with torch.no_grad():
        layer.layer.ffn_out.weight[0] += 0.1  # the eager model drifts from its export
    feed = {"x": np.random.default_rng(0).standard_normal((2, 8, 64)).astype(np.float32), "key_padding_mask": np.ones((2, 8), np.int32)}
    try:
        attn_export_compare(layer, tmp_path / "m.onnx", feed, tol=1e-4)
    finally:
        assert {n: logging.getLogger(n).level for n in NAMES} == before
"""
    )
    result = pytester.runpytest_subprocess("-p", "no:cacheprovider")
    result.assert_outcomes(failed=1)
    out = result.stdout.str()
    failures = out[out.index("= FAILURES =") : out.index("short test summary info")]
    assert failures.count("does not match eager") == 1, failures
    assert "During handling of the above exception" not in out and "Traceback" not in failures
    noisy = [ln for ln in out.splitlines() if ln.startswith("DEBUG") and any(f" {m}" in ln for m in ("torch", "onnxscript", "onnx_ir", "onnx"))]
    assert not noisy, f"{len(noisy)} third-party DEBUG lines, e.g. {noisy[:3]}"
    assert "the export left" not in out
