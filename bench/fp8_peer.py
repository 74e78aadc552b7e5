"""FP8 and int8 for TensorRT on all-MiniLM-L6-v2: our routes and NVIDIA Model Optimizer's ONNX PTQ, side by side.

    /work/venvs/modelopt/bin/python bench/fp8_peer.py [--json PATH] [--threads 2] [--max-texts 320] [--no-modelopt]

One fp32 export (the int8 routes' source graph for ``--target tensorrt``: decomposed
attention, opset 23), one set of calibration texts (the corpus' train split, batches of 8
padded to one length), one judge: sentence embeddings of the report split (the test texts)
against eager fp32, the Q/DQ run as written on ONNX Runtime CPU (``session.disable_quant_qdq``,
TensorRT's arithmetic). Rows:

* ours: the plan of ``--quantize auto --target tensorrt --gpu-arch sm90`` (``Fp8Static`` with
  the automatic float fallback, and static int8: searched SmoothQuant, percentile, auto
  fallback), and ``Fp8Static`` without the fallback and with the attention BMMs in FP8;
* peer: ``modelopt.onnx.quantization.quantize`` in ``fp8`` and ``int8`` mode, ``max`` and
  ``entropy`` calibration, ``calibration_eps=["cpu"]``, ``high_precision_dtype="fp32"`` so the
  float parts stay fp32 as in ours (its default, fp16, is the ``fp8, fp16 graph`` row).

ModelOpt needs its ``[onnx]`` dependencies (onnx-graphsurgeon, polygraphy, onnxconverter-common,
onnxslim, ml_dtypes, lief, cppimport); without them the peer rows are skipped with the
import error. Run from the venv that has them and with this checkout first on PYTHONPATH.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
import traceback
from pathlib import Path
from typing import Any

import numpy as np


def _modelopt(fp32: Path, out: Path, mode: str, method: str, feeds: list[dict[str, np.ndarray]], high_precision: str) -> Path:
    """ModelOpt's ONNX PTQ on the same calibration feeds (concatenated; one calibration step = one feed's shape)."""
    from modelopt.onnx.quantization import quantize

    data = {name: np.concatenate([f[name] for f in feeds]) for name in feeds[0]}
    shapes = ",".join(f"{name}:{'x'.join(str(d) for d in feeds[0][name].shape)}" for name in feeds[0])
    quantize(onnx_path=str(fp32), quantize_mode=mode, calibration_data=data, calibration_shapes=shapes, calibration_method=method,
             calibration_eps=["cpu"], high_precision_dtype=high_precision, output_path=str(out), log_level="WARNING")  # fmt: skip
    return out


def _qdq_types(path: Path) -> dict[str, int]:
    import onnx

    proto = onnx.load(str(path), load_external_data=False)
    zp = {t.name: onnx.TensorProto.DataType.Name(t.data_type) for t in proto.graph.initializer}
    out: dict[str, int] = {}
    for n in proto.graph.node:
        if n.op_type == "QuantizeLinear":
            key = zp.get(n.input[2], "?") if len(n.input) > 2 else "UINT8 (no zero point)"
            out[key] = out.get(key, 0) + 1
    return out


def run(args: argparse.Namespace) -> dict[str, Any]:
    from dataclasses import replace

    from attn_export.compress.registry import BuildContext, Source, apply
    from attn_export.config.run import RunConfig
    from attn_export.pipeline.plan import make_plan
    from attn_export.host.process import ProcessSettings, process_settings
    from attn_export.pipeline.runner import RunSettings, build_plans
    from attn_export.subjects import make_subject

    rows: list[dict[str, Any]] = []
    with process_settings(ProcessSettings(threads=args.threads)), tempfile.TemporaryDirectory(prefix="attn-fp8-peer-") as tmp:
        work = Path(tmp)
        # the plan `attn-export --checkpoint minilm --quantize auto --target tensorrt --gpu-arch sm90` builds: fp8 and int8 static
        cfg = RunConfig(checkpoint="minilm", quantize="auto", target="tensorrt", gpu_arch="sm90", threads=args.threads, out=work,
                        render=False, max_texts=args.max_texts)  # fmt: skip
        subject = make_subject(cfg)
        plan = make_plan(cfg)
        say = lambda m: print(f"- {m}", file=sys.stderr)  # noqa: E731
        t0 = time.perf_counter()
        built, _ = build_plans([plan], subject, RunSettings(threads=args.threads, say=say))
        planned = built[0]
        assert isinstance(planned, dict), planned
        fp32 = planned["onnx-fp32"]
        fp8_planned = plan.step("fp8-static").config
        artifacts = {"fp32": fp32, "ours: fp8 (plan, auto fallback)": planned["fp8-static"], "ours: int8-static (plan)": planned["int8-static"]}
        ctx = BuildContext(subject, work, cfg.target_info, plan.fp32_spec, args.threads, say)
        extra = {"ours: fp8, no fallback": replace(fp8_planned, fallback="none"),
                 "ours: fp8 + attention BMMs": replace(fp8_planned, fallback="none", quantize_attention_bmm=True)}  # fmt: skip
        for i, (name, config) in enumerate(extra.items()):
            artifacts[name] = apply(Source(fp32, name, work / f"extra{i}.onnx", ctx), config)
        print(f"- built ours in {time.perf_counter() - t0:.0f} s", file=sys.stderr)
        fp32_spec = plan.fp32_spec
        fp32_path = fp32.path
        peers: list[tuple[str, str, str, str]] = [("fp8", "max", "fp32", "peer: ModelOpt fp8, max"), ("fp8", "entropy", "fp32", "peer: ModelOpt fp8, entropy"),
                                                   ("int8", "max", "fp32", "peer: ModelOpt int8, max"), ("int8", "entropy", "fp32", "peer: ModelOpt int8, entropy"),
                                                   ("fp8", "max", "fp16", "peer: ModelOpt fp8, max, fp16 graph")]  # fmt: skip
        skipped: dict[str, str] = {}
        if not args.no_modelopt:
            feeds = subject.calibration()
            for mode, method, hp, name in peers:
                try:
                    t = time.perf_counter()
                    path = _modelopt(fp32_path, work / f"modelopt_{mode}_{method}_{hp}.onnx", mode, method, feeds, hp)
                    print(f"- {name}: {time.perf_counter() - t:.0f} s", file=sys.stderr)
                    artifacts[name] = ctx.onnx_artifact(name, path, mode, "int8", qdq_reference=True)
                except Exception as err:  # the peer's own failure is a result, reported with its message
                    skipped[name] = f"{type(err).__name__}: {str(err).splitlines()[0] if str(err) else ''}"
                    traceback.print_exc(file=sys.stderr)
        for name, art in artifacts.items():
            runner = art.make_runner()
            try:
                j = subject.judge(runner, "report", art.tolerance_key)
            finally:
                runner.deactivate()
            emb = j.details["embedding"]
            row = {"variant": name, "mean_cos": emb["mean_cosine"], "min_cos": emb["min_cosine"], "top1": emb["top1_neighbor_agreement"],
                   "mb": (art.size_bytes or 0) / 1e6, "qdq": _qdq_types(art.path) if art.path else {}}  # fmt: skip
            mp = art.details.get("mixed_precision")
            if mp:
                row["float_groups"] = mp["float_groups"]
                row["gemms_in_float"] = f"{mp['gemms_in_float']}/{mp['gemms_total']}"
            rows.append(row)
        info = subject.inputs_info()
    return {"rows": rows, "skipped": skipped, "data": info, "versions": _versions(), "fp32_export": {"attention": fp32_spec.attention, "opset": fp32_spec.resolved_opset}}


def _versions() -> dict[str, str]:
    from importlib.metadata import PackageNotFoundError, version

    out = {}
    for pkg in ("onnx", "onnxruntime", "onnx-ir", "nvidia-modelopt", "onnx-graphsurgeon", "polygraphy", "torch", "numpy"):
        try:
            out[pkg] = version(pkg)
        except PackageNotFoundError:
            out[pkg] = "not installed"
    return out


def format_table(result: dict[str, Any]) -> str:
    lines = ["| variant | mean cos | min cos | top-1 | MB | Q types | GEMMs float |", "|---|---|---|---|---|---|---|"]
    for r in result["rows"]:
        q = ", ".join(f"{k} x{v}" for k, v in r["qdq"].items()) or "-"
        lines.append(f"| {r['variant']} | {r['mean_cos']:.5f} | {r['min_cos']:.5f} | {r['top1']:.3f} | {r['mb']:.1f} | {q} | {r.get('gemms_in_float', '')} |")
    for name, why in result["skipped"].items():
        lines.append(f"| {name} | not run: {why} | | | | | |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--json", type=Path)
    ap.add_argument("--threads", type=int, default=min(2, os.cpu_count() or 1))
    ap.add_argument("--max-texts", type=int, default=None, help="texts per corpus split (default: the checkpoint default, 320)")
    ap.add_argument("--no-modelopt", action="store_true", help="skip the peer rows")
    args = ap.parse_args(argv)
    result = run(args)
    print(format_table(result))
    if args.json:
        args.json.write_text(json.dumps(result, indent=1, default=str) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
