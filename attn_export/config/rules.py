"""The rules a ``RunConfig`` is held to: bounded numbers and the combinations of options that mean something.

Split from ``config`` so the config keeps what a run *is* (its fields and resolved values)
and this module what a run may *not* be. ``cfg`` is the ``RunConfig`` being validated (typed
``Any``: this module is imported by ``config`` and must not import it back).
"""

from __future__ import annotations

from typing import Any

from attn_export.errors import ConfigError
from attn_export.host.memory import MAX_BYTES
from attn_export.vocab.choices import INT8_QAT_SCALES, is_ascii_digits

__all__ = ["LIMITS", "MIN_MAX_LEN", "check_combinations", "check_numbers"]

# Upper bounds that keep a typo from allocating the machine away or running for days.
LIMITS = {"d_model": 16384, "heads": 256, "seq_len": 65536, "batch": 4096, "repeats": 10000, "warmup": 1000, "threads": 1024,
          "distill": 100000, "max_len": 8192, "max_texts": 100000, "seed": 2**32 - 1}  # fmt: skip
# --max-len below this leaves [CLS] [SEP] and a token or two: every text a near-tie, and neighbour agreement meaningless.
MIN_MAX_LEN = 8


def check_numbers(cfg: Any) -> None:
    """Every number is an integer (or a ratio) within ``LIMITS``; normalizes ``--smoothquant`` and ``--int8-fallback``."""
    for name in ("seq_len", "batch", "repeats", "validation_batches"):
        _int_in(name, getattr(cfg, name), 1, LIMITS.get(name, 2**31))
    _int_in("warmup", cfg.warmup, 0, LIMITS["warmup"])
    _int_in("seed", cfg.seed, 0, LIMITS["seed"])
    if cfg.threads is not None:
        _int_in("threads", cfg.threads, 1, LIMITS["threads"])
    if cfg.d_model is not None:
        _int_in("d_model", cfg.d_model, 1, LIMITS["d_model"])
    if cfg.heads is not None:
        _int_in("heads", cfg.heads, 1, LIMITS["heads"])
    if cfg.max_len is not None:
        _int_in("max_len", cfg.max_len, 1, LIMITS["max_len"])
        if cfg.max_len < MIN_MAX_LEN:
            raise ConfigError(f"expected --max-len >= {MIN_MAX_LEN}, got {cfg.max_len}: texts cut to {cfg.max_len} tokens (special tokens "
                              "included) are near-ties that any export matches; use --max-len 64")  # fmt: skip
    if cfg.max_texts is not None:
        _int_in("max_texts", cfg.max_texts, 8, LIMITS["max_texts"])
    if cfg.distill is not None:
        _int_in("distill", cfg.distill, 1, LIMITS["distill"])
    if cfg.low_rank is not None and not (isinstance(cfg.low_rank, (int, float)) and 0.0 < float(cfg.low_rank) < 1.0):
        raise ConfigError(f"expected --low-rank RATIO in (0, 1), got {cfg.low_rank}; use e.g. --low-rank 0.5")
    if isinstance(cfg.smoothquant, str) and cfg.smoothquant.strip().lower() not in ("auto", "none"):
        try:
            cfg.smoothquant = float(cfg.smoothquant)
        except ValueError:
            raise ConfigError(f"expected --smoothquant ALPHA in [0, 1], auto or none, got {cfg.smoothquant!r}; use auto") from None
    if isinstance(cfg.smoothquant, str):
        cfg.smoothquant = cfg.smoothquant.strip().lower()
    elif cfg.smoothquant is not None and not (isinstance(cfg.smoothquant, (int, float)) and 0.0 <= float(cfg.smoothquant) <= 1.0):
        raise ConfigError(f"expected --smoothquant ALPHA in [0, 1], auto or none, got {cfg.smoothquant}; use auto")
    cfg.int8_fallback = _parse_fallback(cfg.int8_fallback)
    if cfg.int8_qat is not None:
        _int_in("int8_qat", cfg.int8_qat, 1, LIMITS["distill"])
    if cfg.int8_qat_scales not in INT8_QAT_SCALES:
        raise ConfigError(f"expected --int8-qat-scales {'|'.join(INT8_QAT_SCALES)}, got {cfg.int8_qat_scales!r}")
    if cfg.max_memory is not None:
        _int_in("max_memory", cfg.max_memory, 1, MAX_BYTES)


def check_combinations(cfg: Any) -> None:
    """Options that only mean something together, or never do (one line naming both flags)."""
    target = cfg.target_info
    if cfg.distill is not None and cfg.low_rank is None:
        raise ConfigError("--distill trains a compressed student; add --low-rank RATIO")
    if cfg.calib is not None and not cfg.compresses:
        raise ConfigError("--calib is used by --low-rank/--distill/--quantize; add one of them or drop --calib")
    if cfg.quantize is None:
        for flag, value, default in (("--int8-mode", cfg.int8_mode, "auto"), ("--int8-encoding", cfg.int8_encoding, "auto"),
                                     ("--with-torchao", cfg.with_torchao, False), ("--smoothquant", cfg.smoothquant, None),
                                     ("--int8-fallback", cfg.int8_fallback, "auto"), ("--int8-qat", cfg.int8_qat, None),
                                     ("--int8-qat-scales", cfg.int8_qat_scales, "learned")):  # fmt: skip
            if value != default:
                raise ConfigError(f"{flag} configures int8; add --quantize int8 or drop {flag}")
    from attn_export.targets.targets import DEFAULT_TARGET, get_target, targets_with

    if cfg.bundle is not None and "bundle" not in target.deploys:
        raise ConfigError(f"--bundle writes a Jetson bundle; add --target {' or '.join(_deploying('bundle'))} (got --target {cfg.target})")
    if cfg.triton_config is not None and (cfg.triton is None or not cfg.build_engine):
        raise ConfigError("--triton-config describes the TensorRT plan of a Triton repository; add --triton DIR and --build-engine, or drop it")
    if getattr(cfg.engine, "length_buckets", ()):
        # the profiles are added with the TensorRT Python API (runtime/tensorrt/build.py); the bundle's build_engine.sh
        # (trtexec) and the TensorRT EP build one profile from --min/--opt/--max-shape
        if "engine" not in target.deploys:
            raise ConfigError(f"--length-buckets builds one engine profile per bucket; use --target {' or '.join(_deploying('engine'))} "
                              f"(got --target {cfg.target}, which builds one profile)")  # fmt: skip
        longest, flag = (cfg.resolved_max_len, "--max-len") if cfg.is_checkpoint else (cfg.seq_len, "--seq-len")
        if cfg.engine.length_buckets[-1] < longest:
            raise ConfigError(f"the largest --length-buckets {cfg.engine.length_buckets[-1]} cannot hold texts of {flag} {longest} tokens; "
                              f"add a bucket >= {longest} or lower {flag}")  # fmt: skip
        if cfg.bundle is not None:
            raise ConfigError("--length-buckets builds its profiles with --build-engine; the Jetson bundle's build_engine.sh builds one "
                              "profile: drop --length-buckets or --bundle")  # fmt: skip
    if cfg.accept_engine_mismatch and not cfg.build_engine:
        raise ConfigError("--accept-engine-mismatch accepts what the built engine's attestation finds; add --build-engine or drop it")
    if cfg.build_engine and "engine" not in target.deploys:
        raise ConfigError(f"--build-engine needs a TensorRT target; use --target {' or '.join(_deploying('engine'))} (got {cfg.target})")
    if cfg.trt_version is not None and not target.trt_releases:
        raise ConfigError(f"--trt-version applies to TensorRT targets; use --target {' or '.join(targets_with('trt_releases'))} (got {cfg.target})")
    if target.trt_releases:
        _check_release(cfg, target)
        if cfg.encoder_form == "packed" and (why := target.packed_refusal(cfg.trt_version, cfg.quantize)):  # the target's route policy
            raise ConfigError(why)
    if cfg.gpu_arch is not None and not target.gpu_archs:
        raise ConfigError(f"--gpu-arch names the GPU a TensorRT engine is built for; use --target {' or '.join(targets_with('gpu_archs'))} "
                          f"(got {target.name})")  # fmt: skip
    if cfg.gpu_arch is not None and (arch := cfg.resolved_gpu_arch) not in target.gpu_archs:  # parses it: an unknown name lists the known ones
        others = [t for t in targets_with("gpu_archs") if arch in get_target(t).gpu_archs]
        raise ConfigError(f"--target {target.name} does not cover --gpu-arch {arch} (it covers {', '.join(target.gpu_archs)}); "
                          f"use --target {' or '.join(others) or DEFAULT_TARGET}")  # fmt: skip
    _check_float_precision(cfg, target)
    if cfg.quantize and cfg.quantize != "auto":
        _check_precision(cfg, target)
    if cfg.int8_qat is not None and cfg.int8_mode not in ("auto", "static"):
        raise ConfigError(f"--int8-qat refines the static int8 route; drop --int8-mode {cfg.int8_mode} or --int8-qat")
    if cfg.int8_qat_scales != "learned" and cfg.int8_qat is None:
        raise ConfigError("--int8-qat-scales configures QAT-lite; add --int8-qat STEPS or drop --int8-qat-scales")
    if cfg.int8_mode == "torchao" and cfg.with_torchao:
        raise ConfigError("--int8-mode torchao already runs the torchao route; drop --with-torchao")
    if cfg.engine is not None and cfg.engine.dla_core is not None and cfg.precision == "fp32" and cfg.quantize in (None, "none"):
        # the plan builds a float graph's engine in --precision (Plan.engine_precision): fp32 here, which DLA lacks
        raise ConfigError("DLA runs fp16 or int8 only, got --precision fp32; use --precision fp16 with --dla-core")
    if cfg.engine is not None and not target.trt_releases:
        from attn_export.runtime.tensorrt.spec import EngineSpec

        if cfg.engine != EngineSpec(precision=cfg.engine.precision):
            raise ConfigError(f"the TensorRT engine options apply to --target {' or '.join(targets_with('trt_releases'))} (got --target {cfg.target})")


def _deploying(step: str) -> list[str]:
    """The targets that run deploy ``step`` (what a refusal of ``--bundle``/``--build-engine`` offers)."""
    from attn_export.targets.targets import TARGETS

    return [t.name for t in TARGETS.values() if step in t.deploys]


def _check_release(cfg: Any, target: Any) -> None:
    """``--trt-version``: a release the toolkit's tables know and the target has a build of; an explicit ``--opset`` its parser reads."""
    row = target.release(cfg.trt_version)
    if target.needs_jetpack and cfg.trt_version is not None and cfg.gpu_arch is not None:
        _check_jetpack_pair(cfg, target, row)
    if cfg.opset is not None and cfg.opset > row.max_opset:
        raise ConfigError(f"expected --opset <= {row.max_opset} for TensorRT {row.version} (its ONNX parser takes at most opset {row.max_opset}), "
                          f"got --opset {cfg.opset}; use --opset {row.max_opset} or a newer --trt-version")  # fmt: skip


def _check_jetpack_pair(cfg: Any, target: Any, row: Any) -> None:
    """``--gpu-arch`` with ``--trt-version`` on a Jetson target: some JetPack ships that release for that GPU (the
    JetPack table, ``targets.trt_releases.JETPACKS``: 10.13 is Thor's only); else refused naming the ones that do."""
    from attn_export.targets.trt_releases import RELEASES, jetson_archs

    arch = cfg.resolved_gpu_arch
    if arch not in target.gpu_archs or arch in jetson_archs(row.version):  # an arch the target lacks: refused later
        return
    rows = [r for v, r in RELEASES.items() if r.jetpack and v in target.trt_releases and arch in jetson_archs(v)]
    raise ConfigError(
        f"--target {target.name} --gpu-arch {arch}: no JetPack ships TensorRT {row.version} for {arch}; the JetPack "
        f"releases for {arch} are TensorRT {', '.join(r.label for r in rows)}; use --trt-version with one of those"
    )


def _check_float_precision(cfg: Any, target: Any) -> None:
    """``--precision P``: a runtime of the target runs P (its ``Precision.runtimes``) and, where some GPUs lack P,
    the GPU named by ``--gpu-arch`` has it in the architecture table; refused before any work otherwise."""
    from attn_export.vocab.precisions import PRECISIONS

    p = PRECISIONS[cfg.precision]
    runtime = target.runtime
    others = [q.name for q in PRECISIONS.values() if q.export_float and runtime in q.runtimes and q.bits < 32]
    if runtime not in p.runtimes:
        raise ConfigError(f"--precision {p.name} runs on {' or '.join(p.runtimes)} only, got --target {target.name} ({runtime}); "
                          f"use --precision {' or '.join(others) or 'fp32'}, or a target on {p.runtimes[0]}")  # fmt: skip
    if not (target.gpu_archs and p.arch_column):
        return
    from attn_export.targets.gpu_arch import ARCHS, archs_with, require_precision

    have = archs_with(p.name)
    arch = cfg.resolved_gpu_arch
    if arch is None and len(have) < len(ARCHS):
        raise ConfigError(f"--precision {p.name} needs the GPU it runs on: pass --gpu-arch ({', '.join(have)} have it), "
                          f"or use --precision {' or '.join(q for q in others if len(archs_with(q)) == len(ARCHS)) or 'fp32'}")  # fmt: skip
    if arch is not None and len(have) < len(ARCHS):
        require_precision(arch, p.name, cfg.resolved_trt_version)


def _check_precision(cfg: Any, target: Any) -> None:
    """An explicit ``--quantize P`` (and ``--int8-mode R``) the target and its GPU can deploy, refused before any work otherwise."""
    from attn_export.compress.registry import methods
    from attn_export.targets.gpu_arch import ARCHS, archs_with

    routes = [m for m in methods("route") if m.precision == cfg.quantize and (cfg.int8_mode == "auto" or m.route == cfg.int8_mode)]
    if not routes:
        raise ConfigError(f"--quantize {cfg.quantize} has no route {cfg.int8_mode!r}; use --int8-mode auto")
    deployable = [m for m in routes if m.produces == "eager" or not m.deploy_refusal(target)]
    if not deployable:
        raise ConfigError(f"--quantize {cfg.quantize}{'' if cfg.int8_mode == 'auto' else ' --int8-mode ' + cfg.int8_mode} cannot target "
                          f"{target.name}: {routes[0].deploy_refusal(target)}")  # fmt: skip
    if cfg.int8_mode != "auto" and routes[0].produces != "eager" and routes[0].deploy_refusal(target):
        raise ConfigError(f"--int8-mode {cfg.int8_mode} cannot target {target.name}: {routes[0].deploy_refusal(target)}")
    if target.gpu_archs and len(archs_with(cfg.quantize)) < len(ARCHS):  # some GPUs lack it (FP8): the named one must have it
        from attn_export.targets.gpu_arch import require_precision

        arch = cfg.resolved_gpu_arch
        if arch is None:
            raise ConfigError(f"--quantize {cfg.quantize} needs the GPU it runs on: pass --gpu-arch ({', '.join(archs_with(cfg.quantize))} have it), "
                              "or use --quantize auto")  # fmt: skip
        require_precision(arch, cfg.quantize, cfg.resolved_trt_version)


def _parse_fallback(value: object) -> str | int:
    """``--int8-fallback``: ``auto`` | ``none`` | N (GEMM groups kept in float)."""
    if isinstance(value, bool):
        raise ConfigError(f"expected --int8-fallback auto|none|N, got {value!r}; use auto")
    text = str(value).strip().lower()
    if text in ("auto", "none"):
        return text
    if not is_ascii_digits(text):
        raise ConfigError(f"expected --int8-fallback auto|none|N (N in ASCII digits), got {value!r}; use auto (keeps in float only what the tolerance needs)")
    return int(text)


def _int_in(name: str, value: object, lo: int, hi: int) -> None:
    flag = f"--{name.replace('_', '-')}"
    if isinstance(value, bool) or not isinstance(value, int):
        raise ConfigError(f"expected {flag} to be an integer, got {value!r}")
    if not lo <= value <= hi:
        raise ConfigError(f"expected {flag} in [{lo}, {hi}], got {value}")
