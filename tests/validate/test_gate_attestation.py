"""``check --expect-precision/--expect-fused-attention`` and the pytest plugin's ``assert_engine_attested``.

The report's engine stage carries the attestation of a recorded inspector JSON
(tests/fixtures/trt/inspector): all int8, one GEMM silently FP32, attention unfused.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from attn_export.cli.app import _register, app, main
from attn_export.errors import ConfigError, ToleranceError
from attn_export.runtime.tensorrt.attest import EngineExpectation, attest_engine
from attn_export.testing import assert_engine_attested
from attn_export.validate.gate.attestation import attestation_checks
from attn_export.validate.report import Accuracy, Report, Stage

INSPECTOR = Path(__file__).resolve().parents[1] / "fixtures" / "trt" / "inspector"
EXPECT = EngineExpectation.from_dict(json.loads((INSPECTOR / "expectation.json").read_text()))


def _report(fixture: str | None, allowed: bool = False) -> dict:
    r = Report(model={"layer": "transformer", "d_model": 64, "heads": 4})
    r.add(Stage("onnx-int8", None, "int8", Accuracy(0.05, 0.01, 0.03, 0.9995, 30.5), passed=True))
    if fixture is not None:
        att = attest_engine(json.loads((INSPECTOR / fixture).read_text()), EXPECT)
        if allowed:
            att.allowed_by = "--accept-engine-mismatch"
        r.add(Stage("trt-int8", None, "int8", Accuracy(0.05, 0.01, 0.03, 0.9995, 30.5), passed=True, details={"attestation": att.to_dict()}))
    return json.loads(json.dumps(r.to_dict()))


def test_the_checks_pass_the_planned_engine_and_name_what_moved() -> None:
    assert all(attestation_checks(_report("all_int8.json"), "int8", True))
    fp32 = attestation_checks(_report("one_gemm_fp32.json"), "int8", True)
    assert [(c.metric, c.ok, c.value, c.limit) for c in fp32] == [("gemm_groups_int8", False, 7.0, 8.0), ("fused_attention", True, 2.0, 2.0)]
    assert fp32[0].message == "layers.1.ffn2 runs fp32"
    unfused = attestation_checks(_report("attention_unfused.json"), "int8", True)
    assert [c.ok for c in unfused] == [True, False] and "standalone softmax layer '__myl_AddMaxSubExpSumDiv_myl0_3'" in unfused[1].message
    fp16 = attestation_checks(_report("all_int8.json"), "fp16", False)
    assert not fp16[0] and "no GEMM group of the engine was planned in fp16 (planned: int8)" in fp16[0].message


def test_a_run_that_accepted_the_mismatch_still_fails_an_explicit_expectation() -> None:
    assert not all(attestation_checks(_report("one_gemm_fp32.json", allowed=True), "int8", False))


def test_a_report_without_an_engine_fails_the_expectation() -> None:
    (check,) = attestation_checks(_report(None), "int8", True)
    assert not check and "no engine attestation" in check.message


def _invoke(tmp_path: Path, fixture: str | None, *args: str):  # type: ignore[no-untyped-def]
    _register()
    path = tmp_path / "report.json"
    path.write_text(json.dumps(_report(fixture)))
    return CliRunner().invoke(app, ["check", str(path), *args])


@pytest.mark.parametrize(("fixture", "code", "says"), [
    ("all_int8.json", 0, "PASS (2 engine attestation checks)"),
    ("one_gemm_fp32.json", 1, "trt-int8 gemm_groups_int8: FAIL (layers.1.ffn2 runs fp32)"),
    ("attention_unfused.json", 1, "trt-int8 fused_attention: FAIL (0 fused attention kernel(s) for 2 block(s)"),
])  # fmt: skip
def test_check_command_exit_codes(tmp_path: Path, fixture: str, code: int, says: str) -> None:
    res = _invoke(tmp_path, fixture, "--expect-precision", "int8", "--expect-fused-attention")
    assert res.exit_code == code, res.output
    assert says in res.output


def test_check_command_refuses_bad_values_with_exit_2(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "report.json"
    path.write_text(json.dumps(_report("all_int8.json")))
    assert main(["check", str(path), "--expect-precision", "int4"]) == 2
    assert "--expect-precision expected one of fp32, fp16, bf16, int8, fp8, got 'int4'" in capsys.readouterr().err
    assert main(["check", str(path)]) == 2
    assert "check needs --baseline FILE, --expect-precision/--expect-fused-attention" in capsys.readouterr().err


def test_the_plugin_asserts_the_same(tmp_path: Path) -> None:
    assert_engine_attested(_report("all_int8.json"), "int8", fused_attention=True)
    path = tmp_path / "report.json"
    path.write_text(json.dumps(_report("one_gemm_fp32.json")))
    with pytest.raises(ToleranceError, match="trt-int8 gemm_groups_int8: layers.1.ffn2 runs fp32"):
        assert_engine_attested(path, "int8")
    with pytest.raises(ConfigError, match="got 'int4'"):
        assert_engine_attested(path, "int4")


def test_the_report_shows_what_the_engine_runs() -> None:
    from attn_export.validate.render import _html, _markdown

    report = _report("one_gemm_fp32.json")
    text = _markdown(report, {})
    assert "## What the engine runs (attested)" in text
    assert "| trt-int8 | layers.1.ffn2 | int8 | fp32 | 1 | WIDER |" in text and "| trt-int8 | layers.0.qkv | int8 | int8 | 1 | ok |" in text
    assert "7/8 GEMM groups as planned; attention fused 2/2 (expected fused); layers: 9 fp16, 7 int8, 1 int32, 1 fp32" in text
    assert 'id="attestation"' in _html(report, {})


def test_with_a_baseline_the_expectations_join_the_gate(tmp_path: Path) -> None:
    from attn_export.validate.gate.check import make_baseline

    baseline = tmp_path / "baseline.json"
    baseline.write_text(json.dumps(make_baseline(_report("all_int8.json"))))
    ok = _invoke(tmp_path, "all_int8.json", "--baseline", str(baseline), "--expect-precision", "int8", "--expect-fused-attention")
    assert ok.exit_code == 0, ok.output
    assert "gemm_groups_int8" in ok.output and "fused_attention" in ok.output
    bad = _invoke(tmp_path, "one_gemm_fp32.json", "--baseline", str(baseline), "--expect-precision", "int8")
    assert bad.exit_code == 1 and "REGRESSION: layers.1.ffn2 runs fp32" in bad.output, bad.output
