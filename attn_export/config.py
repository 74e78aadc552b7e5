"""``RunConfig``: every option of one run, validated before any model is built.

One config drives both kinds of subject (a reference layer, or a pretrained checkpoint) and
every command that runs the pipeline (the main command, ``encoder``, ``sweep``'s points).
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
properties, so "not given" and "given the default value" can be told apart.
"""

from __future__ import annotations

import logging
import os
from dataclasses import dataclass, field, fields
from pathlib import Path

from attn_export.errors import ConfigError
from attn_export.vocabulary import (
    CALIB_METHODS,
    CPU_INT8_ENCODINGS,
    INT8_MODES,
    LOW_RANK_METHODS,
    LOW_RANK_TARGET_NAMES,
)

__all__ = [
    "CALIB_CHOICES",
    "LAYER_DEFAULTS",
    "ENCODER_DEFAULTS",
    "LIMITS",
    "MemoryEstimate",
    "RunConfig",
    "available_memory",
    "format_bytes",
]

log = logging.getLogger(__name__)

# What the reference layer and a checkpoint use when a flag is not given.
LAYER_DEFAULTS = {"layer": "transformer", "d_model": 512, "heads": 8, "mask": "padding", "low_rank_targets": "q,k,v,o", "calib_method": "minmax",
                  "smoothquant": None}  # fmt: skip
# MiniLM: Q/K carry the low-rank budget (V/O/FFN cost more accuracy than they save); percentile
# calibration after a searched SmoothQuant keeps both int8 routes closest on real text
# (docs/quantization.md: static 0.978 -> 0.997, dynamic 0.991 -> 0.997 mean cosine).
ENCODER_DEFAULTS = {"layers": "all", "max_len": 64, "max_texts": 320, "low_rank_targets": "q,k", "calib_method": "percentile", "smoothquant": "auto"}
# --calib-method: a global method, or per-tensor (each activation the method that quantizes it best)
CALIB_CHOICES: tuple[str, ...] = (*CALIB_METHODS, "per-tensor")
# Upper bounds that keep a typo from allocating the machine away or running for days.
LIMITS = {"d_model": 16384, "heads": 256, "seq_len": 65536, "batch": 4096, "repeats": 10000, "warmup": 1000, "threads": 1024,
          "distill": 100000, "max_len": 8192, "max_texts": 100000, "seed": 2**32 - 1}  # fmt: skip
DISTILL_DEFAULT_STEPS = 200  # ``--distill`` alone


@dataclass
class RunConfig:
    """One run of the pipeline. See ``attn-export --help`` for each option's meaning."""

    # subject: a checkpoint, or a reference layer
    checkpoint: str | None = None
    layers: str | None = None
    max_len: int | None = None
    max_texts: int | None = None
    languages: str | None = None
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
    # deployment
    target: str = "ort-cpu"
    trt_version: str | None = None
    engine: object | None = None  # runtime.trt_spec.EngineSpec; typed loosely to keep this module light
    build_engine: bool = False
    bundle: Path | None = None
    triton: Path | None = None
    # output
    out: Path = field(default_factory=lambda: Path("attn-export-out"))
    render: bool = True
    # resources: the memory budget the estimate is held to (None: what the machine has free)
    max_memory: int | None = None

    def __post_init__(self) -> None:
        self.out = Path(self.out)
        self._check_numbers()
        self._check_subject_flags()
        self._check_choices()
        self._check_combinations()
        self.export_spec()  # attention / opset / precision agree with the target

    # -- validation ---------------------------------------------------------------------
    def _check_numbers(self) -> None:
        for name in ("seq_len", "batch", "repeats", "validation_batches"):
            _int_in(name, getattr(self, name), 1, LIMITS.get(name, 2**31))
        _int_in("warmup", self.warmup, 0, LIMITS["warmup"])
        _int_in("seed", self.seed, 0, LIMITS["seed"])
        if self.threads is not None:
            _int_in("threads", self.threads, 1, LIMITS["threads"])
        if self.d_model is not None:
            _int_in("d_model", self.d_model, 1, LIMITS["d_model"])
        if self.heads is not None:
            _int_in("heads", self.heads, 1, LIMITS["heads"])
        if self.max_len is not None:
            _int_in("max_len", self.max_len, 2, LIMITS["max_len"])
        if self.max_texts is not None:
            _int_in("max_texts", self.max_texts, 8, LIMITS["max_texts"])
        if self.distill is not None:
            _int_in("distill", self.distill, 1, LIMITS["distill"])
        if self.low_rank is not None and not (isinstance(self.low_rank, (int, float)) and 0.0 < float(self.low_rank) < 1.0):
            raise ConfigError(f"expected --low-rank RATIO in (0, 1), got {self.low_rank}; use e.g. --low-rank 0.5")
        if isinstance(self.smoothquant, str) and self.smoothquant.strip().lower() not in ("auto", "none"):
            try:
                self.smoothquant = float(self.smoothquant)
            except ValueError:
                raise ConfigError(f"expected --smoothquant ALPHA in [0, 1], auto or none, got {self.smoothquant!r}; use auto") from None
        if isinstance(self.smoothquant, str):
            self.smoothquant = self.smoothquant.strip().lower()
        elif self.smoothquant is not None and not (isinstance(self.smoothquant, (int, float)) and 0.0 <= float(self.smoothquant) <= 1.0):
            raise ConfigError(f"expected --smoothquant ALPHA in [0, 1], auto or none, got {self.smoothquant}; use auto")
        self.int8_fallback = _parse_fallback(self.int8_fallback)
        if self.int8_qat is not None:
            _int_in("int8_qat", self.int8_qat, 1, LIMITS["distill"])
        if self.int8_qat_scales not in ("learned", "frozen"):
            raise ConfigError(f"expected --int8-qat-scales learned|frozen, got {self.int8_qat_scales!r}")
        if self.max_memory is not None:
            _int_in("max_memory", self.max_memory, 1, 2**60)

    def _check_subject_flags(self) -> None:
        if self.is_checkpoint:
            given = [f"--{n.replace('_', '-')}" for n in ("layer", "d_model", "heads", "mask") if getattr(self, n) is not None]
            if given:
                raise ConfigError(
                    f"{given[0]} picks a reference layer, but --checkpoint {self.checkpoint} brings its own architecture "
                    f"(config.json); drop {', '.join(given)}"
                )
            layers = self.resolved_layers.strip().lower()
            if layers != "all" and not layers.isdigit():
                raise ConfigError(f"expected --layers all or a layer index N, got {self.layers!r}")
            if self.calib is not None and Path(self.calib).suffix.lower() not in (".txt", ""):
                raise ConfigError(
                    f"--calib {self.calib}: a checkpoint calibrates on text; pass a UTF-8 .txt file with one text per line "
                    "(activation files .npz/.npy/.safetensors are for reference layers)"
                )
        else:
            given = [f"--{n.replace('_', '-')}" for n in ("layers", "max_len", "max_texts", "languages") if getattr(self, n) is not None]
            if given:
                raise ConfigError(f"{given[0]} applies to a --checkpoint run; add --checkpoint DIR|minilm or drop {', '.join(given)}")
            if self.calib is not None and Path(self.calib).suffix.lower() == ".txt":
                raise ConfigError(
                    f"--calib {self.calib}: text calibrates a --checkpoint; a reference layer takes activations "
                    "(.npz/.npy/.safetensors, see attn-export calib generate)"
                )
            from attn_export.layers.projections import check_heads
            from attn_export.layers.registry import LAYER_NAMES, supported_masks  # light: no torch model built

            if self.resolved_layer not in LAYER_NAMES:
                raise ConfigError(f"unknown --layer {self.resolved_layer!r}; choose one of {', '.join(LAYER_NAMES)}")
            if self.resolved_mask not in supported_masks(self.resolved_layer):
                raise ConfigError(
                    f"layer {self.resolved_layer!r} supports --mask {'|'.join(supported_masks(self.resolved_layer))}, got {self.resolved_mask!r}"
                )
            check_heads(self.resolved_d_model, self.resolved_heads)

    def _check_choices(self) -> None:
        from attn_export.export.targets import TARGETS

        if self.target not in TARGETS:
            raise ConfigError(f"expected --target in {', '.join(TARGETS)}, got {self.target!r}")
        if self.quantize not in (None, "int8"):
            raise ConfigError(f"expected --quantize int8, got {self.quantize!r}")
        if self.int8_mode not in INT8_MODES:
            raise ConfigError(f"expected --int8-mode in {'|'.join(INT8_MODES)}, got {self.int8_mode!r}")
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

    def _check_combinations(self) -> None:
        target = self.target_info
        if self.distill is not None and self.low_rank is None:
            raise ConfigError("--distill trains a compressed student; add --low-rank RATIO")
        if self.calib is not None and not self.compresses:
            raise ConfigError("--calib is used by --low-rank/--distill/--quantize; add one of them or drop --calib")
        if self.quantize is None:
            for flag, value, default in (("--int8-mode", self.int8_mode, "auto"), ("--int8-encoding", self.int8_encoding, "auto"),
                                         ("--with-torchao", self.with_torchao, False), ("--smoothquant", self.smoothquant, None),
                                         ("--int8-fallback", self.int8_fallback, "auto"), ("--int8-qat", self.int8_qat, None),
                                         ("--int8-qat-scales", self.int8_qat_scales, "learned")):  # fmt: skip
                if value != default:
                    raise ConfigError(f"{flag} configures int8; add --quantize int8 or drop {flag}")
        if self.bundle is not None and self.target != "jetson":
            raise ConfigError(f"--bundle writes a Jetson bundle; add --target jetson (got --target {self.target})")
        if self.build_engine and not target.is_tensorrt:
            raise ConfigError(f"--build-engine needs a TensorRT target; use --target tensorrt or jetson (got {self.target})")
        if self.trt_version is not None and not target.is_tensorrt:
            raise ConfigError(f"--trt-version applies to TensorRT targets; use --target tensorrt or jetson (got {self.target})")
        if self.quantize and self.int8_mode == "dynamic" and target.is_tensorrt:
            from attn_export.compress.quant_onnx import DYNAMIC_NOT_FOR_TENSORRT

            raise ConfigError(f"--int8-mode dynamic cannot target {target.name}: {DYNAMIC_NOT_FOR_TENSORRT}")
        if self.int8_qat is not None and self.int8_mode not in ("auto", "static"):
            raise ConfigError(f"--int8-qat refines the static int8 route; drop --int8-mode {self.int8_mode} or --int8-qat")
        if self.int8_qat_scales != "learned" and self.int8_qat is None:
            raise ConfigError("--int8-qat-scales configures QAT-lite; add --int8-qat STEPS or drop --int8-qat-scales")
        if self.int8_mode == "torchao" and self.with_torchao:
            raise ConfigError("--int8-mode torchao already runs the torchao route; drop --with-torchao")
        if self.engine is not None and not target.is_tensorrt:
            defaults = self._default_engine()
            if defaults is not None and self.engine != defaults:
                raise ConfigError(f"the TensorRT engine options apply to --target tensorrt or jetson (got --target {self.target})")

    def _default_engine(self) -> object | None:
        from attn_export.runtime.tensorrt.spec import EngineSpec

        return EngineSpec(precision=self.engine.precision)  # type: ignore[attr-defined]

    def check_paths(self) -> None:
        """Refuse output and input paths that cannot work, before any model is built."""
        from attn_export.paths import check_input_file, check_output_dir, check_output_file

        check_output_dir(self.out, "--out")
        for flag, path in (("--bundle", self.bundle), ("--triton", self.triton)):
            if path is not None:
                check_output_dir(Path(path), flag)
                if Path(path).absolute() == self.out.absolute():
                    raise ConfigError(f"{flag} {path} is the --out folder; pass a folder of its own (e.g. {Path(path) / flag[2:]})")
        if self.calib is not None:
            check_input_file(Path(self.calib), "--calib", allow_dir=not self.is_checkpoint)
        timing_cache = getattr(self.engine, "timing_cache", None)
        if timing_cache:
            check_output_file(Path(timing_cache), "--timing-cache")

    def preflight(self) -> None:
        """Every check that needs the filesystem or the machine, before the first model is built:
        paths, the subject's own files (a checkpoint's config.json, the default calibration set)
        and the memory estimate against what is available (``--max-memory`` overrides it)."""
        self.check_paths()
        if self.is_checkpoint:
            self._checkpoint_config()
        elif self.compresses and self.calib is None:
            from attn_export.compress.calib_data import default_calibration_path

            default_calibration_path(self.resolved_d_model)  # DataError naming `calib generate` when none ships
        self.check_memory()

    def _checkpoint_config(self):  # type: ignore[no-untyped-def]
        """The checkpoint's EncoderConfig, read and schema-checked (no weights loaded)."""
        if getattr(self, "_encoder_config", None) is None:
            from attn_export.checkpoint.loader import read_bert_config, resolve_checkpoint
            from attn_export.layers.encoder import parse_layers

            conf = read_bert_config(resolve_checkpoint(self.checkpoint))  # type: ignore[arg-type]
            parse_layers(self.resolved_layers, conf.num_hidden_layers)
            positions = conf.max_position_embeddings
            if self.resolved_max_len > positions or self.seq_len > positions:
                raise ConfigError(
                    f"expected --max-len and --seq-len <= {positions} (the checkpoint's positions), got {self.resolved_max_len} and {self.seq_len}"
                )
            self._encoder_config = conf
        return self._encoder_config  # type: ignore[attr-defined]

    def check_memory(self) -> MemoryEstimate:
        """Refuse a run whose estimated peak memory exceeds ``--max-memory`` (default: the memory available)."""
        est = self.estimate_memory()
        budget = self.max_memory if self.max_memory is not None else available_memory()
        if budget is not None and est.total > budget:
            where = "--max-memory" if self.max_memory is not None else "available on this machine"
            raise ConfigError(
                f"expected the run to fit in memory, but it needs about {format_bytes(est.total)} ({est.describe()}) and "
                f"{format_bytes(budget)} is {where}; lower --batch/--seq-len/--d-model, or pass --max-memory SIZE to try anyway"
            )
        return est

    def estimate_memory(self) -> MemoryEstimate:
        """Peak resident memory of this run, estimated from its shapes before anything is allocated.

        weights: every copy a run holds at once (eager, the exporter's working copy, the
        serialized graph, one ONNX Runtime session per artifact); activations and attention
        scores: one forward pass, kept by every session's arena after its first run; data:
        the validation feeds with their reference and artifact outputs. Deliberately on the
        high side: refusing a run that would fit wastes a flag, starting one that cannot
        fit wastes the machine.
        """
        b, seq = self.batch, self.seq_len
        artifacts = 1 + (self.precision == "fp16") + 2 * (self.quantize is not None) + 2 * (self.low_rank is not None)
        if self.is_checkpoint:
            from attn_export.checkpoint.loader import encoder_parameter_count

            conf = self._checkpoint_config()
            d, h, ffn = conf.hidden_size, conf.num_attention_heads, conf.intermediate_size
            params = encoder_parameter_count(conf)
            scores = b * h * seq * seq * 4 * 3  # (B, H, L, L): scores, mask added, softmax
        else:
            d, h, ffn = self.resolved_d_model, self.resolved_heads, 4 * self.resolved_d_model
            params = 4 * d * d + (2 * d * ffn if self.resolved_layer == "transformer" else 0)
            layer = self.resolved_layer
            if layer == "linear":  # (B, H, L, Dh, Dh) running sums when causal, (B, H, Dh, Dh) otherwise
                scores = b * d * (d // h) * 4 * (seq if self.resolved_mask == "causal" else 1) * 2
            elif layer == "block-sparse":  # (B * L/bs, H, bs, bs) with bs = 32
                scores = b * h * seq * min(seq, 32) * 4 * 3
            else:
                scores = b * h * seq * seq * 4 * 3
        copies = 3 + artifacts
        activations = b * seq * (8 * d + ffn) * 4  # x, q/k/v, context, output, residual/norm (D each) + FFN hidden
        data = 3 * self.validation_batches * b * seq * d * 4
        return MemoryEstimate(params * 4 * copies, (activations + scores) * (1 + artifacts), data, _RUNTIME_OVERHEAD)

    # -- resolved values ----------------------------------------------------------------
    @property
    def is_checkpoint(self) -> bool:
        return self.checkpoint is not None

    @property
    def subject_kind(self) -> str:
        return "encoder" if self.is_checkpoint else "layer"

    @property
    def resolved_layer(self) -> str:
        return self.layer or str(LAYER_DEFAULTS["layer"])

    @property
    def resolved_d_model(self) -> int:
        return int(self.d_model if self.d_model is not None else LAYER_DEFAULTS["d_model"])

    @property
    def resolved_heads(self) -> int:
        return int(self.heads if self.heads is not None else LAYER_DEFAULTS["heads"])

    @property
    def resolved_mask(self) -> str:
        return self.mask or str(LAYER_DEFAULTS["mask"])

    @property
    def resolved_layers(self) -> str:
        return self.layers or str(ENCODER_DEFAULTS["layers"])

    @property
    def resolved_max_len(self) -> int:
        return int(self.max_len if self.max_len is not None else ENCODER_DEFAULTS["max_len"])

    @property
    def resolved_max_texts(self) -> int:
        return int(self.max_texts if self.max_texts is not None else ENCODER_DEFAULTS["max_texts"])

    @property
    def resolved_languages(self) -> tuple[str, ...] | None:
        return tuple(s.strip() for s in self.languages.split(",") if s.strip()) if self.languages else None

    @property
    def resolved_low_rank_targets(self) -> tuple[str, ...]:
        default = (ENCODER_DEFAULTS if self.is_checkpoint else LAYER_DEFAULTS)["low_rank_targets"]
        text = self.low_rank_targets if self.low_rank_targets is not None else str(default)
        return tuple(t.strip() for t in text.split(",") if t.strip())

    @property
    def resolved_calib_method(self) -> str:
        default = (ENCODER_DEFAULTS if self.is_checkpoint else LAYER_DEFAULTS)["calib_method"]
        return self.calib_method or str(default)

    @property
    def resolved_smoothquant(self) -> float | str | None:
        """The SmoothQuant alpha of both int8 ONNX routes: a number, ``auto`` (searched) or None (off)."""
        if self.smoothquant == "none":
            return None
        if self.smoothquant is not None:
            return self.smoothquant
        return (ENCODER_DEFAULTS if self.is_checkpoint else LAYER_DEFAULTS)["smoothquant"]  # type: ignore[return-value]

    @property
    def compresses(self) -> bool:
        return self.low_rank is not None or self.quantize is not None

    @property
    def target_info(self):  # type: ignore[no-untyped-def]
        from attn_export.export.targets import get_target

        return get_target(self.target)

    @property
    def max_seq_len(self) -> int:
        """The longest sequence the deployment expects: ``--max-shape``'s when given, else ``--seq-len``."""
        profiles = getattr(self.engine, "profiles", None)
        return int(profiles.max[1]) if profiles is not None else int(self.seq_len)

    @property
    def resolved_threads(self) -> int:
        return self.threads or os.cpu_count() or 1

    @property
    def resolved_trt_version(self) -> str | None:
        target = self.target_info
        return (self.trt_version or target.trt_version) if target.is_tensorrt else None

    def export_spec(self, precision: str | None = None):  # type: ignore[no-untyped-def]
        """The ONNX export for this run's target (explicit --attention/--opset win over the target's)."""
        from attn_export.export.targets import export_spec_for

        overrides: dict[str, object] = {}
        if self.attention not in (None, "auto"):
            overrides["attention"] = self.attention
        if self.opset is not None:
            overrides["opset"] = self.opset
        if "attention" in overrides and "opset" not in overrides:
            overrides["opset"] = None  # let the form pick its opset
        return export_spec_for(self.target_info, precision or self.precision, **overrides)

    def engine_spec(self):  # type: ignore[no-untyped-def]
        """The engine options; the default profile covers 1x1 .. 4x the run's shapes."""
        import dataclasses

        from attn_export.runtime.tensorrt.spec import EngineSpec, ShapeProfile

        precision = "int8" if self.quantize else self.precision
        spec = self.engine or EngineSpec(precision=precision)
        if spec.profiles is None:  # type: ignore[attr-defined]
            opt = (self.batch, self.seq_len)
            spec = dataclasses.replace(spec, profiles=ShapeProfile((1, 1), opt, (4 * self.batch, 4 * self.seq_len)))  # type: ignore[type-var]
        if spec.precision != precision:  # type: ignore[attr-defined]
            spec = dataclasses.replace(spec, precision=precision)  # type: ignore[type-var]
        return spec

    def to_dict(self) -> dict[str, object]:
        """The options as given (for run.json and recipes)."""
        out: dict[str, object] = {}
        for f in fields(self):
            value = getattr(self, f.name)
            out[f.name] = str(value) if isinstance(value, Path) else (repr(value) if f.name == "engine" and value is not None else value)
        return out


def _parse_fallback(value: object) -> str | int:
    """``--int8-fallback``: ``auto`` | ``none`` | N (GEMM groups kept in float)."""
    if isinstance(value, bool):
        raise ConfigError(f"expected --int8-fallback auto|none|N, got {value!r}; use auto")
    text = str(value).strip().lower()
    if text in ("auto", "none"):
        return text
    if not text.isdigit():
        raise ConfigError(f"expected --int8-fallback auto|none|N, got {value!r}; use auto (keeps in float only what the tolerance needs)")
    return int(text)


def _int_in(name: str, value: object, lo: int, hi: int) -> None:
    flag = f"--{name.replace('_', '-')}"
    if isinstance(value, bool) or not isinstance(value, int):
        raise ConfigError(f"expected {flag} to be an integer, got {value!r}")
    if not lo <= value <= hi:
        raise ConfigError(f"expected {flag} in [{lo}, {hi}], got {value}")


# Resident memory of the libraries a run loads (torch, ONNX Runtime, onnx, matplotlib) beyond the model.
_RUNTIME_OVERHEAD = 768 * 2**20


@dataclass(frozen=True)
class MemoryEstimate:
    """A run's estimated peak memory in bytes, by part."""

    weights: int
    activations: int  # activations and attention scores of one forward pass, per runner
    data: int
    overhead: int

    @property
    def total(self) -> int:
        return self.weights + self.activations + self.data + self.overhead

    def describe(self) -> str:
        parts = (("weights", self.weights), ("activations and attention scores", self.activations), ("data", self.data))
        return ", ".join(f"{name} {format_bytes(v)}" for name, v in parts)


def format_bytes(n: float) -> str:
    """1536 -> '1.5 KiB'."""
    for unit in ("B", "KiB", "MiB", "GiB", "TiB", "PiB"):
        if abs(n) < 1024 or unit == "PiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return f"{n:.1f} EiB"  # pragma: no cover - unreachable


def _read_int(path: str) -> int | None:
    try:
        with open(path, encoding="ascii") as f:
            text = f.read().strip()
    except OSError:
        return None
    return int(text) if text.isdigit() else None


def available_memory() -> int | None:
    """Bytes this process can still allocate: MemAvailable (/proc/meminfo, else sysconf), capped by
    the cgroup's limit (v2 memory.max, v1 memory.limit_in_bytes) minus its usage; None if unknown."""
    avail: int | None = None
    try:
        with open("/proc/meminfo", encoding="ascii") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    avail = int(line.split()[1]) * 1024
                    break
    except (OSError, ValueError, IndexError):
        pass
    if avail is None:
        try:
            avail = os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
        except (ValueError, OSError, AttributeError):
            avail = None
    for limit_file, usage_file in (("/sys/fs/cgroup/memory.max", "/sys/fs/cgroup/memory.current"),
                                   ("/sys/fs/cgroup/memory/memory.limit_in_bytes", "/sys/fs/cgroup/memory/memory.usage_in_bytes")):  # fmt: skip
        limit, usage = _read_int(limit_file), _read_int(usage_file)
        if limit is not None and limit < 2**60 and usage is not None:
            room = max(0, limit - usage)
            avail = room if avail is None else min(avail, room)
            break
    return avail
