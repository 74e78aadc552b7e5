"""A pytest plugin for user projects: assert that an exported model still matches eager.

Enable it in your project's ``conftest.py``::

    pytest_plugins = ["attn_export.testing"]

then use the ``attn_export_compare`` fixture, or call ``assert_matches_eager`` directly
(it needs no pytest)::

    def test_export(attn_export_compare, tmp_path):
        attn_export_compare(model, "model.onnx", {"x": x}, tol=1e-4)

On failure the error says, per output, which metric broke, the index of the worst element
with the reference and the exported value there, and how many elements are off, so a
broken head or a bad mask shows up as a pattern rather than as one number. It says it once:
the fixture fails the test with that one message (no chained traceback), and the comparison
keeps torch's and onnxscript's own DEBUG logs out of the failure (``attn_export.host.quiet``;
their levels are restored afterwards).
"""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any

import numpy as np

from attn_export.host.quiet import EXPORT_NOISE, quieted
from attn_export.errors import ConfigError, ToleranceError
from attn_export.validate.tolerances import TOLERANCES, Tolerance
from attn_export.vocab.precisions import PRECISIONS

if TYPE_CHECKING:  # torch and onnxruntime load only when a comparison runs: the plugin stays cheap to enable
    from torch import nn

    from attn_export.validate.compare import ComparisonResult

__all__ = ["assert_engine_attested", "assert_matches_eager", "attn_export_compare", "compare_to_eager"]


def _tolerance(tol: Tolerance | float | None, precision: str) -> Tolerance:
    if tol is None:
        return TOLERANCES[PRECISIONS[precision].tolerance_key if precision in PRECISIONS else "fp32"].tensor
    if isinstance(tol, Tolerance):
        return tol
    if isinstance(tol, (int, float)):
        return Tolerance(max_abs=float(tol))
    raise ConfigError(f"expected tol as a Tolerance, a float (max_abs) or None, got {type(tol).__name__}")


def _precision_of(session: Any) -> str:
    meta = session.get_modelmeta().custom_metadata_map
    return meta.get("attn_export.precision", "fp32")


def _feed(inputs: Mapping[str, np.ndarray] | Sequence[np.ndarray] | np.ndarray, names: list[str]) -> dict[str, np.ndarray]:
    if isinstance(inputs, np.ndarray):
        inputs = (inputs,)
    if isinstance(inputs, Mapping):
        missing = [n for n in names if n not in inputs]
        if missing:
            raise ConfigError(f"expected inputs {names}, got {list(inputs)}; add {missing}")
        return {n: np.asarray(inputs[n]) for n in names}
    arrays = list(inputs)
    if len(arrays) != len(names):
        raise ConfigError(f"expected {len(names)} input arrays in the order {names}, got {len(arrays)}; pass a dict")
    return {n: np.asarray(a) for n, a in zip(names, arrays)}


def _elements_off(ref: np.ndarray, got: np.ndarray, tol: Tolerance) -> str:
    if tol.max_abs is None or ref.shape != got.shape:
        return ""
    off = int(np.count_nonzero(~(np.abs(ref.astype(np.float64) - got.astype(np.float64)) <= tol.max_abs)))
    return f" [{off}/{ref.size} elements off by > {tol.max_abs:.3g}]"


def _run(
    model: nn.Module,
    onnx_path: str | os.PathLike[str],
    inputs: Mapping[str, np.ndarray] | Sequence[np.ndarray] | np.ndarray,
    tol: Tolerance | float | None,
    providers: Sequence[str],
) -> tuple[ComparisonResult, dict[str, np.ndarray], dict[str, np.ndarray], Tolerance]:
    from attn_export.runtime.eager import EagerRunner
    from attn_export.runtime.ort import OrtRunner, SessionFromOnnx
    from attn_export.validate.compare import compare_outputs

    with quieted(EXPORT_NOISE):
        with OrtRunner(SessionFromOnnx(onnx_path, providers=list(providers))) as ort_runner:
            names = ort_runner.input_names
            feed = _feed(inputs, names)
            tolerance = _tolerance(tol, _precision_of(ort_runner.session))
            got = ort_runner.infer(feed)
            out_names = ort_runner.output_names
        with EagerRunner(model, names, out_names) as eager_runner:
            ref = eager_runner.infer(feed)
    return compare_outputs(ref, got, tolerance), ref, got, tolerance


def compare_to_eager(
    model: nn.Module,
    onnx_path: str | os.PathLike[str],
    inputs: Mapping[str, np.ndarray] | Sequence[np.ndarray] | np.ndarray,
    tol: Tolerance | float | None = None,
    providers: Sequence[str] = ("cpu",),
) -> ComparisonResult:
    """Run ``model`` (eager fp32) and the ONNX model on the same inputs and compare every output.

    Inputs are matched to the ONNX graph's input names (a tuple is taken in graph order) and
    passed to ``model`` positionally in that order. ``tol=None`` uses the default tolerance
    for the precision recorded in the model's metadata (fp32 when there is none).
    """
    return _run(model, onnx_path, inputs, tol, providers)[0]


def assert_matches_eager(
    model: nn.Module,
    onnx_path: str | os.PathLike[str],
    inputs: Mapping[str, np.ndarray] | Sequence[np.ndarray] | np.ndarray,
    tol: Tolerance | float | None = None,
    providers: Sequence[str] = ("cpu",),
) -> ComparisonResult:
    """``compare_to_eager`` that raises ``ToleranceError`` (an AssertionError) naming where outputs differ."""
    __tracebackhide__ = True  # pytest shows the caller's line and this message, not the plugin's frames
    result, ref, got, tolerance = _run(model, onnx_path, inputs, tol, providers)
    if not result:
        failed = [f"{o}{_elements_off(ref[o.name], got[o.name], tolerance)}" for o in result.outputs if not o]
        raise ToleranceError(f"{os.fspath(onnx_path)} does not match eager: " + "; ".join(failed))
    return result


def assert_engine_attested(report: str | os.PathLike[str] | Mapping[str, Any], precision: str | None = None, fused_attention: bool = False) -> None:
    """Raise ``ToleranceError`` (an AssertionError) unless the run's built engine runs every GEMM group planned in
    ``precision`` in it and (``fused_attention``) one fused attention kernel per block: the pytest face of
    ``attn-export check REPORT --expect-precision P --expect-fused-attention``. ``report``: report.json or its dict."""
    __tracebackhide__ = True
    from attn_export.validate.gate.attestation import attestation_checks
    from attn_export.validate.report import load_report

    if precision is not None and precision not in PRECISIONS:
        raise ConfigError(f"expected precision as one of {', '.join(PRECISIONS)} or None, got {precision!r}")
    data = report if isinstance(report, Mapping) else load_report(report)
    failed = [f"{c.stage} {c.metric}: {c.message}" for c in attestation_checks(data, precision, fused_attention) if not c.ok]
    if failed:
        raise ToleranceError("the engine is not what was planned: " + "; ".join(failed))


try:  # the fixture exists only where pytest does; assert_matches_eager works without it
    import pytest
except ImportError:  # pragma: no cover - pytest is a test dependency
    pytest = None  # type: ignore[assignment]

if pytest is not None:

    @pytest.fixture
    def attn_export_compare() -> Callable[..., ComparisonResult]:
        """``attn_export_compare(model, onnx_path, inputs, tol=None, providers=("cpu",))``: fails the test on mismatch."""

        def compare(
            model: nn.Module,
            onnx_path: str | os.PathLike[str],
            inputs: Mapping[str, np.ndarray] | Sequence[np.ndarray] | np.ndarray,
            tol: Tolerance | float | None = None,
            providers: Sequence[str] = ("cpu",),
        ) -> ComparisonResult:
            __tracebackhide__ = True
            try:
                return assert_matches_eager(model, onnx_path, inputs, tol, providers)
            except ToleranceError as err:
                message = str(err)
            pytest.fail(message, pytrace=False)  # outside the except: one message, no "During handling of the above exception"

        return compare
