"""Compression variants of the default layer vs eager fp32, side by side in one process.

    python bench/compress.py [--quick] [--json PATH] [--batch 8] [--seq-len 128] [--threads 2]

The same variants as ``attn-export bench`` (they are the pipeline's own stages, built through
the compression registry), at one shape: eager fp32, ONNX Runtime fp32, int8 static (Q/DQ)
and dynamic, low-rank (activation-aware SVD at 50% of q,k,v,o,ffn) and low-rank + int8, plus
the peers torchao int8 (eager) and ``torch.compile``. All are timed round-robin on the same
(B, L) input with the same thread count; accuracy is against eager fp32 on the report split
(never used to fit or decide). Ratio = eager p50 / variant p50 (> 1 = faster than eager).

First, the shipped file as a user loads it: ``attn-export --quantize int8``'s ``model.int8.onnx``
in a plain ONNX Runtime session (threads and nothing else) against the plain recipe a user
would pick instead (``torch.onnx.export`` + ``quantize_dynamic(per_channel=True)``, also in a
plain session), with the project's own session beside; three repeats of 20 calls, round-robin,
wall and CPU time, and the ratio to the peer in the worst repeat. ``--plain-only`` stops there.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any


def plain_session_comparison(threads: int, batch: int, seq_len: int, repeats: int, say: Any) -> dict[str, Any]:
    """The shipped ``model.int8.onnx`` of ``attn-export --quantize int8`` against the plain recipe a user would pick,
    both in the session a user opens (threads and nothing else), side by side in one process.

    The peer: ``torch.onnx.export`` of the same seeded default layer (the exporter's defaults) and
    ``onnxruntime.quantization.quantize_dynamic(per_channel=True)``. The project's own session (SkipLayerNormFusion
    off, denormals flushed) is timed beside, to show what the shipped file needs and does not need.
    """
    import tempfile

    import numpy as np
    import onnxruntime as ort
    import torch
    from onnxruntime.quantization import QuantType, quantize_dynamic

    from attn_export.config.run import RunConfig
    from attn_export.pipeline.runner import run
    from attn_export.runtime.ort import OrtRunner, SessionFromOnnx
    from attn_export.subjects import make_subject
    from attn_export.validate.latency import time_runners

    with tempfile.TemporaryDirectory(prefix="attn-plain-") as tmp:
        out = Path(tmp) / "run"
        cfg = RunConfig(quantize="int8", threads=threads, batch=batch, seq_len=seq_len, out=out, render=False, repeats=3)
        say("running attn-export --quantize int8 (the shipped model.int8.onnx)")
        result = run(cfg, progress=say)
        shipped = result.report.selection["int8"]["stage"]
        subject = make_subject(cfg)
        layer = subject.module.eval()
        feed = subject.latency_feed()
        peer_fp32, peer_int8 = Path(tmp) / "peer.onnx", Path(tmp) / "peer.int8.onnx"
        say("peer: torch.onnx.export + quantize_dynamic(per_channel=True)")
        with torch.no_grad():
            torch.onnx.export(layer, tuple(torch.from_numpy(feed[n]) for n in subject.input_names), str(peer_fp32), dynamo=True,
                              input_names=list(subject.input_names), output_names=["y"],
                              dynamic_shapes=tuple({0: torch.export.Dim("batch"), 1: torch.export.Dim("seq")} for _ in subject.input_names))  # fmt: skip
        quantize_dynamic(str(peer_fp32), str(peer_int8), per_channel=True, weight_type=QuantType.QInt8)

        def plain(path: Path, name: str) -> OrtRunner:  # what a user opens: threads, nothing else (spinning off, side by side)
            return OrtRunner(SessionFromOnnx(path, intra_op_threads=threads, disabled_optimizers=(), flush_denormals=False, allow_spinning=False), name=name)

        runners = {
            f"ours: model.int8.onnx ({shipped}), plain session": plain(out / "model.int8.onnx", "ours-plain"),
            "ours: model.int8.onnx, the project's session": OrtRunner(SessionFromOnnx(out / "model.int8.onnx", intra_op_threads=threads), name="ours-project"),
            "peer: torch.onnx.export + quantize_dynamic per-channel, plain session": plain(peer_int8, "peer-plain"),
        }
        fused = {}
        for label, path in ((f"ours ({shipped})", out / "model.int8.onnx"), ("peer", peer_int8)):
            so = ort.SessionOptions()
            so.optimized_model_filepath = str(Path(tmp) / f"{label[:4]}.opt.onnx")
            ort.InferenceSession(str(path), so, providers=["CPUExecutionProvider"])
            import onnx

            ops = [n.op_type for n in onnx.load(so.optimized_model_filepath).graph.node]
            fused[label] = {op: ops.count(op) for op in ("SkipLayerNormalization", "DynamicQuantizeMatMul", "MatMulIntegerToFloat", "FusedMatMul")}
        wall: dict[str, list[float]] = {}
        cpu: dict[str, list[float]] = {}
        say(f"timing the three side by side, {repeats} repeats of 20 calls")
        time_runners(runners, [feed] * 20, warmup=1, repeats=repeats, rounds_ms=wall, rounds_cpu_ms=cpu)
        for r in runners.values():
            r.deactivate()
    peer = next(n for n in runners if n.startswith("peer"))
    rows = []
    for name in runners:
        w, c = np.array(wall[name]), np.array(cpu[name])
        rows.append({"variant": name, "wall_ms": w.tolist(), "cpu_ms": c.tolist(),
                     "x_peer_wall_worst": float((np.array(wall[peer]) / w).min()), "x_peer_cpu_worst": float((np.array(cpu[peer]) / c).min())})  # fmt: skip
    return {"rows": rows, "fusions_in_a_plain_session": fused, "shape": [batch, seq_len], "threads": threads}


def format_plain(result: dict[str, Any]) -> str:
    lines = ["| variant | wall ms per call (3 repeats) | CPU ms | x peer, wall (worst repeat) | x peer, CPU (worst) |", "|---|---|---|---|---|"]
    for r in result["rows"]:
        lines.append(f"| {r['variant']} | {' / '.join(f'{x:.2f}' for x in r['wall_ms'])} | {' / '.join(f'{x:.2f}' for x in r['cpu_ms'])} | "
                     f"{r['x_peer_wall_worst']:.2f}x | {r['x_peer_cpu_worst']:.2f}x |")  # fmt: skip
    lines.append(f"fusions in a plain session: {result['fusions_in_a_plain_session']}")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    from attn_export.campaigns.bench import BenchConfig, results_table, run_bench, variants_table
    from attn_export.campaigns.bench.variants import VARIANTS
    from attn_export.cli._common import out_console

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="no torch.compile and no torchao")
    ap.add_argument("--json", type=Path, default=None)
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--seq-len", type=int, default=128)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--repeats", type=int, default=30)
    ap.add_argument("--plain-only", action="store_true", help="only the plain-session comparison with the quantize_dynamic peer")
    args = ap.parse_args(argv)
    say = lambda msg: print(f"- {msg}", file=sys.stderr)  # noqa: E731
    plain = plain_session_comparison(args.threads, args.batch, args.seq_len, 3, say)
    print(format_plain(plain))
    if args.plain_only:
        if args.json:
            args.json.write_text(json.dumps({"plain_session": plain}, indent=2) + "\n", encoding="utf-8")
        return 0
    skipped = {"ort-fp32-onnx-attention", "ort-fp32-ort-contrib"} | ({"compile-fp32", "eager-int8-torchao"} if args.quick else set())
    variants = tuple(v for v in VARIANTS if v not in skipped)
    cfg = BenchConfig(seqs=(args.seq_len,), batches=(args.batch,), variants=variants, threads=args.threads, min_repeats=args.repeats,
                      max_repeats=args.repeats, ceiling_size=1024, ceiling_budget_s=0.3)  # fmt: skip
    result = run_bench(cfg, progress=lambda msg, done, total: print(f"- {msg}", file=sys.stderr))
    out_console.print(results_table(result))
    out_console.print(variants_table(result))
    if args.json:
        args.json.write_text(json.dumps({**result, "plain_session": plain}, indent=2) + "\n", encoding="utf-8")
    return 0


if __name__ == "__main__":
    sys.exit(main())
