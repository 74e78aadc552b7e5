"""How int8 weights are encoded for ONNX Runtime on the CPU the model will run on.

ONNX Runtime's x86 int8 GEMM multiplies uint8 activations by int8 weights (U8S8; symmetric
int8 activations are shifted to uint8 with zero point 128 on x86). Without VNNI it uses
VPMADDUBSW, which adds two adjacent byte products into a *saturating* int16 before widening
to int32: 255 x 127 + 255 x 127 = 64770 does not fit in 32767. With VNNI, AMX or Arm's dot
product the sums are 32-bit and exact. So the same int8 model is exact on one CPU and
silently wrong on another (measured on an AVX2 EPYC: the static route's cosine fell from
0.99993 to 0.99914, percentile calibration to 0.99887; a low-rank model to 0.9973).

The encodings, following ONNX Runtime's quantization guide ("When to use reduce-range") and
``session.x64quantprecision`` in ``onnxruntime_session_options_config_keys.h``:

* ``full-range``: weights in [-127, 127], the U8S8 kernel. Exact where nothing saturates.
* ``u8u8``: the same full-range model, run with the session option
  ``session.x64quantprecision=1``: ORT converts the constant int8 weights to uint8 and uses its
  U8U8 kernel, which widens bytes to int16 before multiplying (VPMADDWD) and cannot saturate.
  Exact on every x86 CPU, at some speed cost on CPUs without VNNI; a deployment must set the
  option too (the report and the summary say so).
* ``reduce-range``: 7-bit weights in [-64, 64]. Any pair of products is at most
  2 x 255 x 64 = 32640 < 32767, so U8S8 cannot saturate in any session, with no option to set;
  costs ~1 bit of weight precision.

Measured on real ONNX Runtime 1.32 kernels for AVX2 without VNNI (``qemu-x86_64 -cpu Haswell``,
``bench/int8_isa.py``), cosine vs eager fp32:

| model, route | VNNI (exact) | AVX2 full-range | AVX2 reduce-range | AVX2 u8u8 |
|---|---|---|---|---|
| default layer, static | 0.999932 | 0.999141 | 0.999929 | 0.999932 |
| default layer, dynamic | 0.999951 | 0.999747 | 0.999947 | 0.999951 |
| MiniLM, dynamic (mean embedding cosine) | 0.990848 | 0.989169 | 0.988194 | 0.990848 |

reduce-range fixes the default layer but loses MiniLM more than saturation does, so ``auto``
picks ``u8u8`` on CPUs whose U8S8 kernel saturates: the only encoding that is exact there.

The TensorRT route never changes: its Q/DQ stays symmetric int8 with zero point 0 and full
range, because TensorRT runs it on the GPU. Its accuracy is measured with ORT's QDQ fusion off
(``session.disable_quant_qdq``), i.e. the Q/DQ arithmetic TensorRT implements, which no CPU
kernel can distort.

``tests/compress/u8s8_sim.py`` reproduces the saturating arithmetic in numpy, so the effect
(and the fix) is tested on any machine, beside a real run of ORT's AVX2 kernels under qemu.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any

from attn_export.host.environment import CpuInfo, detect_cpu
from attn_export.errors import ConfigError
from attn_export.vocab.choices import CPU_INT8_ENCODINGS

__all__ = [
    "U8U8_SESSION_OPTION",
    "CPU_INT8_ENCODINGS",
    "EncodingChoice",
    "choose_cpu_encoding",
]

log = logging.getLogger(__name__)

U8U8_SESSION_OPTION = ("session.x64quantprecision", "1")


@dataclass(frozen=True)
class EncodingChoice:
    """The weight encoding for ONNX Runtime CPU int8 routes, and why."""

    encoding: str  # "full-range" | "reduce-range" | "u8u8"
    isa_class: str
    reason: str

    @property
    def reduce_range(self) -> bool:
        """7-bit weights in the model file."""
        return self.encoding == "reduce-range"

    @property
    def session_u8u8(self) -> bool:
        """Sessions that run the model must set ``session.x64quantprecision=1``."""
        return self.encoding == "u8u8"

    def deploy_note(self) -> str | None:
        if self.session_u8u8:
            return (f"int8 models were validated with the ONNX Runtime session option {U8U8_SESSION_OPTION[0]}={U8U8_SESSION_OPTION[1]} "
                    f"(this {self.isa_class} CPU has no VNNI: without it the U8S8 kernel saturates); set it in every CPU session "
                    "that runs them, or rebuild with --int8-encoding reduce-range for a model that needs no option")
        return None

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {"encoding": self.encoding, "isa_class": self.isa_class, "reason": self.reason}
        if self.session_u8u8:
            out["session_options"] = {U8U8_SESSION_OPTION[0]: U8U8_SESSION_OPTION[1]}
        return out


def choose_cpu_encoding(requested: str = "auto", cpu: CpuInfo | None = None) -> EncodingChoice:
    """``auto`` picks u8u8 (the U8U8 session option) where U8S8 saturates on this CPU, full-range elsewhere."""
    if requested not in CPU_INT8_ENCODINGS:
        raise ConfigError(f"expected --int8-encoding in {', '.join(CPU_INT8_ENCODINGS)}, got {requested!r}")
    cpu = cpu or detect_cpu()
    if requested != "auto":
        return EncodingChoice(requested, cpu.isa_class, f"--int8-encoding {requested} (requested)")
    if cpu.u8s8_saturates:
        return EncodingChoice(
            "u8u8", cpu.isa_class,
            f"{cpu.isa_class} has no VNNI: ONNX Runtime's U8S8 kernel (VPMADDUBSW) saturates int16 pair sums; full-range "
            "weights run exactly on its U8U8 kernel (session.x64quantprecision=1), which 7-bit reduce-range weights do not match",
        )  # fmt: skip
    return EncodingChoice(
        "full-range", cpu.isa_class,
        f"{cpu.isa_class} accumulates int8 products in 32 bits: full-range weights, exact. On x86 CPUs without VNNI run the "
        "model with session.x64quantprecision=1 (or build it with --int8-encoding reduce-range)",
    )  # fmt: skip
