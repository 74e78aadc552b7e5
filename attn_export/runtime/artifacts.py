"""``Artifact``: what a pipeline stage builds, and how it is run to be judged and timed.

Every stage (an export, a compression method, an engine) produces one ``Artifact``; the
runner then times all of them side by side with eager and judges each against the subject,
without knowing which stage made it. How an ONNX artifact is run is decided here once:

* the target's ONNX Runtime execution providers (``Target.providers``) this onnxruntime build
  has; when its own is missing, or ONNX Runtime only emulates the target's runtime
  (``Target.emulation``: TensorRT), the rest as a *named* stand-in
  (``ort-cuda (validated on CPUExecutionProvider)``);
* explicitly quantized (TensorRT) Q/DQ graphs with ORT's QDQ fusion off, i.e. the reference arithmetic TensorRT
  implements, so no CPU int8 kernel (saturating or not) decides their accuracy.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from attn_export.runtime.base import Runner

__all__ = ["Artifact", "OnnxRuntimeChoice", "onnx_runtime_for", "ort_runner_factory"]

log = logging.getLogger(__name__)


@dataclass
class Artifact:
    """One built variant of the subject.

    ``module`` is the eager model the artifact computes (a later stage compresses it further);
    ``onnx_fp32`` its fp32 ONNX export (what int8 quantizers start from); ``deployable`` is
    False for eager-only variants (torchao), which are reported but never shipped.
    """

    name: str
    precision: str
    tolerance_key: str
    make_runner: Callable[[], Runner]
    path: Path | None = None
    module: Any = None
    onnx_fp32: Path | None = None
    size_bytes: int | None = None
    params: int | None = None
    route: str | None = None
    deployable: bool = True
    details: dict[str, Any] = field(default_factory=dict)
    label: str | None = None  # how the terminal and the report name where it ran, when not plain
    defects: list[str] = field(default_factory=list)  # what its method found wrong with it: judged as violations

    @property
    def display_name(self) -> str:
        return self.label or self.name


@dataclass(frozen=True)
class OnnxRuntimeChoice:
    """Where an ONNX artifact is validated: providers, and whether that is a stand-in."""

    providers: tuple[str, ...]
    stand_in: str | None  # why the target's own runtime is not used, or None
    qdq_fusion: bool = True
    u8u8: bool = False  # session.x64quantprecision=1 (int8 on CPUs without VNNI)

    def record(self) -> dict[str, Any]:
        out: dict[str, Any] = {"backend": "onnxruntime", "providers": list(self.providers)}
        if self.stand_in:
            out["stand_in"] = self.stand_in
        out["qdq"] = "fused int8 kernels" if self.qdq_fusion else "reference Q/DQ arithmetic (session.disable_quant_qdq=1)"
        if self.u8u8:
            out["session_options"] = {"session.x64quantprecision": "1"}
        return out

    def label(self, stage: str) -> str | None:
        if not self.stand_in:
            return None
        return f"{stage} (validated on {self.providers[0]})"


def onnx_runtime_for(target: Any, qdq_reference: bool = False, u8u8: bool = False) -> OnnxRuntimeChoice:
    """The ONNX Runtime providers (and session options) that validate an artifact for ``target``: its ``providers``
    this onnxruntime build has, a named stand-in when its own (the first) is missing or only emulated (``emulation``)."""
    from attn_export.runtime.ort import PROVIDER_PACKAGES, available_providers

    have = set(available_providers())
    u8u8 = u8u8 and not qdq_reference
    providers = tuple(p for p in target.providers if p in have) or ("CPUExecutionProvider",)
    own = target.providers[0]
    if target.emulation:
        why = f"the {target.name} target {target.emulation}"
    elif own not in have:
        why = f"{own} is not in this onnxruntime build (install {PROVIDER_PACKAGES.get(own, 'an onnxruntime build that has it')})"
    else:
        why = None
    return OnnxRuntimeChoice(providers, why, not qdq_reference, u8u8)


def ort_runner_factory(path: Path, choice: OnnxRuntimeChoice, threads: int, name: str) -> Callable[[], Runner]:
    """A lazy ``OrtRunner`` for ``path`` as ``choice`` says (built when the runner pass needs it)."""
    from attn_export.runtime import OrtRunner, SessionFromOnnx

    def make() -> Runner:
        session = SessionFromOnnx(path, providers=list(choice.providers), intra_op_threads=threads, qdq_fusion=choice.qdq_fusion, u8u8=choice.u8u8)
        return OrtRunner(session, name=name)

    return make
