"""Compression methods as self-describing configs, dispatched through one registry (torchao's ``quantize_``).

A method is a frozen config dataclass that subclasses ``Method`` and says what it is:

* ``role``: ``transform`` (changes the model: low-rank, distillation), ``route`` (one way to
  reach a precision; the routes of a precision compete in the plan's selection) or ``refine``
  (improves the result of the route it ``refines``, and competes beside it);
* ``precision`` (what ``--quantize`` names), ``route`` (what ``--int8-mode`` names) and
  ``description`` (what ``--int8-mode``'s help says of the route),
  ``tolerance`` (the key into ``validate/tolerances.py``), ``produces`` (``onnx`` | ``qdq-onnx``
  | ``eager``), ``needs`` (the data roles it reads) and ``stage``/``filename`` (how its stage and
  file are named, ``{prefix}`` being ``stage_prefix``: the precision, after the key parts of the
  transforms it was built on);
* ``key_part`` (a transform whose result is lossy): what it adds to the names and tolerance keys of
  the stages built on it (low-rank's ``lowrank``: ``lowrank-int8-static``, held to ``lowrank-int8``;
  ``compose_key`` and ``stage_prefix`` read it, so no other module names a transform);
* ``deploy_refusal(target)``: why a target cannot deploy it (None: it can): the target's route
  policy (``Target.route_preference``) is enforced here, with the method's ``unlisted_why``;
* ``from_run(run, ctx)``: the config a ``RunConfig`` asks for, ``Skip(reason)``, or None.

and one function registered for the type applies it, torchao-style, to a ``Source``, asking the
subject only the generic hooks of ``compress.subject_hooks`` (the slots a transform may rewrite,
the data roles, the select split's quick error, its training defaults):

    @register_method(MyMethod)
    def _my_method(source: Source, config: MyMethod) -> Artifact: ...

The plan iterates ``methods()``; it never names a method. Adding one is a module with the
config and its function, and its line in ``METHOD_MODULES`` (docs/architecture.md).
Light at import (no torch, no onnx): ``RunConfig`` validates flags against the registry.
"""

from __future__ import annotations

import importlib
import logging
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar, TypeVar

from attn_export.errors import ConfigError

if TYPE_CHECKING:
    from attn_export.runtime.artifacts import Artifact, OnnxRuntimeChoice
    from attn_export.compress.subject_hooks import TransformSubject
    from attn_export.targets.targets import Target
    from attn_export.vocab.run_options import RunOptions

__all__ = [
    "METHOD_MODULES",
    "BuildContext",
    "Method",
    "PlanContext",
    "Skip",
    "Source",
    "apply",
    "compose_key",
    "methods",
    "precisions",
    "register_method",
    "route_choices",
    "route_help",
    "route_names",
    "stage_prefix",
]

log = logging.getLogger(__name__)

# One line per method module: importing it registers its config and function.
METHOD_MODULES: tuple[str, ...] = (
    "attn_export.compress.methods.lowrank",
    "attn_export.compress.methods.distill",
    "attn_export.compress.methods.int8_static",
    "attn_export.compress.methods.int8_qat",
    "attn_export.compress.methods.int8_dynamic",
    "attn_export.compress.methods.torchao",
    "attn_export.compress.methods.fp8_static",
    "attn_export.compress.methods.int8_weight_only",
)


@dataclass(frozen=True)
class Skip:
    """A method the run asked for (or would get by default) that this target or run does not build, and why."""

    reason: str


@dataclass
class PlanContext:
    """What ``Method.from_run`` may read besides the run options: the target, the subject's profile, the CPU's int8 encoding."""

    target: Target
    profile: Any  # subjects.kinds.SubjectProfile
    precision: str | None = None  # the 8-bit precision being planned (--quantize, or each candidate of --quantize auto)
    _encoding: Any = None

    @property
    def encoding(self) -> Any:
        """How this CPU stores int8 weights for ONNX Runtime (``compress.int8_encoding``), chosen once per plan."""
        if self._encoding is None:
            raise ConfigError("the CPU int8 encoding is chosen by the plan before any 8-bit method is planned")
        return self._encoding


class Method:
    """Base of every method config (subclasses are frozen dataclasses); see the module docstring."""

    role: ClassVar[str] = "transform"
    precision: ClassVar[str] = "fp32"
    route: ClassVar[str] = ""
    description: ClassVar[str] = ""  # a route's few words in --int8-mode's help (``route_help``)
    tolerance: ClassVar[str] = "fp32"
    produces: ClassVar[str] = "onnx"
    needs: ClassVar[tuple[str, ...]] = ()
    stage: ClassVar[str] = ""
    filename: ClassVar[str] = ""
    refines: ClassVar[type[Method] | None] = None
    key_part: ClassVar[str] = ""  # a lossy transform: what stages built on its result carry in their name and tolerance key
    required: ClassVar[bool] = False  # a transform whose failure fails the run (the last of the chain always does)

    # Why a target whose route policy leaves this route out does so (what the method writes that the runtime cannot run):
    # carried into the refusal, so the user reads the reason and not only the policy.
    unlisted_why: ClassVar[str] = ""

    @classmethod
    def deploy_refusal(cls, target: Target) -> str | None:
        """Why ``target`` cannot deploy what this method produces (None: it can): a route its route policy does not list."""
        if cls.role == "transform":
            return None  # a transform's fp32 student deploys wherever its source does
        return target.route_refusal(cls.precision, cls.route, cls.unlisted_why)

    @classmethod
    def from_run(cls, run: RunOptions, ctx: PlanContext, parent: Method | None = None) -> Method | Skip | None:
        """The config ``run`` asks for; ``Skip`` when it is not built (with the reason); None when not asked."""
        return None

    @classmethod
    def requested(cls, run: RunOptions, ctx: PlanContext) -> bool:
        """A route is requested when its precision is planned (``--quantize``) with ``--int8-mode auto`` or its own route name."""
        return ctx.precision == cls.precision and run.int8_mode in ("auto", cls.route)

    @property
    def deployable(self) -> bool:
        return self.produces != "eager"

    def fitted(self) -> str | None:
        """What this method fits on the train split (None: nothing): the likely cause when a stage passes on one
        data set and fails on another."""
        return None

    def describe(self) -> dict[str, Any]:
        """What the report records of the method: its self-description and its settings."""
        from dataclasses import asdict, is_dataclass

        settings = asdict(self) if is_dataclass(self) else {}
        return {"method": type(self).__name__, "role": self.role, "precision": self.precision, "route": self.route or None,
                "tolerance": self.tolerance, "produces": self.produces, "needs": list(self.needs), "settings": settings}  # fmt: skip


@dataclass
class BuildContext:
    """What every method needs besides its config and source: where to write, how to export and run."""

    subject: TransformSubject
    out: Path
    target: Target
    fp32_spec: Any  # ExportSpec of the target at fp32 (every compressed student is exported with it)
    threads: int
    say: Callable[[str], None] = field(default=lambda msg: None)

    def runtime(self, qdq_reference: bool = False, u8u8: bool = False) -> OnnxRuntimeChoice:
        from attn_export.runtime.artifacts import onnx_runtime_for

        return onnx_runtime_for(self.target, qdq_reference, u8u8)

    def onnx_artifact(self, name: str, path: Path, precision: str, tolerance_key: str, qdq_reference: bool = False, u8u8: bool = False,
                      **kw: Any) -> Artifact:  # fmt: skip
        """An artifact for an ONNX file, run where the target says (stand-ins named)."""
        from attn_export.runtime.artifacts import Artifact, ort_runner_factory

        choice = self.runtime(qdq_reference, u8u8)
        art = Artifact(name=name, precision=precision, tolerance_key=tolerance_key, make_runner=ort_runner_factory(path, choice, self.threads, name),
                       path=path, size_bytes=path.stat().st_size, label=choice.label(name), **kw)  # fmt: skip
        art.details["runtime"] = choice.record()
        return art


@dataclass(frozen=True)
class Source:
    """What a method builds from: the subject, the artifact of its source stage, and where its result goes."""

    artifact: Artifact
    name: str
    path: Path
    ctx: BuildContext

    @property
    def subject(self) -> TransformSubject:
        return self.ctx.subject


M = TypeVar("M", bound=Method)
Handler = Callable[[Source, Any], "Artifact"]
_HANDLERS: dict[type[Method], Handler] = {}
_loaded = False


def register_method(config_type: type[M]) -> Callable[[Callable[[Source, M], Artifact]], Callable[[Source, M], Artifact]]:
    """Register the function that applies configs of ``config_type``."""

    def deco(fn: Callable[[Source, M], Artifact]) -> Callable[[Source, M], Artifact]:
        _HANDLERS[config_type] = fn
        return fn

    return deco


def _load() -> None:
    global _loaded
    if not _loaded:
        for module in METHOD_MODULES:
            importlib.import_module(module)
        _loaded = True


def methods(role: str | None = None) -> list[type[Method]]:
    """Every registered method (of ``role``), in ``METHOD_MODULES`` order."""
    _load()
    return [m for m in _HANDLERS if role is None or m.role == role]


def precisions() -> tuple[str, ...]:
    """What ``--quantize`` takes: the precisions the registered routes reach."""
    return tuple(dict.fromkeys(m.precision for m in methods("route")))


def route_names(precision: str) -> tuple[str, ...]:
    """What ``--int8-mode`` takes for ``precision`` (besides ``auto``): its routes' names."""
    return tuple(m.route for m in methods("route") if m.precision == precision)


def _key_parts(key: str) -> tuple[list[str], str]:
    """The transforms' key parts ``key`` starts with, in order, and what follows them (a precision, or nothing)."""
    parts = tuple(dict.fromkeys(m.key_part for m in methods("transform") if m.key_part))
    found: list[str] = []
    while part := next((p for p in parts if key == p or key.startswith(p + "-")), None):
        found.append(part)
        key = key[len(part) + 1 :]
    return found, key


def compose_key(source_key: str, method_key: str) -> str:
    """The tolerance key of a method applied to a source stage: a lossy transform's errors add to the method's
    (8-bit of a low-rank student: ``lowrank-int8``); any other source leaves the method's own key."""
    from attn_export.validate.tolerances import tolerance_spec

    source_parts, _ = _key_parts(source_key)
    if not source_parts:
        return method_key
    method_parts, rest = _key_parts(method_key)
    key = "-".join([*dict.fromkeys([*source_parts, *method_parts]), *([rest] if rest else [])])
    tolerance_spec(key)  # every combination a plan can build has a row
    return key


def stage_prefix(transforms: Iterable[type[Method]], precision: str) -> str:
    """What a route's ``{prefix}`` is on the result of ``transforms``: their key parts, then the precision (``lowrank-int8``)."""
    return "-".join([*dict.fromkeys(m.key_part for m in transforms if m.key_part), precision])


def route_choices() -> tuple[str, ...]:
    """What ``--int8-mode`` takes: ``auto`` (every route the target can deploy), then each route name once."""
    return ("auto", *dict.fromkeys(m.route for m in methods("route")))


def route_help() -> str:
    """``--int8-mode``'s help, from the routes' own descriptions (a route several precisions share names each)."""
    parts = ["auto (every route the target can deploy)"]
    for name in route_choices()[1:]:
        found = [m for m in methods("route") if m.route == name]
        said = "; ".join(f"{m.precision}: {m.description}" if len(found) > 1 else m.description for m in found)
        parts.append(f"{name} ({said})")
    return " | ".join(parts) + "."


def apply(source: Source, config: Method) -> Artifact:
    """Apply the method registered for ``type(config)`` to ``source``; the result is stage ``source.name``."""
    _load()
    fn = _HANDLERS.get(type(config))
    if fn is None:
        raise ConfigError(f"no compression method is registered for {type(config).__name__}; known: {', '.join(t.__name__ for t in _HANDLERS)}")
    return fn(source, config)
