"""A new transform is a registry entry: this one is defined here, in the test, and no package file changes.

``Prune`` zeroes the smallest-magnitude weights of every Linear in the places the subject offers
(``module_slots``), with torch's own ``l1_unstructured``; it asks the subject only the generic
hooks (``module_slots``, ``export``, ``params``) and declares its key part. The plan chains it
in registry order, names the 8-bit stages built on it from the registry (``pruned-int8-dynamic``,
``lowrank-pruned-int8-dynamic``), and ``compose_key`` composes their tolerance keys from the
registry: no module names the transform. Its tolerance rows are the one thing outside its own
module that a new transform needs (``validate/tolerances.py``; set here with ``monkeypatch``).
"""

from __future__ import annotations

import copy
from dataclasses import dataclass
from typing import ClassVar

import numpy as np
import pytest
from fixtures import small_layer_subject
from torch import nn
from torch.nn.utils import prune as torch_prune

from attn_export.compress import registry
from attn_export.compress.registry import BuildContext, Method, Source, apply, compose_key, methods, register_method
from attn_export.compress.subject_hooks import TransformSubject
from attn_export.config.run import RunConfig
from attn_export.errors import ConfigError
from attn_export.targets.targets import export_spec_for, get_target
from attn_export.pipeline.plan import make_plan
from attn_export.validate.tolerances import TOLERANCES


@dataclass(frozen=True)
class Prune(Method):
    """Zero ``amount`` of each Linear's weights, the smallest in magnitude."""

    role: ClassVar[str] = "transform"
    tolerance: ClassVar[str] = "pruned"
    stage: ClassVar[str] = "pruned"
    filename: ClassVar[str] = "model.pruned.onnx"
    key_part: ClassVar[str] = "pruned"

    amount: float = 0.2

    @classmethod
    def from_run(cls, run, ctx, parent=None):  # type: ignore[no-untyped-def]
        return cls()  # registered only inside these tests: every plan asks for it


def prune(source: Source, config: Prune):  # type: ignore[no-untyped-def]
    subject, ctx = source.subject, source.ctx
    student = copy.deepcopy(source.artifact.module)
    pruned = 0
    for slot in subject.module_slots(student):
        for module in slot.student.modules():
            if isinstance(module, nn.Linear):
                torch_prune.l1_unstructured(module, "weight", amount=config.amount)
                torch_prune.remove(module, "weight")  # the zeros become the weight itself (no mask left to export)
                pruned += 1
    result = subject.export(student, source.path, ctx.fp32_spec)
    return ctx.onnx_artifact(source.name, source.path, "fp32", compose_key(source.artifact.tolerance_key, config.tolerance), module=student,
                             onnx_fp32=source.path, params=subject.params(student), details={"pruned_linears": pruned, "export": result.to_dict()})  # fmt: skip


@pytest.fixture
def with_prune(monkeypatch):
    """``Prune`` registered after the shipped methods, with its tolerance rows; both restored after the test."""
    methods()  # the shipped entries first, in METHOD_MODULES order
    monkeypatch.setattr(registry, "_HANDLERS", dict(registry._HANDLERS))
    register_method(Prune)(prune)
    for key, like in {"pruned": "lowrank", "pruned-int8": "lowrank-int8", "lowrank-pruned": "lowrank", "lowrank-pruned-int8": "lowrank-int8"}.items():
        monkeypatch.setitem(TOLERANCES, key, TOLERANCES[like])


def _stages(cfg: RunConfig) -> dict[str, tuple[str, str, str]]:
    """Method stage -> (its source stage, its file, the tolerance key its artifact is held to)."""
    keys, out = {"subject": "fp32"}, {}
    for step in make_plan(cfg).steps:
        keys[step.name] = compose_key(keys[step.source], step.config.tolerance) if isinstance(step.config, Method) else step.config.precision
        if isinstance(step.config, Method):
            out[step.name] = (step.source, step.filename, keys[step.name])
    return out


def test_the_plan_names_and_keys_the_stages_of_a_new_transform_from_the_registry(with_prune, tmp_path):
    assert methods("transform")[-1] is Prune
    alone = _stages(RunConfig(quantize="int8", int8_mode="dynamic", out=tmp_path))
    assert alone == {
        "pruned": ("onnx-fp32", "model.pruned.onnx", "pruned"),
        "pruned-int8-dynamic": ("pruned", "model.pruned-int8-dynamic.onnx", "pruned-int8"),
    }
    chained = _stages(RunConfig(low_rank=0.5, quantize="int8", int8_mode="dynamic", out=tmp_path))
    assert chained == {
        "lowrank": ("onnx-fp32", "model.lowrank.onnx", "lowrank"),
        "pruned": ("lowrank", "model.pruned.onnx", "lowrank-pruned"),
        "lowrank-pruned-int8-dynamic": ("pruned", "model.lowrank-pruned-int8-dynamic.onnx", "lowrank-pruned-int8"),
    }
    with pytest.raises(ConfigError, match="no tolerance for 'pruned-fp8'"):
        compose_key("pruned", "fp8")  # a combination with no row is refused, not held to a guess


def test_without_the_entry_the_shipped_plan_is_unchanged(tmp_path):
    assert Prune not in methods()
    assert _stages(RunConfig(low_rank=0.5, quantize="int8", int8_mode="dynamic", out=tmp_path)) == {
        "lowrank": ("onnx-fp32", "model.lowrank.onnx", "lowrank"),
        "lowrank-int8-dynamic": ("lowrank", "model.lowrank-int8-dynamic.onnx", "lowrank-int8"),
    }


def test_a_new_transform_builds_through_the_generic_hooks_only(with_prune, tmp_path):
    subject = small_layer_subject(tmp_path)
    assert isinstance(subject, TransformSubject)
    spec = export_spec_for("ort-cpu", "fp32")
    ctx = BuildContext(subject, tmp_path, get_target("ort-cpu"), spec, 1)
    fp32 = tmp_path / "model.onnx"
    subject.export(subject.module, fp32, spec)
    source = ctx.onnx_artifact("onnx-fp32", fp32, "fp32", "fp32", module=subject.module, onnx_fp32=fp32)
    art = apply(Source(source, "pruned", tmp_path / "model.pruned.onnx", ctx), Prune(amount=0.25))
    assert art.tolerance_key == "pruned" and art.details["pruned_linears"] >= 4  # QKV (or Q, K, V), O, FFN1, FFN2
    weights = [m.weight.detach().numpy() for m in art.module.modules() if isinstance(m, nn.Linear)]
    assert all(np.mean(w == 0) >= 0.24 for w in weights), [float(np.mean(w == 0)) for w in weights]
    assert all(np.mean(m.weight.detach().numpy() == 0) < 0.01 for m in subject.module.modules() if isinstance(m, nn.Linear)), "the reference is untouched"
    feed = subject.feeds("report")[0]
    got, want = art.make_runner().infer(feed)["y"], subject.eager_runner(art.module).infer(feed)["y"]
    np.testing.assert_allclose(got, want, atol=1e-4)  # the exported graph is the pruned student
