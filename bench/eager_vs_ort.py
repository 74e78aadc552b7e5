"""Eager PyTorch fp32 vs ONNX Runtime fp32 for the default layer, side by side in one process.

    python bench/eager_vs_ort.py [--batch 8] [--seq-len 128] [--repeats 30] [--threads N]

Runs every variant round-robin on the same inputs with the same thread count and prints
each variant's median/p90 latency and its ratio to eager (ratio > 1 = faster than eager).
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
from pathlib import Path

import numpy as np


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--seq-len", type=int, default=128)
    ap.add_argument("--d-model", type=int, default=512)
    ap.add_argument("--heads", type=int, default=8)
    ap.add_argument("--repeats", type=int, default=30)
    ap.add_argument("--warmup", type=int, default=5)
    ap.add_argument("--threads", type=int, default=os.cpu_count() or 1)
    ap.add_argument("--forms", default="decomposed,ort-contrib,onnx-attention")
    args = ap.parse_args(argv)
    from attn_export.host.process import ProcessSettings, process_settings

    with process_settings(ProcessSettings(threads=args.threads)):  # OpenMP passive, denormals flushed, like the CLI
        return _run(args)


def _run(args: argparse.Namespace) -> int:
    from attn_export.export import ExportSpec, export_onnx
    from attn_export.layers import MaskedLayer, build_layer
    from attn_export.runtime import EagerRunner, OrtRunner, SessionFromOnnx
    from attn_export.subjects.layer import random_feeds
    from attn_export.validate import accuracy, time_runners

    layer = MaskedLayer(build_layer("transformer", args.d_model, args.heads, mask="padding"), "padding")
    feed = random_feeds("padding", args.batch, args.seq_len, args.d_model, seed=1, count=1)[0]
    runners = {"eager-fp32": EagerRunner(layer, layer.input_names, ["y"])}
    with tempfile.TemporaryDirectory() as tmp:
        for form in args.forms.split(","):
            path = Path(tmp) / f"{form}.onnx"
            export_onnx(layer, path, ExportSpec(attention=form))
            runners[f"ort-fp32-{form}"] = OrtRunner(SessionFromOnnx(path, intra_op_threads=args.threads))
        ref = runners["eager-fp32"].infer(feed)["y"]
        errs = {n: accuracy(ref, r.infer(feed)["y"]).max_abs for n, r in runners.items()}
        lat = time_runners(runners, feed, warmup=args.warmup, repeats=args.repeats, batch=args.batch)
    base = lat["eager-fp32"].p50
    print(f"transformer d_model={args.d_model} heads={args.heads} B={args.batch} L={args.seq_len} threads={args.threads} repeats={args.repeats}")
    print(f"{'variant':<28}{'p50 ms':>10}{'p90 ms':>10}{'ratio vs eager':>16}{'max abs err':>14}")
    for name, t in lat.items():
        print(f"{name:<28}{t.p50:>10.2f}{t.p90:>10.2f}{base / t.p50:>15.2f}x{errs[name]:>14.2e}")
    return 0 if all(np.isfinite(list(errs.values()))) else 1


if __name__ == "__main__":
    sys.exit(main())
