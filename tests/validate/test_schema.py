"""The JSON schemas: unknown keys tolerated, known keys strictly typed, errors on one line."""

from __future__ import annotations

import copy
import json

import pytest

from attn_export.errors import CheckpointError, DataError
from attn_export.validate import Accuracy, Latency, Report, Stage
from attn_export.validate.schema import BenchSchema, read_json, validate, validate_report


def _report() -> dict:
    r = Report(model={"layer": "mha", "d_model": 64, "heads": 4}, inputs={"batch": 2, "seq_len": 16, "seed": 0},
               environment={"cpu": {"isa_class": "x86-avx2", "u8s8_saturates": True, "flags": ["avx2"]}})  # fmt: skip
    r.add(Stage("onnx-fp32", "model.onnx", "fp32", Accuracy(1e-6, 1e-7, 1e-7, 1.0, 140.0),
                {"artifact": Latency(1.0, 1.1, 1.2, 1.0, 5, 2000.0)}, 2.0, 1000, 10, True, {"max_abs": 1e-4}))  # fmt: skip
    return json.loads(json.dumps(r.to_dict()))


def test_a_written_report_validates_and_unknown_keys_are_ignored():
    rep = _report()
    validate_report(rep)
    rep["future_section"] = {"anything": [1, 2]}
    rep["stages"][0]["new_field"] = "x"
    rep["stages"][0]["accuracy"]["new_metric"] = "not a number, but not ours either"
    rep["environment"]["cpu"]["new_flag"] = 3
    parsed = validate_report(rep)
    assert parsed.stages[0].accuracy.cosine == 1.0 and parsed.environment.cpu.isa_class == "x86-avx2"


def test_nan_is_readable_but_not_gateable():
    rep = _report()
    rep["stages"][0]["accuracy"] = {k: float("nan") for k in ("max_abs", "mean_abs", "rel_l2", "cosine")} | {
        "sqnr_db": -300.0
    }
    validate_report(rep)  # a stage whose output went NaN is reported (and rendered)
    with pytest.raises(DataError, match=r"stages\[onnx-fp32\]\.accuracy\.max_abs: expected a finite number"):
        validate_report(rep, finite=True)


@pytest.mark.parametrize(
    ("mutate", "expected"),
    [
        (
            lambda r: r.update(schema_version=2),
            r"report: schema_version: expected 1 or older, got 2; .*upgrade attn-export",
        ),
        (lambda r: r.update(schema_version="1"), r"report: schema_version: expected an integer, got \"1\""),
        (
            lambda r: r["stages"].append(copy.deepcopy(r["stages"][0])),
            r"report: stages: expected unique stage names, got 'onnx-fp32' twice",
        ),
        (
            lambda r: r["environment"]["cpu"].update(isa_class="X86 AVX2"),
            r"environment\.cpu\.isa_class: expected a name matching",
        ),
        (
            lambda r: r["environment"]["cpu"].update(u8s8_saturates="yes"),
            r"environment\.cpu\.u8s8_saturates: expected true or false",
        ),
        (lambda r: r["environment"]["cpu"].update(flags="avx2"), r"environment\.cpu\.flags: expected a list"),
        (lambda r: r["model"].update(d_model=True), r"model\.d_model: expected an integer, got true"),
        (lambda r: r["model"].update(d_model=10**9), r"model\.d_model: expected a value <= 65536"),
        (lambda r: r["inputs"].update(seed=-1), r"inputs\.seed: expected a value >= 0, got -1"),
        (
            lambda r: r["stages"][0].update(size_bytes=1.5),
            r"stages\[onnx-fp32\]\.size_bytes: expected an integer, got 1\.5",
        ),
        (
            lambda r: r["stages"][0]["latency_ms"]["artifact"].update(p50=float("inf")),
            r"latency_ms\.artifact\.p50: expected a finite number",
        ),
        (lambda r: r["stages"][0].update(speedup_vs_eager=-2.0), r"speedup_vs_eager: expected a value >= 0"),
        (lambda r: r["stages"][0].update(passed="yes"), r"stages\[onnx-fp32\]\.passed: expected true or false"),
        (lambda r: r["stages"][0].update(name=""), r"stages\[0\]\.name: expected at least 1 character"),
        (lambda r: r.update(notes="one note"), r"notes: expected a list, got \"one note\""),
        (
            lambda r: r["stages"][0]["accuracy"].update(cosine="line1\nline2"),
            r"accuracy\.cosine: expected a number, got \"line1\\nline2\"",
        ),
    ],
)
def test_known_keys_are_strictly_typed_one_line(mutate, expected):
    rep = _report()
    mutate(rep)
    with pytest.raises(DataError, match=expected) as info:
        validate_report(rep, "report")
    assert "\n" not in str(info.value)


def test_read_json_failures_are_one_line(tmp_path):
    fix = "run attn-export first"
    with pytest.raises(DataError, match="got a directory; run attn-export first"):
        read_json(tmp_path, "a report", fix)
    deep = tmp_path / "deep.json"
    deep.write_text("[" * 100_000 + "]" * 100_000)
    with pytest.raises(DataError, match="nested too deeply"):
        read_json(deep, "a report", fix)
    bad = tmp_path / "bad.json"
    bad.write_text('{"a": 1,}')
    with pytest.raises(CheckpointError, match=r"got invalid JSON \(.* at line 1\)"):
        read_json(bad, "a config", fix, error=CheckpointError)


def test_bench_schema():
    ok = {
        "results": [{"variant": "eager", "batch": 1, "seq": 128, "latency_ms": {"p50": 1.0}, "peak_mem_bytes": 10}],
        "skipped": [],
    }
    validate(BenchSchema, ok, "bench.json", "fix")
    with pytest.raises(DataError, match=r"bench\.json: results\[0\]\.seq: expected a value >= 1, got 0"):
        validate(BenchSchema, {"results": [dict(ok["results"][0], seq=0)]}, "bench.json", "fix")
