"""GPU check for the default layer: TensorRT fp16/int8 engines vs eager CUDA and torch SDPA.

Run on a machine with a CUDA GPU (``python bench/gpu_check.py``); it prints one table:
eager CUDA fp32 (the reference), eager fp16, torch SDPA fp16, and, when ``tensorrt`` is
importable, fp16 and int8 engines with their accuracy against eager fp32, whether attention
fused into an MHA kernel, and latency p50/p90 in ms with the speedup over eager fp32; then an fp16
engine with length-bucketed profiles, run at four lengths (the profile each ran on, its cosine). All
variants are timed in one process, round-robin on the same inputs (``time_runners``), with
host<->device copies included for every runner. Each engine's attestation (what the inspector
says it runs) is printed after its build; the fp16 engine is judged against golden outputs
recorded on ONNX Runtime CPU and on this GPU; an fp16 engine with length-bucketed profiles is
checked at four lengths. Budget: under 5 minutes on one GPU.

Without TensorRT it runs the rest and says so; without a GPU it runs the static TensorRT
check of the exported models and says which parts it skipped. Exit status 1 when an
accuracy check fails.
"""

from __future__ import annotations

import argparse
import importlib.util
import logging
import sys
import tempfile
import time
import traceback
from pathlib import Path

import numpy as np
import torch

from attn_export.checks.trt_compat import check_trt_compat
from attn_export.export import example_inputs_for, export_onnx
from attn_export.targets.targets import export_spec_for
from attn_export.layers import MaskedLayer, build_layer
from attn_export.runtime import EagerRunner
from attn_export.runtime.tensorrt.spec import ShapeProfile, parse_trt_version
from attn_export.validate import accuracy, time_runners, tolerance_for

log = logging.getLogger("gpu_check")


def _row(name: str, precision: str, lat, base_p50: float | None, acc, tol_ok: bool | None, fused: str) -> list[str]:  # type: ignore[no-untyped-def]
    p50 = f"{lat.p50:.3f}" if lat else "-"
    p90 = f"{lat.p90:.3f}" if lat else "-"
    speed = f"{base_p50 / lat.p50:.2f}x" if lat and base_p50 else "-"
    a = f"{acc.max_abs:.2e} {acc.rel_l2:.2e} {acc.cosine:.6f}" if acc else "-"
    ok = {True: "PASS", False: "FAIL", None: "-"}[tol_ok]
    return [name, precision, p50, p90, speed, a, fused, ok]


def _print_table(rows: list[list[str]]) -> None:
    head = ["variant", "prec", "p50 ms", "p90 ms", "vs fp32", "max_abs rel_l2 cosine", "attn fused", "ok"]
    widths = [max(len(r[i]) for r in [head, *rows]) for i in range(len(head))]
    for r in [head, ["-" * w for w in widths], *rows]:
        print("  ".join(c.ljust(w) for c, w in zip(r, widths)))


def static_checks(layer: MaskedLayer, work: Path, profile: ShapeProfile) -> None:
    """What runs on any machine: export per TensorRT target and check it statically."""
    for target, version in (("tensorrt", "10.14"), ("jetson", "10.3")):
        path = work / f"{target}-fp16.onnx"
        export_onnx(layer, path, export_spec_for(target, "fp16"))
        report = check_trt_compat(path, version, profile, "fp16")
        print(str(report).splitlines()[0], "->", "OK" if report else "ERRORS")
        for f in report.errors + report.warnings:
            print("   ", f)


def build_trt(layer: MaskedLayer, work: Path, precision: str, profile: ShapeProfile, feed: dict) -> tuple[object, str]:  # type: ignore[type-arg]
    import tensorrt as trt

    from attn_export.runtime.tensorrt import EngineFromPath, EngineSpec, TrtRunner, build_engine

    target = "tensorrt" if parse_trt_version(trt.__version__) >= parse_trt_version("10.14") else "jetson"
    onnx_path = work / f"{target}-{precision}.onnx"
    export_onnx(layer, onnx_path, export_spec_for(target, precision))
    if precision == "int8":
        from attn_export.compress.calib.data import ActivationSet
        from attn_export.compress.quant.static import quantize_static_onnx

        rng = np.random.default_rng(1)
        x = rng.standard_normal((32, feed["x"].shape[1], feed["x"].shape[2])).astype(np.float32)
        q_path = work / f"{target}-int8-qdq.onnx"
        quantize_static_onnx(onnx_path, q_path, ActivationSet(x, np.ones(x.shape[:2], np.int32)))
        onnx_path = q_path
    spec = EngineSpec(precision=precision, profiles=profile, workspace_bytes=4 << 30, timing_cache=str(work / "timing.cache"),
                      strongly_typed=True if target == "tensorrt" else None)
    from attn_export.pipeline.deploy import planned_gemms
    from attn_export.runtime.tensorrt.attest import Attestation

    result = build_engine(onnx_path, work / f"{target}-{precision}.engine", spec, gemms=planned_gemms(onnx_path, precision))
    print(f"  {result.describe()}" + "".join(f"\n  warning: {w}" for w in result.warnings))
    print("".join(f"  {line}\n" for line in Attestation.from_dict(result.attestation).report_lines()), end="")  # what the engine runs
    return TrtRunner(EngineFromPath(result.engine_path), name=f"tensorrt-{precision}"), f"{result.attention_fused}/{result.attention_blocks}"


def bucket_check(layer: MaskedLayer, work: Path, profile: ShapeProfile, reference: EagerRunner, batch: int) -> bool:
    """An fp16 engine with one profile per length bucket (TensorRT 10.x's answer to padding, docs/targets.md): each
    batch length runs on the smallest profile holding it and matches eager fp32 at fp16's tolerance. False on a miss."""
    import tensorrt as trt

    from attn_export.runtime.tensorrt import EngineFromPath, EngineSpec, TrtRunner, build_engine

    target = "tensorrt" if parse_trt_version(trt.__version__) >= parse_trt_version("10.14") else "jetson"
    onnx_path = work / f"{target}-fp16-buckets.onnx"
    export_onnx(layer, onnx_path, export_spec_for(target, "fp16"))
    buckets = (32, 64, 128, profile.max[1])
    spec = EngineSpec(precision="fp16", profiles=profile, workspace_bytes=4 << 30, timing_cache=str(work / "timing.cache"),
                      strongly_typed=True if target == "tensorrt" else None, length_buckets=buckets)  # fmt: skip
    result = build_engine(onnx_path, work / f"{target}-fp16-buckets.engine", spec)
    ok = True
    with TrtRunner(EngineFromPath(result.engine_path), name="tensorrt-fp16-buckets") as runner:
        for seq in (20, 50, 100, 200):
            x, kpm = example_inputs_for(layer, batch, seq, 512, torch.float32, seed=seq)
            feed = {"x": x.numpy(), "key_padding_mask": kpm.numpy()}
            acc = accuracy(reference.infer(feed)["y"], runner.infer(feed)["y"])
            miss = tolerance_for("fp16").violations(acc)
            ok &= not miss
            print(f"  length buckets {buckets}: seq {seq} ran on profile {runner.active_profile}, cosine {acc.cosine:.6f}" + (f" FAIL {miss}" if miss else ""))
    return ok


def golden_check(work: Path, feed: dict) -> bool:  # type: ignore[type-arg]
    """Golden outputs across stacks (docs/targets.md, "Golden outputs"): the fp16 ONNX model's outputs on ONNX Runtime
    CPU recorded as golden, the fp16 engine on this GPU judged against them with the subject metrics (per-row cosine,
    top-1 and recall@10 agreement), then recorded on this stack and checked again. False on a miss."""
    import tensorrt as trt

    from attn_export.deploy.golden import load_golden, record_golden, run_artifact
    from attn_export.deploy.golden_judge import GoldenThresholds, judge_golden

    target = "tensorrt" if parse_trt_version(trt.__version__) >= parse_trt_version("10.14") else "jetson"
    onnx_path, engine_path = work / f"{target}-fp16.onnx", work / f"{target}-fp16.engine"
    feeds = [{k: v[i : i + 1] for k, v in feed.items()} for i in range(len(feed["x"]))]  # one row per batch: per-text judging
    ok = True
    for artifact, folder in ((onnx_path, work / "golden-cpu"), (engine_path, work / "golden-gpu")):
        record_golden(folder, artifact, feeds, providers=["CPUExecutionProvider"] if artifact.suffix == ".onnx" else None, force=True)
        golden = load_golden(folder)
        _, outputs = run_artifact(engine_path, golden.inputs)
        verdict = judge_golden(golden.outputs, outputs, golden.meta.kinds, GoldenThresholds(**golden.meta.thresholds.model_dump()))
        ok &= verdict.passed
        stack = golden.meta.stack
        print(f"  golden from {artifact.name} ({stack.get('gpu') or stack.get('cpu_class')}): engine "
              + ("PASS" if verdict.passed else "FAIL " + "; ".join(verdict.failure_lines())))
    return ok


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--batch", type=int, default=8)
    p.add_argument("--seq", type=int, default=128)
    p.add_argument("--warmup", type=int, default=10)
    p.add_argument("--repeats", type=int, default=50)
    p.add_argument("--work", type=Path, default=None, help="keep ONNX/engines here (default: a temp dir)")
    args = p.parse_args(argv)
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    t_start = time.perf_counter()
    layer = MaskedLayer(build_layer("transformer", 512, 8, mask="padding", seed=0), "padding").eval()
    x, kpm = example_inputs_for(layer, args.batch, args.seq, 512, torch.float32, seed=0)
    feed = {"x": x.numpy(), "key_padding_mask": kpm.numpy()}
    profile = ShapeProfile((1, 16), (args.batch, args.seq), (max(args.batch, 8), max(args.seq, 256)))
    work_ctx = tempfile.TemporaryDirectory(prefix="gpu_check_") if args.work is None else None
    work = Path(work_ctx.name) if work_ctx else args.work
    work.mkdir(parents=True, exist_ok=True)
    print("static TensorRT check of the exports (no GPU needed):")
    static_checks(layer, work, profile)
    if not torch.cuda.is_available():
        print("no CUDA GPU: skipped eager CUDA fp32/fp16, torch SDPA and the TensorRT engines")
        return 0
    print(f"GPU: {torch.cuda.get_device_name(0)}, torch {torch.__version__}")
    names = layer.input_names
    fp32 = EagerRunner(layer.cuda(), names, ["y"], device="cuda", name="eager-fp32")
    ref = fp32.infer(feed)["y"]
    half_layer = MaskedLayer(build_layer("transformer", 512, 8, mask="padding", seed=0), "padding").eval().half().cuda()
    sdpa_layer = MaskedLayer(build_layer("transformer", 512, 8, mask="padding", seed=0), "padding").eval().half().cuda()
    sdpa_layer.layer.self_attn.fast = True  # F.scaled_dot_product_attention in eager
    runners = {"eager-fp32": fp32,
               "eager-fp16": EagerRunner(half_layer, names, ["y"], dtype=torch.float16, device="cuda", name="eager-fp16"),
               "sdpa-fp16": EagerRunner(sdpa_layer, names, ["y"], dtype=torch.float16, device="cuda", name="sdpa-fp16")}
    precisions = {"eager-fp32": "fp32", "eager-fp16": "fp16", "sdpa-fp16": "fp16"}
    fused = {k: "-" for k in runners}
    failed = False
    if importlib.util.find_spec("tensorrt") is None:
        print("tensorrt is not installed: skipped the TensorRT engines (pip install tensorrt cuda-python)")
    else:
        for precision in ("fp16", "int8"):
            try:
                runner, fused_text = build_trt(layer, work, precision, profile, feed)
                runners[runner.name] = runner  # type: ignore[attr-defined]
                precisions[runner.name] = precision  # type: ignore[attr-defined]
                fused[runner.name] = fused_text  # type: ignore[attr-defined]
            except Exception as err:  # keep going: the table says which build failed and why
                failed = True
                print(f"TensorRT {precision} build failed: {type(err).__name__}: {err}")
                traceback.print_exc(limit=3)
        try:
            failed |= not golden_check(work, feed)
        except Exception as err:
            failed = True
            print(f"golden outputs check failed: {type(err).__name__}: {err}")
            traceback.print_exc(limit=3)
        try:
            failed |= not bucket_check(layer, work, profile, fp32, args.batch)
        except Exception as err:
            failed = True
            print(f"TensorRT length-bucket build failed: {type(err).__name__}: {err}")
            traceback.print_exc(limit=3)
    lat = time_runners(runners, feed, warmup=args.warmup, repeats=args.repeats, batch=args.batch)
    rows = []
    for name, runner in runners.items():
        out = runner.infer(feed)
        acc = accuracy(ref, next(iter(out.values())))
        ok = None if name == "eager-fp32" else not tolerance_for(precisions[name]).violations(acc)
        failed |= ok is False
        rows.append(_row(name, precisions[name], lat[name], lat["eager-fp32"].p50, acc, ok, fused[name]))
    _print_table(rows)
    for r in runners.values():
        r.deactivate()
    print(f"total {time.perf_counter() - t_start:.0f} s")
    if work_ctx:
        work_ctx.cleanup()
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
