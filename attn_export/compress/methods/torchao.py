"""``TorchaoInt8``: torchao's eager int8 (``quantize_``), the PyTorch accuracy reference; not exportable."""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import TYPE_CHECKING, ClassVar

from attn_export.compress.registry import Method, PlanContext, Skip, Source, compose_key, register_method

if TYPE_CHECKING:
    from attn_export.runtime.artifacts import Artifact
    from attn_export.targets.targets import Target
    from attn_export.vocab.run_options import RunOptions

__all__ = ["TORCHAO_OPT_IN_NOTE", "TorchaoInt8"]

log = logging.getLogger(__name__)

# Why torchao is opt-in in the pipeline and the bench: measured on x86 CPUs without torch.compile,
# its eager int8 ran at 0.04-0.05x eager fp32 on an AVX2 EPYC (3.3-4.3 s per call on the default
# layer) and 0.2-0.8x on AVX-512 VNNI, and a quick in-process probe flips with machine load, which
# would make a run's stage list depend on the noise. It stays the accuracy reference on request.
TORCHAO_OPT_IN_NOTE = (
    "int8 route torchao not run by default: torchao's eager CPU int8 runs slower than eager fp32 on x86 "
    "(0.04-0.8x measured on AVX2 and AVX-512 VNNI); add --with-torchao (or --int8-mode torchao) to time it as the accuracy reference"
)
TORCHAO_IS_EAGER_ONLY = (
    "the torchao int8 route quantizes the eager PyTorch module and does not export to ONNX; "
    "use --int8-mode static or dynamic for a deployable model"
)


@dataclass(frozen=True)
class TorchaoInt8(Method):
    """torchao's eager int8 (``quantize_``): the PyTorch accuracy reference; reported, never shipped."""

    role: ClassVar[str] = "route"
    precision: ClassVar[str] = "int8"
    route: ClassVar[str] = "torchao"
    description: ClassVar[str] = "eager PyTorch int8, the accuracy reference; reported, never shipped"
    tolerance: ClassVar[str] = "int8"
    produces: ClassVar[str] = "eager"
    stage: ClassVar[str] = "{prefix}-torchao"

    mode: str = "int8-dynamic"

    @classmethod
    def deploy_refusal(cls, target: Target) -> str | None:
        return TORCHAO_IS_EAGER_ONLY

    @classmethod
    def from_run(cls, run: RunOptions, ctx: PlanContext, parent: Method | None = None) -> TorchaoInt8 | Skip | None:
        if ctx.precision != cls.precision:
            return None
        if run.int8_mode == cls.route or (run.with_torchao and run.int8_mode == "auto"):
            return cls()
        return Skip(TORCHAO_OPT_IN_NOTE) if run.int8_mode == "auto" else None


def module_bytes(model: object) -> int:
    """Bytes of parameters and buffers as stored (torchao's int8 tensors count 1 byte per element)."""
    total = 0
    for t in list(model.parameters()) + list(model.buffers()):  # type: ignore[attr-defined]
        inner = [getattr(t, a) for a in ("qdata", "int_data", "scale", "zero_point") if hasattr(t, a)]
        total += sum(i.numel() * i.element_size() for i in inner) if inner else t.numel() * t.element_size()
    return total


@register_method(TorchaoInt8)
def torchao_int8(source: Source, config: TorchaoInt8) -> Artifact:
    from attn_export.runtime.artifacts import Artifact
    from attn_export.compress.quant.eager import quantize_eager_

    source.ctx.say(f"int8 torchao: quantize_ with {config.mode} (eager reference, not exported)")
    qmodel = quantize_eager_(source.artifact.module, config.mode)  # works on a copy
    subject, name = source.subject, source.name
    return Artifact(
        name=name, precision=config.precision, tolerance_key=compose_key(source.artifact.tolerance_key, config.tolerance),
        make_runner=lambda: subject.eager_runner(qmodel, name=name), module=qmodel, size_bytes=module_bytes(qmodel),
        params=source.artifact.params, route=config.route, deployable=False,
        details={"route": "torchao", "quantization": {"route": "torchao", "mode": config.mode}, "runtime": {"backend": "torch eager (torchao)"}},
    )  # fmt: skip
