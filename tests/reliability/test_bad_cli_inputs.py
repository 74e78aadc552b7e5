"""Bad input on every command's command line: one line ``attn-export: error: ...``, exit 2, nothing
written, and no work done first (each case must answer within seconds).

Each case builds its inputs in a fresh folder, runs ``attn_export.cli.main`` in-process, and
checks the refusal with ``assert_refused``: exit code, exactly one stderr line with the prefix,
no traceback or colour codes, the expected words, and no new file or folder anywhere under
the case's folder (the default ``--out`` included, since the case runs from there).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import pytest
import rel_inputs as mk
from rel_helpers import TINY, assert_refused, good_report, run_cli, write_json

TRT_OWNER = "owned by the TensorRT work (export/trt_compat.py, runtime/trt_sidecar.py); see docs/reliability.md"


@dataclass(frozen=True)
class Case:
    id: str
    argv: Callable[[Path], list[object]]  # the folder holds the inputs; outputs go under it too
    expect: str | None = None
    code: int = 2
    xfail: str | None = None


def _ckpt(config: object = None, **kw: object) -> Callable[[Path], list[object]]:
    return lambda t: ["--checkpoint", mk.checkpoint(t / "ckpt", config, **kw), "--out", t / "out"]  # type: ignore[arg-type]


def _report_with(mutate: Callable[[dict], None]) -> Callable[[Path], Path]:
    def build(t: Path) -> Path:
        r = good_report()
        mutate(r)
        return write_json(t / "report.json", r)

    return build


def _baseline(t: Path) -> Path:
    from attn_export.validate.gate.check import make_baseline

    return write_json(t / "baseline.json", make_baseline(good_report()))


def _check(report: Callable[[Path], Path], baseline: Callable[[Path], Path] = _baseline, *extra: object) -> Callable[[Path], list[object]]:
    return lambda t: ["check", report(t), "--baseline", baseline(t), *extra]


def _set(path: str, value: object) -> Callable[[dict], None]:
    """Set ``a.b.0.c`` in a JSON object (ints index lists)."""

    def mutate(d: dict) -> None:
        keys = [int(k) if k.isdigit() else k for k in path.split(".")]
        node = d
        for k in keys[:-1]:
            node = node[k]
        node[keys[-1]] = value

    return mutate


def _baseline_with(mutate: Callable[[dict], None]) -> Callable[[Path], Path]:
    def build(t: Path) -> Path:
        from attn_export.validate.gate.check import make_baseline

        b = make_baseline(good_report())
        mutate(b)
        return write_json(t / "baseline.json", b)

    return build


_CLS = "classes.x86-avx2.stages.onnx-fp32.metrics.cosine"
_ONNX = mk.onnx_valid

CASES: list[Case] = [
    # -- 3: the CI gate cannot be fooled --------------------------------------------------------------
    Case("c03-report-cosine-inf", _check(_report_with(_set("stages.0.accuracy.cosine", float("inf")))), "cosine"),
    Case("c03-report-rel-l2-minus-inf", _check(_report_with(_set("stages.0.accuracy.rel_l2", float("-inf")))), "rel_l2"),
    Case("c03-report-max-abs-negative", _check(_report_with(_set("stages.0.accuracy.max_abs", -1.0))), "max_abs"),
    Case("c03-report-cosine-nan", _check(_report_with(_set("stages.1.accuracy.cosine", float("nan")))), "finite"),
    Case("c03-baseline-no-stages", _check(_report_with(lambda r: None), _baseline_with(_set("classes.x86-avx2.stages", {}))), "checks nothing"),
    Case("c03-baseline-no-classes", _check(_report_with(lambda r: None), _baseline_with(_set("classes", {}))), "checks nothing"),
    Case("c03-baseline-slack-inf", _check(_report_with(lambda r: None), _baseline_with(_set(_CLS + ".abs", float("inf")))), "abs"),
    Case("c03-baseline-slack-negative", _check(_report_with(lambda r: None), _baseline_with(_set(_CLS + ".rel", -0.5))), "rel"),
    Case("c03-baseline-direction-sideways", _check(_report_with(lambda r: None), _baseline_with(_set(_CLS + ".direction", "sideways"))), "direction"),
    Case("c03-baseline-direction-inverted", _check(_report_with(lambda r: None), _baseline_with(_set(_CLS + ".direction", "lower"))), "direction"),
    Case("c03-latency-margin-nan", _check(_report_with(lambda r: None), _baseline, "--latency-margin", "nan"), "latency-margin"),
    Case("c03-prune-without-update", _check(_report_with(lambda r: None), _baseline, "--prune"), "--update-baseline"),
    Case("c03-report-sha256-malformed", _check(_report_with(_set("stages.0.details", {"sha256": "not-a-hash"})), _baseline), "sha256"),
    # -- 4: check-trt on invalid graphs and versions ---------------------------------------------------
    Case("c04-check-trt-trt-99", lambda t: ["check-trt", _ONNX(t / "m.onnx"), "--trt", "99.0"], "99"),
    Case("c04-check-trt-zero-nodes", lambda t: ["check-trt", mk.onnx_zero_nodes(t / "m.onnx")], None),
    Case("c04-check-trt-initializer-without-data", lambda t: ["check-trt", mk.onnx_initializer_without_data(t / "m.onnx")], None),
    Case("c04-check-trt-negative-dims", lambda t: ["check-trt", mk.onnx_negative_dims(t / "m.onnx")], None),
    Case("c04-check-trt-reshape-2-80", lambda t: ["check-trt", mk.onnx_reshape_2_80(t / "m.onnx")], None),
    Case("c04-check-trt-random-bytes", lambda t: ["check-trt", mk.random_bytes(t / "m.onnx")], "not a readable ONNX model"),
    Case("c04-check-trt-truncated", lambda t: ["check-trt", mk.truncated(_ONNX(t / "ok.onnx"), t / "m.onnx", 0.3)], "ONNX"),
    Case("c04-check-trt-external-data-escape", lambda t: ["check-trt", mk.onnx_external_escape(t / "a" / "b")], "ONNX"),
    Case("c04-check-trt-missing-model", lambda t: ["check-trt", t / "none.onnx"], "does not exist"),
    Case("c04-check-trt-model-is-folder", lambda t: ["check-trt", mk.make_dir(t / "dir.onnx")], "directory"),
    Case("c04-check-trt-bad-shape", lambda t: ["check-trt", _ONNX(t / "m.onnx"), "--min-shape", "axb"], "shape"),
    Case("c04-check-trt-bad-precision", lambda t: ["check-trt", _ONNX(t / "m.onnx"), "--precision", "int4"], "--precision"),
    # -- 5: checkpoint files stay inside the checkpoint folder ----------------------------------------
    Case("c05-shard-parent-escape", _ckpt(index=mk.index_for("../../outside/x.safetensors")), "inside"),
    Case("c05-shard-absolute-path", _ckpt(index=mk.index_for("/etc/passwd.safetensors")), "relative"),
    Case("c05-shard-not-safetensors", _ckpt(index=mk.index_for("weights.bin")), "safetensors"),
    Case("c05-index-empty-map", _ckpt(index={"metadata": {}, "weight_map": {}}), "weight_map"),
    Case("c05-index-not-json", _ckpt(index="{not json"), "JSON"),
    # -- 6: sizes are checked before anything is allocated ---------------------------------------------
    Case("c06-d-model-1e6", lambda t: ["--d-model", "1e6", "--out", t / "out"], "--d-model"),
    Case("c06-d-model-million", lambda t: ["--d-model", "1000000", "--heads", "8", "--out", t / "out"], "--d-model"),
    Case("c06-d-model-prime-heads-2", lambda t: ["--d-model", "999999937", "--heads", "2", "--out", t / "out"], "--d-model"),
    Case("c06-seq-len-1e7", lambda t: ["--seq-len", "10000000", "--out", t / "out"], "--seq-len"),
    Case("c06-batch-1e5", lambda t: ["--batch", "100000", "--out", t / "out"], "--batch"),
    Case("c06-seq-len-memory", lambda t: ["--seq-len", "65536", "--out", t / "out"], "memory"),
    Case("c06-batch-and-seq-memory", lambda t: ["--batch", "4096", "--seq-len", "4096", "--out", t / "out"], "memory"),
    Case("c06-d-model-16384-memory", lambda t: ["--d-model", "16384", "--heads", "16", "--max-memory", "8G", "--out", t / "out"], "--max-memory"),
    Case("c06-max-memory-too-small", lambda t: [*TINY, "--max-memory", "1M", "--out", t / "out"], "--max-memory"),
    Case("c06-max-memory-garbage", lambda t: [*TINY, "--max-memory", "lots", "--out", t / "out"], "--max-memory"),
    Case("c06-repeats-1e9", lambda t: ["--repeats", "1000000000", "--out", t / "out"], "--repeats"),
    Case("c06-warmup-1e9", lambda t: ["--warmup", "1000000000", "--out", t / "out"], "--warmup"),
    Case("c06-distill-1e9", lambda t: ["--low-rank", "0.5", "--distill", "1000000000", "--out", t / "out"], "--distill"),
    Case("c06-calib-generate-d-model-1e5", lambda t: ["calib", "generate", "--d-model", "100000", "--out", t / "c.npz"], "--d-model"),
    Case("c06-calib-generate-d-model-20000", lambda t: ["calib", "generate", "--d-model", "20000", "--out", t / "c.npz"], "--d-model"),
    Case("c06-calib-generate-file-too-big", lambda t: ["calib", "generate", "--d-model", "4096", "--n-calib", "100000", "--out", t / "c.npz"], "at most"),
    Case("c06-config-hidden-size-1e9", _ckpt({"hidden_size": 1_200_000_000}), "hidden_size"),
    Case("c06-config-vocab-1e10", _ckpt({"vocab_size": 10_000_000_000}), "vocab_size"),
    Case("c06-config-hidden-size-1.2e9-float", _ckpt({"hidden_size": 1.2e9}), "hidden_size"),
    Case("c06-config-vocab-1e10-float", _ckpt({"vocab_size": 1e10}), "vocab_size"),
    Case("c06-config-layers-1e6", _ckpt({"num_hidden_layers": 1_000_000}), "num_hidden_layers"),
    Case("c06-config-larger-than-weights", _ckpt({"hidden_size": 4096, "intermediate_size": 16384, "num_attention_heads": 16}), "weight files"),
    Case("c06-bench-seqs-1e7", lambda t: ["bench", "--seqs", "10000000", "--out", t / "b"], "--seqs"),
    Case("c06-bench-ceiling-huge", lambda t: ["bench", "--ceiling-size", "100000", "--out", t / "b"], "--ceiling-size"),
    Case("c06-sweep-batch-1e6", lambda t: ["sweep", "--quick", "--batch", "1000000", "--out", t / "s"], "--batch"),
    Case("c06-sweep-seq-len-memory", lambda t: ["sweep", "--quick", "--seq-len", "65536", "--out", t / "s"], "memory"),
    Case("c06-sweep-repeats-1e9", lambda t: ["sweep", "--quick", "--repeats", "1000000000", "--out", t / "s"], "--repeats"),
    # -- 7: what used to end in a traceback ------------------------------------------------------------
    Case("c07-out-is-a-file", lambda t: [*TINY, "--out", mk.make_file(t / "f")], "is a file"),
    Case("c07-out-under-a-file", lambda t: [*TINY, "--out", mk.make_file(t / "f") / "sub"], "is a file"),
    Case("c07-out-under-proc", lambda t: [*TINY, "--out", "/proc/attn-export-out"], "pseudo-filesystem"),
    Case("c07-bundle-is-a-file", lambda t: [*TINY, "--target", "jetson", "--bundle", mk.make_file(t / "f"), "--out", t / "out"], "--bundle"),
    Case("c07-triton-is-a-file", lambda t: [*TINY, "--triton", mk.make_file(t / "f"), "--out", t / "out"], "--triton"),
    Case("c07-triton-is-out", lambda t: [*TINY, "--triton", t / "out", "--out", t / "out"], "--triton"),
    Case("c07-timing-cache-is-a-folder", lambda t: [*TINY, "--target", "tensorrt", "--timing-cache", mk.make_dir(t / "d"), "--out", t / "out"], "--timing-cache"),
    Case("c07-check-trt-json-is-a-folder", lambda t: ["check-trt", _ONNX(t / "m.onnx"), "--json", mk.make_dir(t / "d")], "--json"),
    Case("c07-check-junit-is-a-folder", lambda t: ["check", write_json(t / "r.json", good_report()), "--baseline", _baseline(t), "--junit", mk.make_dir(t / "d")], "--junit"),
    Case("c07-check-baseline-is-a-folder", lambda t: ["check", write_json(t / "r.json", good_report()), "--baseline", mk.make_dir(t / "d"), "--update-baseline"], "--baseline"),
    Case("c07-check-baseline-under-proc", lambda t: ["check", write_json(t / "r.json", good_report()), "--baseline", "/proc/b.json", "--update-baseline"], "--baseline"),
    Case("c07-report-out-is-a-file", lambda t: ["report", write_json(t / "r.json", good_report()), "--out", mk.make_file(t / "f"), "--no-attention-maps"], "--out"),
    Case("c07-report-bench-missing", lambda t: ["report", write_json(t / "r.json", good_report()), "--bench", t / "none.json", "--no-attention-maps"], "bench.json"),
    Case("c07-bench-out-is-a-file", lambda t: ["bench", "--quick", "--out", mk.make_file(t / "f")], "is a file"),
    Case("c07-sweep-out-is-a-file", lambda t: ["sweep", "--quick", "--out", mk.make_file(t / "f")], "is a file"),
    Case("c07-calib-out-is-a-folder", lambda t: ["calib", "generate", "--d-model", "32", "--out", mk.make_dir(t / "d.npz")], "directory"),
    Case("c07-report-stages-a-string", _check(_report_with(_set("stages", "abc"))), "stages"),
    Case("c07-report-cosine-high", _check(_report_with(_set("stages.0.accuracy.cosine", "high"))), "cosine"),
    Case("c07-report-stages-null", _check(_report_with(_set("stages", None))), "stages"),
    Case("c07-report-a-list", _check(lambda t: write_json(t / "r.json", [1, 2])), "JSON object"),
    Case("c07-report-not-json", _check(lambda t: mk.random_bytes(t / "r.json"))),
    Case("c07-report-missing", lambda t: ["check", t / "none.json", "--baseline", _baseline(t)], "no such file"),
    Case("c07-baseline-value-high", _check(_report_with(lambda r: None), _baseline_with(_set(_CLS + ".value", "high"))), "value"),
    Case("c07-baseline-value-null", _check(_report_with(lambda r: None), _baseline_with(_set(_CLS + ".value", None))), "value"),
    Case("c07-baseline-stages-a-list", _check(_report_with(lambda r: None), _baseline_with(_set("classes.x86-avx2.stages", [1]))), "stages"),
    Case("c07-config-a-list", _ckpt([]), "JSON object"),
    Case("c07-config-eps-abc", _ckpt({"layer_norm_eps": "abc"}), "layer_norm_eps"),
    Case("c07-config-not-json", _ckpt("{oops"), "JSON"),
    Case("c07-seed-negative", lambda t: [*TINY, "--seed", "-1", "--out", t / "out"], "--seed"),
    Case("c07-seed-20-digits", lambda t: [*TINY, "--seed", "12345678901234567890", "--out", t / "out"], "--seed"),
    Case("c07-calib-outliers-negative", lambda t: ["calib", "generate", "--d-model", "32", "--outliers", "-3", "--out", t / "c.npz"], "--outliers"),
    Case("c07-calib-outliers-above-d-model", lambda t: ["calib", "generate", "--d-model", "32", "--outliers", "33", "--out", t / "c.npz"], "--outliers"),
    Case("c07-bench-ceiling-negative", lambda t: ["bench", "--ceiling-size", "-5", "--out", t / "b"], "--ceiling-size"),
    # -- 8: wrong results that used to be accepted silently --------------------------------------------
    Case("c08-config-heads-true", _ckpt({"num_attention_heads": True}), "num_attention_heads"),
    Case("c08-config-heads-float", _ckpt({"num_attention_heads": 2.0}), "num_attention_heads"),
    Case("c08-bench-threads-0", lambda t: ["bench", "--threads", "0", "--out", t / "b"], "--threads"),
    Case("c08-bench-heads-not-dividing", lambda t: ["bench", "--heads", "7", "--out", t / "b"], "heads"),
    Case("c08-sweep-threads-minus-1", lambda t: ["sweep", "--quick", "--threads", "-1", "--out", t / "s"], "--threads"),
    Case("c08-sweep-threads-0", lambda t: ["sweep", "--quick", "--threads", "0", "--out", t / "s"], "--threads"),
    Case("c08-sweep-low-rank-nan", lambda t: ["sweep", "--low-rank", "nan", "--out", t / "s"], "--low-rank"),
    Case("c08-main-threads-0", lambda t: [*TINY[:-2], "--threads", "0", "--out", t / "out"], "--threads"),
    Case("c08-calib-nan-values", lambda t: [*TINY, "--quantize", "int8", "--calib",
                                            mk.npz(t / "nan.npz", **{**mk.calib_arrays(), "val_x": mk.calib_arrays()["val_x"] * float("nan")}),
                                            "--out", t / "out"], "NaN"),  # fmt: skip
    Case("c08-calib-d-model-mismatch", lambda t: [*TINY, "--quantize", "int8", "--calib", mk.npz(t / "d16.npz", **mk.calib_arrays(d=16)), "--out", t / "out"], "d_model"),
    Case("c08-calib-text-for-a-layer", lambda t: [*TINY, "--quantize", "int8", "--calib", mk.make_file(t / "t.txt"), "--out", t / "out"], ".txt"),
    Case("c08-calib-check-d-model-mismatch", lambda t: ["calib", "check", mk.npz(t / "c.npz", **mk.calib_arrays()), "--d-model", "64"], "d_model"),
    # -- 9: input that used to leave a broken file behind ---------------------------------------------
    Case("c09-calib-generate-decay-nan", lambda t: ["calib", "generate", "--d-model", "32", "--decay", "nan", "--out", t / "c.npz"], "--decay"),
    Case("c09-calib-generate-decay-inf", lambda t: ["calib", "generate", "--d-model", "32", "--decay", "inf", "--out", t / "c.npz"], "--decay"),
    Case("c09-calib-generate-decay-negative", lambda t: ["calib", "generate", "--d-model", "32", "--decay", "-1", "--out", t / "c.npz"], "--decay"),
    # -- 10: validation first, one consistent message ---------------------------------------------------
    Case("c10-distill-without-low-rank", lambda t: [*TINY, "--distill", "5", "--out", t / "out"], "--low-rank"),
    Case("c10-bundle-without-jetson", lambda t: [*TINY, "--bundle", t / "b", "--out", t / "out"], "--target jetson"),
    Case("c10-dynamic-int8-for-tensorrt", lambda t: [*TINY, "--quantize", "int8", "--int8-mode", "dynamic", "--target", "tensorrt", "--out", t / "out"], "dynamic"),
    Case("c10-calib-without-compression", lambda t: [*TINY, "--calib", mk.npz(t / "c.npz", **mk.calib_arrays()), "--out", t / "out"], "--calib"),
    Case("c10-layers-for-a-layer", lambda t: [*TINY, "--layers", "2", "--out", t / "out"], "--checkpoint"),
    Case("c10-d-model-with-checkpoint", lambda t: ["--checkpoint", "minilm", "--d-model", "32", "--out", t / "out"], "--d-model"),
    Case("c10-no-calibration-set-for-width", lambda t: [*TINY, "--quantize", "int8", "--out", t / "out"], "calib generate"),
    Case("c10-heads-not-dividing", lambda t: ["--d-model", "32", "--heads", "5", "--out", t / "out"], "--heads"),
    Case("c10-low-rank-above-one", lambda t: [*TINY, "--low-rank", "1.5", "--out", t / "out"], "--low-rank"),
    Case("c10-unknown-option", lambda t: ["--frobnicate", "--out", t / "out"], "--frobnicate"),
    Case("c10-unknown-layer", lambda t: ["--layer", "rnn", "--out", t / "out"], "--layer"),
    Case("c10-encoder-with-layer-flag", lambda t: ["encoder", "--d-model", "32", "--out", t / "out"], "--d-model"),
    Case("c10-checkpoint-missing-folder", lambda t: ["--checkpoint", t / "nope", "--out", t / "out"], "checkpoint"),
    Case("c10-checkpoint-bin-only", lambda t: ["--checkpoint", _bin_only(t / "ck"), "--out", t / "out"], "pytorch_model.bin"),
    Case("c10-calib-check-missing", lambda t: ["calib", "check", t / "none.npz"], "does not exist"),
    Case("c10-calib-check-random-npz", lambda t: ["calib", "check", mk.random_bytes(t / "r.npz")], "not a .npz"),
    Case("c10-calib-check-random-npy", lambda t: ["calib", "check", mk.random_bytes(t / "r.npy")], "not a .npy"),
    Case("c10-calib-check-real-pickle", lambda t: ["calib", "check", mk.real_pickle(t / "p.npy")], "pickle"),
    Case("c10-calib-check-forged-header", lambda t: ["calib", "check", mk.forged_npy(t / "f.npy")], "declares shape"),
    Case("c10-calib-check-zip-member-garbage", lambda t: ["calib", "check", _zip_garbage(t / "z.npz")], "not a NumPy array"),
    Case("c10-calib-check-random-safetensors", lambda t: ["calib", "check", mk.random_bytes(t / "r.safetensors")], "cannot be read"),
    Case("c10-calib-check-huge-safetensors-header", lambda t: ["calib", "check", mk.huge_header_safetensors(t / "h.safetensors")], "cannot be read"),
    Case("c10-calib-check-max-bytes-0", lambda t: ["calib", "check", mk.npz(t / "c.npz", **mk.calib_arrays()), "--max-bytes", "0"], "--max-bytes"),
    Case("c10-calib-generate-bad-suffix", lambda t: ["calib", "generate", "--d-model", "32", "--out", t / "c.pkl"], ".npz"),
    Case("c10-calib-generate-exists", lambda t: ["calib", "generate", "--d-model", "32", "--out", mk.make_file(t / "c.npz")], "--overwrite"),
]


def _bin_only(folder: Path) -> Path:
    mk.checkpoint(folder, weights=False)
    (folder / "pytorch_model.bin").write_bytes(b"\x80\x04not really")
    return folder


def _zip_garbage(path: Path) -> Path:
    import zipfile

    with zipfile.ZipFile(path, "w") as z:
        z.writestr("x.npy", mk.random_bytes(path.with_suffix(".raw")).read_bytes())
    path.with_suffix(".raw").unlink()
    return path


def _params() -> list[object]:
    out = []
    for c in CASES:
        marks = [pytest.mark.xfail(strict=True, reason=c.xfail)] if c.xfail else []
        out.append(pytest.param(c, id=c.id, marks=marks))
    return out


@pytest.mark.parametrize("case", _params())
def test_bad_input_is_refused_in_one_line_before_any_work(case: Case, tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    argv = case.argv(tmp_path)
    outcome = run_cli([str(a) for a in argv], capsys, tmp_path)
    if case.id.startswith("c04-check-trt-") and case.xfail and outcome.code == 1:
        # check-trt finding errors (exit 1) would be a clean outcome too: one finding per line
        assert "Traceback" not in outcome.err
        return
    assert_refused(outcome, case.expect, case.code)


def test_every_case_id_names_one_of_the_ten_classes() -> None:
    classes = {c.id[:3] for c in CASES}
    assert classes <= {f"c{n:02d}" for n in range(1, 11)}, classes
    assert len({c.id for c in CASES}) == len(CASES), "duplicate case ids"
