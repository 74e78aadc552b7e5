"""``RunConfig``: every option of one run, validated before any model is built.

One config drives every kind of subject (a reference layer, a pretrained checkpoint, or one
layer of it: ``subjects.kinds``) and every command that runs the pipeline (the main command,
``encoder``, ``sweep``'s points and ``bench``'s variants are lists of RunConfigs).
Each option either means the same thing for both subjects or is refused, with a
``ConfigError`` that names the flag and says why, *before* anything is built:

* subject-defining flags (``--layer --d-model --heads --mask`` for layers, ``--layers
  --max-len --languages`` for checkpoints) are refused for the other subject;
* ``--calib`` takes activation files for a layer and a UTF-8 text file (one text per line)
  for a checkpoint, each refusing the other kind;
* ``--low-rank-targets``, ``--calib-method`` and ``--smoothquant`` default to what measured
  best for the subject (``q,k,v,o``, ``minmax`` and off for the reference layer; ``q,k``,
  ``percentile`` and ``auto`` for MiniLM); an explicit value is always honoured.

Defaults that depend on the subject are ``None`` here and resolved by the ``resolved_*``
properties from the subject kind's measured defaults, so "not given" and "given the default
value" can be told apart. ``--quantize`` and ``--int8-mode`` take what the compression
registry's methods name. Light at import: no torch, no onnx (flags fail in under a second).
"""

from __future__ import annotations

import logging
import os
from dataclasses import MISSING, dataclass, field, fields
from pathlib import Path
from typing import TYPE_CHECKING, Any

from attn_export.config.rules import LIMITS, check_combinations, check_numbers
from attn_export.errors import ConfigError
from attn_export.targets.targets import DEFAULT_TARGET
from attn_export.host.memory import MemoryEstimate, check_fits, estimate_memory
from attn_export.vocab.choices import CALIB_CHOICES, CPU_INT8_ENCODINGS, LOW_RANK_METHODS, LOW_RANK_TARGET_NAMES

if TYPE_CHECKING:
    from attn_export.targets.targets import Target
    from attn_export.subjects.kinds import SubjectKind

__all__ = ["LIMITS", "RunConfig", "run_default"]

log = logging.getLogger(__name__)

@dataclass
class RunConfig:
    """One run of the pipeline. See ``attn-export --help`` for each option's meaning."""

    # subject: a checkpoint, or a reference layer
    checkpoint: str | None = None
    layers: str | None = None
    max_len: int | None = None
    max_texts: int | None = None
    languages: str | None = None
    pooling: str | None = None  # the sentence embedding's pooling, overriding what the checkpoint ships (sentence-transformers' modes)
    prompt: str | None = None  # a named prompt of the sentence-transformers model ('' or none: no prompt); None: the model's default
    encoder_form: str | None = None  # auto|padded|packed (layers/packed.py); None: the kind's default (auto)
    layer: str | None = None
    d_model: int | None = None
    heads: int | None = None
    mask: str | None = None
    seed: int = 0
    # shapes of the latency input (accuracy uses the held-out data)
    seq_len: int = 128
    batch: int = 8
    # export
    opset: int | None = None
    attention: str | None = None  # None or "auto": the target's choice for the sequence profile (plan.export_spec)
    attention_impl: str = "math"  # the eager reference: explicit math, or PyTorch SDPA
    precision: str = "fp32"
    # comparison
    threads: int | None = None
    warmup: int = 3
    repeats: int = 20
    validation_batches: int = 2  # random-input runs (no calibration data): batches judged
    # compression
    low_rank: float | None = None
    low_rank_method: str = "activation"
    low_rank_targets: str | None = None
    distill: int | None = None
    quantize: str | None = None
    int8_mode: str = "auto"
    int8_encoding: str = "auto"
    with_torchao: bool = False
    calib: Path | None = None
    calib_method: str | None = None
    smoothquant: float | str | None = None
    int8_fallback: str | int = "auto"
    int8_qat: int | None = None
    int8_qat_scales: str = "learned"
    # judging: per-output tolerance overrides, {"*"|output: {"max_abs"|"rel_l2"|"cosine_min": value}} (--atol/--rtol/--cosine-min)
    tolerance_overrides: dict[str, dict[str, float]] | None = None
    # deployment
    target: str = DEFAULT_TARGET
    trt_version: str | None = None
    gpu_arch: str | None = None  # sm87 (Jetson Orin), sm89 (Ada), sm90 (Hopper), sm100 (Blackwell)...; default: the target's
    engine: object | None = None  # runtime.trt_spec.EngineSpec; typed loosely to keep this module light
    build_engine: bool = False
    bundle: Path | None = None
    triton: Path | None = None
    triton_config: Path | None = None  # a hand-written config.pbtxt for the TensorRT plan, checked against the engine's profiles
    # output
    out: Path = field(default_factory=lambda: Path("attn-export-out"))
    force: bool = False  # files attn-export did not write in --out, --bundle, --triton: moved into a new folder beside each, instead of a refusal
    accept_engine_mismatch: bool = False  # an engine whose attestation finds a GEMM wider than planned or attention unfused: recorded, not a failure
    accept_partial: bool = False  # ship what met its tolerance on the report split but fails another judged data set: exit 0, recorded (validate.verdict)
    render: bool = True
    # resources: the memory budget the estimate is held to (None: what the machine has free)
    max_memory: int | None = None

    def __post_init__(self) -> None:
        self.out = Path(self.out)
        check_numbers(self)
        self._check_subject_flags()
        self._check_choices()
        check_combinations(self)
        self.export_spec()  # attention / opset / precision agree with the target

    # -- validation ---------------------------------------------------------------------
    def _check_subject_flags(self) -> None:
        self.kind.check_flags(self)

    def _check_choices(self) -> None:
        from attn_export.compress.registry import precisions, route_choices
        from attn_export.targets.targets import TARGETS
        from attn_export.vocab.precisions import check_export_precision

        if self.target not in TARGETS:
            raise ConfigError(f"expected --target in {', '.join(TARGETS)}, got {self.target!r}")
        if self.quantize == "none":
            self.quantize = None
        if self.quantize is not None and self.quantize not in (*precisions(), "auto"):
            raise ConfigError(f"expected --quantize in {'|'.join(('none', *precisions(), 'auto'))}, got {self.quantize!r}")
        check_export_precision(self.precision)
        modes = route_choices()
        if self.int8_mode not in modes:
            raise ConfigError(f"expected --int8-mode in {'|'.join(modes)}, got {self.int8_mode!r}")
        if self.int8_encoding not in CPU_INT8_ENCODINGS:
            raise ConfigError(f"expected --int8-encoding in {'|'.join(CPU_INT8_ENCODINGS)}, got {self.int8_encoding!r}")
        if self.calib_method is not None and self.calib_method not in CALIB_CHOICES:
            raise ConfigError(f"expected --calib-method in {'|'.join(CALIB_CHOICES)}, got {self.calib_method!r}")
        if self.attention_impl not in ("math", "sdpa"):
            raise ConfigError(f"expected --attention-impl math|sdpa, got {self.attention_impl!r}")
        if self.low_rank_method not in LOW_RANK_METHODS:
            raise ConfigError(f"expected --low-rank-method in {'|'.join(LOW_RANK_METHODS)}, got {self.low_rank_method!r}")
        targets = self.resolved_low_rank_targets
        bad = [t for t in targets if t not in LOW_RANK_TARGET_NAMES]
        if bad or not targets:
            raise ConfigError(f"expected --low-rank-targets from {','.join(LOW_RANK_TARGET_NAMES)}, got {self.low_rank_targets!r}")
        for flag, values in (("--low-rank-targets", targets), ("--languages", self.resolved_languages or ())):
            if len(set(values)) != len(values):  # a repeat would factorize twice, or read a corpus twice
                raise ConfigError(f"expected each {flag} value once, got {','.join(values)}; use {flag} {','.join(dict.fromkeys(values))}")

    def check_paths(self) -> None:
        """Refuse output and input paths that cannot work, before any model is built."""
        from attn_export.host.paths import check_input_file, check_output_dir, check_output_file
        from attn_export.outdir.recovery import check_owned

        check_output_dir(self.out, "--out")
        check_owned(self.out, "--out", self.force)  # the user's own model.onnx is never overwritten (run_dir)
        deploy = [(flag, Path(path)) for flag, path in (("--bundle", self.bundle), ("--triton", self.triton)) if path is not None]
        for flag, path in deploy:
            check_output_dir(path, flag)
            if path.absolute() == self.out.absolute():
                raise ConfigError(f"{flag} {path} is the --out folder; pass a folder of its own (e.g. {path / flag[2:]})")
        if deploy:
            from attn_export.deploy.folder import check_deploy_paths

            check_deploy_paths(self.out, deploy, self.force)  # a folder of its own, holding only attn-export's files
        if self.calib is not None:
            check_input_file(Path(self.calib), "--calib", allow_dir=not self.is_checkpoint)
        timing_cache = getattr(self.engine, "timing_cache", None)
        if timing_cache:
            check_output_file(Path(timing_cache), "--timing-cache")
        if self.triton_config is not None:
            self.check_triton_config()

    def check_triton_config(self) -> None:
        """A hand ``--triton-config`` parses and asks no larger batch than the engine's profiles will hold (the built
        engine's own profiles are checked again when the repository is written)."""
        from attn_export.targets.triton_config import EngineLimits, check_hand_config, read_hand_config

        hand = read_hand_config(Path(self.triton_config))  # type: ignore[arg-type]
        profiles = self.engine_spec(self.precision).optimization_profiles
        limits = EngineLimits(min(p.max[0] for p in profiles), {e.name: tuple(int(d) for d in e.dims) for e in hand.input}, len(profiles))
        check_hand_config(hand, limits)

    def preflight(self) -> None:
        """Every check that needs the filesystem or the machine, before the first model is built:
        paths, the subject's own files (a checkpoint's config.json, the default calibration set)
        and the memory estimate against what is available (``--max-memory`` overrides it)."""
        self.check_paths()
        self.kind.preflight(self)
        self.kind.check_tolerance_outputs(self)  # the outputs are known once the subject is (config.json: a task head or not)
        self.check_memory()

    def check_memory(self) -> MemoryEstimate:
        """Refuse a run whose estimated peak memory exceeds ``--max-memory`` (default: the memory available)
        or the address-space limit (``ulimit -v``): ``resources.check_fits``."""
        est = self.estimate_memory()
        check_fits(est, self.max_memory)
        return est

    def estimate_memory(self) -> MemoryEstimate:
        """Peak resident memory of this run (``resources.estimate_memory``)."""
        return estimate_memory(self)

    # -- resolved values ----------------------------------------------------------------
    @property
    def kind(self) -> SubjectKind:
        """The kind of subject this run names (``subjects.kinds``): its flags, defaults and preflight."""
        from attn_export.subjects.kinds import kind_of

        return kind_of(self)

    @property
    def is_checkpoint(self) -> bool:
        """Whether the subject comes from ``--checkpoint``: decides which flags apply, never how a stage runs."""
        return self.checkpoint is not None

    @staticmethod
    def _layer_default(name: str) -> Any:
        """The reference layer's default for flag ``name`` (``subjects.kinds``)."""
        from attn_export.subjects.kinds import KINDS

        return KINDS["layer"].defaults[name]

    @property
    def resolved_layer(self) -> str:
        return self.layer or str(self._layer_default("layer"))

    @property
    def resolved_d_model(self) -> int:
        return int(self.d_model if self.d_model is not None else self._layer_default("d_model"))

    @property
    def resolved_heads(self) -> int:
        return int(self.heads if self.heads is not None else self._layer_default("heads"))

    @property
    def resolved_mask(self) -> str:
        return self.mask or str(self._layer_default("mask"))

    @property
    def resolved_layers(self) -> str:
        return self.layers or "all"

    @property
    def resolved_max_len(self) -> int:
        from attn_export.subjects.kinds import KINDS

        return int(self.max_len if self.max_len is not None else KINDS["encoder"].defaults["max_len"])

    @property
    def resolved_max_texts(self) -> int:
        from attn_export.subjects.kinds import KINDS

        return int(self.max_texts if self.max_texts is not None else KINDS["encoder"].defaults["max_texts"])

    @property
    def resolved_languages(self) -> tuple[str, ...] | None:
        return tuple(s.strip() for s in self.languages.split(",") if s.strip()) if self.languages else None

    @property
    def resolved_low_rank_targets(self) -> tuple[str, ...]:
        text = self.low_rank_targets if self.low_rank_targets is not None else str(self.kind.defaults["low_rank_targets"])
        return tuple(t.strip() for t in text.split(",") if t.strip())

    @property
    def resolved_calib_method(self) -> str:
        return self.calib_method or str(self.kind.defaults["calib_method"])

    @property
    def resolved_smoothquant(self) -> float | str | None:
        """The SmoothQuant alpha of both int8 ONNX routes: a number, ``auto`` (searched) or None (off)."""
        if self.smoothquant == "none":
            return None
        if self.smoothquant is not None:
            return self.smoothquant
        return self.kind.defaults["smoothquant"]  # type: ignore[no-any-return]

    @property
    def compresses(self) -> bool:
        return self.low_rank is not None or self.quantize is not None

    @property
    def target_info(self) -> Target:
        from attn_export.targets.targets import get_target

        return get_target(self.target)

    @property
    def max_seq_len(self) -> int:
        """The longest sequence the deployment expects: the largest ``--length-buckets``, else ``--max-shape``'s when given,
        else ``--seq-len``."""
        buckets = getattr(self.engine, "length_buckets", None)
        if buckets:
            return int(buckets[-1])
        profiles = getattr(self.engine, "profiles", None)
        return int(profiles.max[1]) if profiles is not None else int(self.seq_len)

    @property
    def resolved_threads(self) -> int:
        return self.threads or os.cpu_count() or 1

    @property
    def resolved_gpu_arch(self) -> str | None:
        """The GPU architecture an engine is built for: ``--gpu-arch``, else the one the Jetson release's JetPacks run on (10.3: sm87), else unknown (None)."""
        from attn_export.targets.gpu_arch import default_arch, parse_gpu_arch

        target = self.target_info
        return parse_gpu_arch(self.gpu_arch) if self.gpu_arch is not None else default_arch(target.needs_jetpack, self.trt_version or target.trt_version)

    @property
    def resolved_trt_version(self) -> str | None:
        """``--trt-version``, else the target's; a Jetson target whose own release no JetPack ships for ``--gpu-arch`` takes the newest that does (Thor: 10.16)."""
        from attn_export.targets.gpu_arch import jetson_release

        target = self.target_info
        if not target.trt_releases:
            return None
        return self.trt_version or (jetson_release(self.gpu_arch, str(target.trt_version)) if target.needs_jetpack else target.trt_version)

    def export_spec(self, precision: str | None = None):  # type: ignore[no-untyped-def]
        """The ONNX export for this run's target (explicit --attention/--opset win over the target's)."""
        from attn_export.targets.targets import export_spec_for

        overrides: dict[str, object] = {}
        if self.attention not in (None, "auto"):
            overrides["attention"] = self.attention
        if self.opset is not None:
            overrides["opset"] = self.opset
        if "attention" in overrides and "opset" not in overrides:
            overrides["opset"] = None  # let the form pick its opset
        return export_spec_for(self.target_info, precision or self.precision, trt_version=self.resolved_trt_version, **overrides)

    def engine_spec(self, precision: str):  # type: ignore[no-untyped-def]
        """The engine options, built in ``precision`` (the plan decides it: ``Plan.engine_precision``);
        the default profile covers 1x1 .. 4x the run's shapes."""
        import dataclasses

        from attn_export.runtime.tensorrt.spec import EngineSpec, ShapeProfile

        spec = self.engine or EngineSpec(precision=precision)
        if spec.profiles is None:  # type: ignore[attr-defined]
            opt = (self.batch, self.seq_len)
            spec = dataclasses.replace(spec, profiles=ShapeProfile((1, 1), opt, (4 * self.batch, 4 * self.seq_len)))  # type: ignore[type-var]
        if spec.precision != precision:  # type: ignore[attr-defined]
            spec = dataclasses.replace(spec, precision=precision)  # type: ignore[type-var]
        if self.target_info.gpu_archs and spec.gpu_arch != self.resolved_gpu_arch:  # type: ignore[attr-defined]
            spec = dataclasses.replace(spec, gpu_arch=self.resolved_gpu_arch)  # type: ignore[type-var]
        return spec

    def to_dict(self) -> dict[str, object]:
        """The options as given (for run.json and recipes)."""
        out: dict[str, object] = {}
        for f in fields(self):
            value = getattr(self, f.name)
            out[f.name] = str(value) if isinstance(value, Path) else (repr(value) if f.name == "engine" and value is not None else value)
        return out


def run_default(name: str) -> Any:
    """``RunConfig``'s default for the option ``name``: the commands' signatures take their defaults from
    here, so one edit changes the library and the CLI (``tests/test_flags.py`` holds every option to it)."""
    for f in fields(RunConfig):
        if f.name == name:
            return f.default_factory() if f.default is MISSING and f.default_factory is not MISSING else f.default
    raise KeyError(f"RunConfig has no option {name!r}")  # a programming error in a command's signature, not user input
