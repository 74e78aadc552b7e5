"""Finite but extreme calibration data: refused with the reason, never an internal error (compress/calib/bounds.py)."""

from __future__ import annotations

import numpy as np
import pytest
from onnx import TensorProto, helper

from attn_export.compress.calib.bounds import check_data_scale, check_threshold
from attn_export.compress.calib.choice import choose_ranges
from attn_export.compress.probe import RunningHistogram, TensorStats, collect_stats
from attn_export.errors import DataError


def test_a_token_whose_sum_of_squares_overflows_float32_is_refused_with_its_scale():
    x = np.full((2, 3, 32), 1e30, np.float32)
    with pytest.raises(DataError, match=r"calib_x reaches \|x\| = 1e\+30; the sum of squares of a token's 32 features is 3.2e\+61"):
        check_data_scale("c.npz", "calib_x", x)
    with pytest.raises(DataError, match="beyond float32"):
        check_data_scale("c.npz", "x", np.full((1, 1, 4), 1e200, np.float64))  # its square is inf even in float64
    check_data_scale("c.npz", "calib_x", np.full((2, 3, 32), 1e17, np.float32))  # 3.2e35: the layer computes it


@pytest.mark.parametrize("bad", [np.inf, -np.inf, np.nan])
def test_the_histogram_refuses_non_finite_values_instead_of_looping(bad: float):
    h = RunningHistogram()
    h.add(np.ones(8, np.float32))
    with pytest.raises(DataError, match="NaN/Inf"):
        h.add(np.array([1.0, bad], np.float32))
    assert h.total == 8  # nothing half-added


def test_an_activation_the_data_overflows_inside_the_graph_is_named(tmp_path):
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, ["B", 4])
    graph = helper.make_graph([helper.make_node("Mul", ["x", "x"], ["sq"]), helper.make_node("Mul", ["sq", "sq"], ["y"])], "sq", [x],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["B", 4])])  # fmt: skip
    path = tmp_path / "sq.onnx"
    import onnx

    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)], ir_version=10), path)
    feeds = [{"x": np.full((2, 4), 1e20, np.float32)}]  # finite, and x*x is 1e40: inf in float32
    with pytest.raises(DataError, match=r"drives activation 'sq' to NaN/Inf in float32 \(8 values\) \(the calibration inputs reach \|x\| = 1e\+20\)"):
        collect_stats(path, ["sq"], feeds)
    assert collect_stats(path, ["sq"], [{"x": np.full((2, 4), 1e10, np.float32)}])["sq"].hist.absmax == pytest.approx(1e20, rel=1e-6)


def _stats(absmax: float) -> dict[str, TensorStats]:
    s = TensorStats("a")
    s.hist.add(np.linspace(0, absmax, 1000, dtype=np.float32))
    return {"a": s}


@pytest.mark.parametrize("method", ["minmax", "percentile", "entropy", "per-tensor"])
def test_a_range_whose_int8_scale_overflows_float32_is_refused_for_every_method(method: str):
    with pytest.raises(DataError, match=r"int8 range of activation 'a' is \+-3(\.\d+)?e\+38: its scale \(2T / 254\) overflows float32"):
        choose_ranges(_stats(3.0e38), method, percentile=99.9 if method != "percentile" else 100.0)
    assert choose_ranges(_stats(1e30), method)["a"].threshold <= 1e30 * 1.001  # large, finite, representable: handled


def test_fp16_float_parts_bound_the_range_by_fp16s_largest_value():
    with pytest.raises(DataError, match="beyond fp16's largest value 65504: TensorRT's INT8\\+FP16 build"):
        choose_ranges(_stats(1e5), "minmax", float_precision="fp16")
    assert choose_ranges(_stats(1e5), "minmax")["a"].threshold == pytest.approx(1e5, rel=1e-6)  # fp32 float parts hold it
    check_threshold("a", 6e4, "fp16")
