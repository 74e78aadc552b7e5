"""Compression variants of the default layer vs eager fp32, side by side in one process.

    python bench/compress.py [--quick] [--json PATH] [--batch 8] [--seq-len 128] [--threads 2]

The same variants as ``attn-export bench`` (they are the pipeline's own stages, built through
the compression registry), at one shape: eager fp32, ONNX Runtime fp32, int8 static (Q/DQ)
and dynamic, low-rank (activation-aware SVD at 50% of q,k,v,o,ffn) and low-rank + int8, plus
the peers torchao int8 (eager) and ``torch.compile``. All are timed round-robin on the same
(B, L) input with the same thread count; accuracy is against eager fp32 on the report split
(never used to fit or decide). Ratio = eager p50 / variant p50 (> 1 = faster than eager).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path


def main(argv: list[str] | None = None) -> int:
    from attn_export.benchmark import BenchConfig, results_table, run_bench, variants_table
    from attn_export.benchmark.variants import VARIANTS
    from attn_export.cli._common import out_console

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="no torch.compile and no torchao")
    ap.add_argument("--json", type=Path, default=None)
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--seq-len", type=int, default=128)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--repeats", type=int, default=30)
    args = ap.parse_args(argv)
    skipped = {"ort-fp32-onnx-attention", "ort-fp32-ort-contrib"} | ({"compile-fp32", "eager-int8-torchao"} if args.quick else set())
    variants = tuple(v for v in VARIANTS if v not in skipped)
    cfg = BenchConfig(seqs=(args.seq_len,), batches=(args.batch,), variants=variants, threads=args.threads, min_repeats=args.repeats,
                      max_repeats=args.repeats, ceiling_size=1024, ceiling_budget_s=0.3)  # fmt: skip
    result = run_bench(cfg, progress=lambda msg, done, total: print(f"- {msg}", file=sys.stderr))
    out_console.print(results_table(result))
    out_console.print(variants_table(result))
    if args.json:
        args.json.write_text(json.dumps(result, indent=2) + "\n", encoding="utf-8")
    return 0


if __name__ == "__main__":
    sys.exit(main())
