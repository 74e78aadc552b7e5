"""The bench's default grid, its quick grid and its variants' names, as data: ``BenchConfig`` and ``variants`` are built
from them and ``bench --help`` shows them.

Light (no numpy, no torch), so ``attn-export bench --help`` states the real defaults without loading the harness.
"""

from __future__ import annotations

from typing import Any

__all__ = ["GRID", "OPT_IN_VARIANTS", "QUICK", "VARIANT_NAMES"]

# What a plain ``attn-export bench`` measures: every sequence length to 8192, one and eight sequences,
# and the machine's GEMM ceilings at N = 2048.
GRID: dict[str, Any] = {"seqs": (128, 512, 1024, 2048, 4096, 8192), "batches": (1, 8), "ceiling_size": 2048}
# ``--quick``: a small grid and shorter timing (125 s on a quiet 2-core machine in issue 23).
QUICK: dict[str, Any] = {"seqs": (128, 512), "batches": (1, 8), "warmup": 1, "min_repeats": 3, "max_repeats": 10, "point_budget_s": 3.0,
                         "ceiling_size": 1024, "ceiling_budget_s": 0.3}  # fmt: skip

# Every variant ``--variants`` takes, in table order (``variants.VARIANTS`` holds what each one is, under these names).
VARIANT_NAMES: tuple[str, ...] = ("eager-fp32", "eager-sdpa", "eager-int8-torchao", "compile-fp32", "ort-fp32-decomposed", "ort-fp32-onnx-attention",
                                  "ort-fp32-ort-contrib", "ort-fp32-long-seq", "ort-fp16", "ort-int8-dynamic", "ort-int8-static", "ort-lowrank-fp32",
                                  "ort-lowrank-int8-dynamic")  # fmt: skip
# torchao's CPU int8 runs slower than fp32 on x86 without VNNI-aware kernels (0.04-0.8x measured):
# it is benchmarked only when named in --variants.
OPT_IN_VARIANTS: tuple[str, ...] = ("eager-int8-torchao",)
