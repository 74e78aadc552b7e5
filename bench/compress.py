"""Compression variants of the default layer vs eager fp32, side by side in one process.

    python bench/compress.py [--quick] [--json PATH] [--batch 8] [--seq-len 128] [--threads 2]

Variants: eager fp32, ONNX Runtime fp32, int8 static (Q/DQ), int8 dynamic, torchao int8
(dynamic and weight-only, eager), low-rank (activation-aware SVD, 50% of q,k,v,o; eager and
ORT) and low-rank + int8 (dynamic and static). All are timed round-robin on the same
(B, L) input with the same thread count for PyTorch and ONNX Runtime; accuracy is measured
against eager fp32 on the validation split (calibration uses the calibration split only).
Ratio = eager p50 / variant p50 (> 1 = faster than eager). ``cpu ms`` is the process CPU
time per call, which other processes on a shared machine do not inflate (at --threads 1 it
is the work itself; above that it includes the runtimes' spin-waiting).

Two ONNX Runtime CPU settings matter for this layer (both on by default, see --help):
* ORT's SkipLayerNormalization fusion (Add + LayerNorm) runs ~10x slower than the two ops
  it replaces on this CPU, so it is disabled (--ort-disable SkipLayerNormFusion);
* the masked softmax underflows exp() into denormals, which makes ORT's Softmax ~8x slower;
  denormals are flushed to zero in ORT's pool threads (session.set_denormal_as_zero) and
  in the calling thread (torch.set_flush_denormal, which also covers eager PyTorch).
ORT's pool threads do not spin between runs (--no-ort-spinning, the default here): spinning
threads would slow down whichever variant runs next in the round.
"""

from __future__ import annotations

import os

# Spinning OpenMP threads make eager latency swing 10x on a shared machine; set before torch loads.
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

import argparse
import copy
import io
import json
import logging
import platform
import sys
import tempfile
from pathlib import Path
from typing import Any

import numpy as np
import torch

from attn_export.compress.calib_data import (
    ActivationSet,
    default_calibration_path,
    load_calibration,
    synthesize_hidden_states,
)
from attn_export.compress.lowrank import LowRankConfig, low_rank_
from attn_export.compress.quant_layer import quantize_dynamic_layer
from attn_export.compress.quant_static import StaticQuantSpec, quantize_static_onnx
from attn_export.errors import DataError
from attn_export.export import export_onnx
from attn_export.layers import MaskedLayer, build_layer
from attn_export.runtime import EagerRunner, OrtRunner, Runner, SessionFromOnnx
from attn_export.validate import (
    accuracy,
    atomic_write_text,
    set_threads,
)
from attn_export.validate.latency import time_runners_with_cpu


def _progress(msg: str) -> None:
    print(f"[compress-bench] {msg}", file=sys.stderr, flush=True)


def _calibration(d_model: int, path: str | None) -> tuple[ActivationSet, ActivationSet, str]:
    try:
        data = load_calibration(path or default_calibration_path(d_model), d_model=d_model)
        return data.calib, data.val, data.source
    except DataError as err:
        if path:
            raise
        _progress(f"no shipped calibration set ({err}); synthesizing one")
        x, kpm = synthesize_hidden_states(40, 64, d_model, np.random.default_rng(0))
        return ActivationSet(x[:32], kpm[:32]), ActivationSet(x[32:], kpm[32:]), "synthesized (seed 0)"


def _state_bytes(module: torch.nn.Module) -> int:
    buf = io.BytesIO()
    torch.save(module.state_dict(), buf)  # torchao's int8 tensors serialize at their int8 size
    return buf.getbuffer().nbytes


def _feed(acts: ActivationSet) -> dict[str, np.ndarray]:
    kpm = acts.key_padding_mask if acts.key_padding_mask is not None else np.ones(acts.x.shape[:2], np.int32)
    return {"x": acts.x, "key_padding_mask": kpm}


def build_variants(args: argparse.Namespace, tmp: Path) -> tuple[dict[str, Runner], dict[str, int], ActivationSet, str]:
    """name -> runner and name -> size in bytes, plus the validation split and its source."""
    layer = MaskedLayer(build_layer("transformer", args.d_model, args.heads, mask="padding"), "padding")
    calib, val, source = _calibration(args.d_model, args.calib)
    names = layer.input_names
    disabled = [o for o in args.ort_disable.split(",") if o]

    def ort(path: str) -> OrtRunner:
        session = SessionFromOnnx(
            path, intra_op_threads=args.threads, graph_optimization=args.graph_optimization,
            disabled_optimizers=tuple(disabled), flush_denormals=args.flush_denormals, allow_spinning=args.ort_spinning,
        )  # fmt: skip
        return OrtRunner(session)

    runners: dict[str, Runner] = {"eager fp32": EagerRunner(layer, names)}
    sizes = {"eager fp32": _state_bytes(layer)}

    _progress("exporting fp32 ONNX")
    fp32 = export_onnx(layer, tmp / "fp32.onnx").path
    runners["ORT fp32"], sizes["ORT fp32"] = ort(fp32), os.path.getsize(fp32)
    _progress("int8 static (minmax, per-channel Q/DQ)")
    static = quantize_static_onnx(fp32, tmp / "static.onnx", calib, StaticQuantSpec(method=args.calib_method))
    runners["int8 static (ORT)"], sizes["int8 static (ORT)"] = ort(static.path), static.size_bytes
    _progress("int8 dynamic")
    dynamic = quantize_dynamic_layer(layer, tmp / "dynamic.onnx")  # as the pipeline ships it
    runners["int8 dynamic (ORT)"], sizes["int8 dynamic (ORT)"] = ort(dynamic.path), dynamic.size_bytes

    if args.no_torchao and args.no_low_rank:
        return runners, sizes, val, source
    try:
        if args.no_torchao:
            raise ImportError("--no-torchao")
        from attn_export.compress.quant_eager import EAGER_INT8_MODES, quantize_eager_

        for mode in EAGER_INT8_MODES:
            _progress(f"torchao {mode}")
            q = quantize_eager_(layer, mode)
            runners[f"torchao {mode}"], sizes[f"torchao {mode}"] = EagerRunner(q, names), _state_bytes(q)
    except ImportError as err:  # MissingDependencyError is an ImportError
        _progress(f"skipping torchao: {err}")

    if args.no_low_rank:
        return runners, sizes, val, source
    _progress("low-rank 50% of q,k,v,o (activation-aware SVD)")
    low = copy.deepcopy(layer)
    summary = low_rank_(low, LowRankConfig(rank_ratio=0.5, targets=("q", "k", "v", "o"), method="activation"), calib)
    _progress(summary.describe())
    runners["low-rank eager"], sizes["low-rank eager"] = EagerRunner(low, names), _state_bytes(low)
    low_fp32 = export_onnx(low, tmp / "lowrank.onnx").path
    runners["low-rank ORT fp32"], sizes["low-rank ORT fp32"] = ort(low_fp32), os.path.getsize(low_fp32)
    low_dyn = quantize_dynamic_layer(low, tmp / "lowrank_dynamic.onnx")
    runners["low-rank + int8 dynamic"], sizes["low-rank + int8 dynamic"] = ort(low_dyn.path), low_dyn.size_bytes
    low_st = quantize_static_onnx(low_fp32, tmp / "lowrank_static.onnx", calib, StaticQuantSpec(method=args.calib_method))
    runners["low-rank + int8 static"], sizes["low-rank + int8 static"] = ort(low_st.path), low_st.size_bytes
    return runners, sizes, val, source


def _denormals_flushed() -> bool:
    return float(torch.tensor([1e-40], dtype=torch.float32) * 1.0) == 0.0


def run(args: argparse.Namespace) -> dict[str, Any]:
    set_threads(args.threads)
    with tempfile.TemporaryDirectory(prefix="attn_export_bench_") as tmp_name:
        runners, sizes, val, source = build_variants(args, Path(tmp_name))
        for r in runners.values():
            r.activate()
        if args.flush_denormals:
            # After every session exists: creating ONNX Runtime's environment resets the calling
            # thread's FTZ/DAZ flags, and this thread runs eager and part of every ORT kernel.
            torch.set_flush_denormal(True)
        _progress(f"accuracy on the validation split ({len(val)} sequences)")
        val_feed = _feed(val)
        ref = runners["eager fp32"].infer(val_feed)["y"]
        accs = {name: accuracy(ref, r.infer(val_feed)["y"]) for name, r in runners.items()}
        x, kpm = synthesize_hidden_states(args.batch, args.seq_len, args.d_model, np.random.default_rng(1))
        _progress(f"timing {len(runners)} variants round-robin at B={args.batch}, L={args.seq_len}, {args.threads} threads")
        load_before = os.getloadavg()[0]
        timing = time_runners_with_cpu(runners, {"x": x, "key_padding_mask": kpm}, args.warmup, args.repeats, args.batch)
        load_after = os.getloadavg()[0]
        flushed = _denormals_flushed()
    lat = {n: t["latency"] for n, t in timing.items()}
    base, base_cpu = lat["eager fp32"].p50, timing["eager fp32"]["cpu_ms_p50"]
    rows = [
        {
            "variant": name,
            "latency_ms_p50": lat[name].p50,
            "latency_ms_p90": lat[name].p90,
            "speedup_vs_eager": base / lat[name].p50,
            "cpu_ms_p50": timing[name]["cpu_ms_p50"],
            "cpu_speedup_vs_eager": base_cpu / timing[name]["cpu_ms_p50"],
            "cosine": accs[name].cosine,
            "rel_l2": accs[name].rel_l2,
            "sqnr_db": accs[name].sqnr_db,
            "size_bytes": sizes[name],
        }
        for name in runners
    ]
    return {
        "config": {k: v for k, v in vars(args).items() if k != "json"},
        "calibration": source,
        "environment": {
            "python": platform.python_version(),
            "torch": torch.__version__,
            "cpu_count": os.cpu_count(),
            "machine": platform.machine(),
            "load_avg_1min": [load_before, load_after],
            "denormals_flushed_in_calling_thread": flushed,
        },
        "rows": rows,
    }


def format_table(result: dict[str, Any]) -> str:
    c = result["config"]
    lines = [
        (
            f"transformer d_model={c['d_model']} heads={c['heads']} B={c['batch']} L={c['seq_len']} threads={c['threads']} "
        f"repeats={c['repeats']}; ORT: optimization {c['graph_optimization']}, disabled [{c['ort_disable']}], spinning {c['ort_spinning']}, "
            f"denormals flushed: {result['environment']['denormals_flushed_in_calling_thread']}; 1-min load {result['environment']['load_avg_1min'][0]:.1f}"
        ),
        f"accuracy vs eager fp32 on the validation split of {result['calibration']}",
        f"{'variant':<26}{'p50 ms':>9}{'p90 ms':>9}{'vs eager':>10}{'cpu ms':>9}{'vs eager':>10}{'cosine':>11}{'rel L2':>10}{'size bytes':>12}",
    ]
    for r in result["rows"]:
        lines.append(
            f"{r['variant']:<26}{r['latency_ms_p50']:>9.2f}{r['latency_ms_p90']:>9.2f}{r['speedup_vs_eager']:>9.2f}x"
            f"{r['cpu_ms_p50']:>9.2f}{r['cpu_speedup_vs_eager']:>9.2f}x{r['cosine']:>11.6f}{r['rel_l2']:>10.2e}{r['size_bytes']:>12d}"
        )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0], formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    ap.add_argument("--batch", type=int, default=8, help="B of the timed input")
    ap.add_argument("--seq-len", type=int, default=128, help="L of the timed input")
    ap.add_argument("--d-model", type=int, default=512, help="layer width")
    ap.add_argument("--heads", type=int, default=8, help="attention heads")
    ap.add_argument("--threads", type=int, default=min(2, os.cpu_count() or 1), help="PyTorch and ONNX Runtime intra-op threads")
    ap.add_argument("--repeats", type=int, default=20, help="timed rounds (every variant once per round)")
    ap.add_argument("--warmup", type=int, default=3, help="untimed calls per variant first")
    ap.add_argument("--calib", default=None, help="calibration .npz/.safetensors; None = the shipped set")
    ap.add_argument("--calib-method", default="minmax", choices=["minmax", "percentile", "entropy"], help="static int8 calibration")
    ap.add_argument("--graph-optimization", default="all", choices=["none", "basic", "extended", "all"], help="ORT graph optimization level")
    ap.add_argument("--ort-disable", default="SkipLayerNormFusion", help="comma-separated ORT optimizers to disable ('' = none)")
    ap.add_argument("--flush-denormals", action=argparse.BooleanOptionalAction, default=True, help="flush denormals to zero (ORT pool threads and the calling thread)")
    ap.add_argument(
        "--ort-spinning", action=argparse.BooleanOptionalAction, default=False,
        help="let ORT's pool threads spin after a run; off by default because in a round-robin they steal "
        "cores from the next variant (eager), which would flatter ONNX Runtime",
    )  # fmt: skip
    ap.add_argument("--no-torchao", action="store_true", help="leave out the torchao rows")
    ap.add_argument("--no-low-rank", action="store_true", help="leave out the low-rank rows")
    ap.add_argument("--quick", action="store_true", help="few repeats: a smoke run, not a measurement")
    ap.add_argument("--json", type=Path, default=None, help="also write the results here")
    args = ap.parse_args(argv)
    if args.quick:
        args.repeats, args.warmup = 3, 1
    logging.basicConfig(level=logging.WARNING)
    result = run(args)
    print(format_table(result))
    if args.json:
        atomic_write_text(args.json, json.dumps(result, indent=2) + "\n")
    return 0 if all(np.isfinite(r["cosine"]) for r in result["rows"]) else 1


if __name__ == "__main__":
    sys.exit(main())
