#!/usr/bin/env python3
"""Gate a TensorRT engine on the device against golden outputs, and record the device's own.

Copied into every Jetson bundle as ``golden_on_device.py``, beside ``validate_on_device.py`` (the
backends and the bundle checks, reused) and ``output_agreement.py`` (the judge's arithmetic:
per-text cosine, top-1 and recall@10 neighbour agreement, label agreement; the same module
attn-export judges with on the host). Like them it needs numpy, tensorrt and cuda-python only.

Why: a JetPack, TensorRT or CUDA upgrade can change an engine's numbers with no error
(NVIDIA/TensorRT#4400, #4813), and a tolerance against eager PyTorch is too loose to see a few
texts move. So the engine's outputs on ``reference.npz``'s inputs are judged against golden ones:

* by default the bundle's ``golden.json`` (+ ``golden_stack.json``): the verified ONNX model's
  outputs, recorded when the bundle was written, on the host named in its stack;
* ``--record-golden DIR``: the engine's outputs here, once they pass the bundle's reference check,
  written with this device's stack (GPU, compute capability, TensorRT, CUDA, L4T/JetPack) as
  ``DIR/golden.json`` + ``DIR/stack.json``; ``--golden DIR`` then gates the next upgrade against
  the device's own outputs, which are far tighter than the host's.

``golden.json`` is Polygraphy ``RunResults`` JSON, as ``attn-export golden record`` writes it.
It prints both stacks, one line per output, and a ``FAIL:`` line naming the texts that moved.
Exit status: 0 pass (or recorded), 1 a regression, 2 a setup or golden error (one line), 3 only
the ONNX Runtime stand-in ran (``--allow-stand-in`` turns that into 0/1).
"""

from __future__ import annotations

import argparse
import base64
import hashlib
import io
import json
import os
import platform
import shutil
import stat
import sys

import numpy as np

__all__ = ["device_stack", "judge", "main", "read_run_results", "write_run_results"]

GOLDEN_JSON, STACK_JSON, BUNDLE_STACK_JSON = "golden.json", "stack.json", "golden_stack.json"
STACK_KEYS = ("gpu", "compute_capability", "tensorrt", "cuda", "l4t", "onnxruntime", "cpu", "host")
WORST_SHOWN = 5


class GoldenError(Exception):
    """The golden cannot be read or does not fit this bundle: one line, exit 2."""


def _siblings():  # type: ignore[no-untyped-def]
    """validate_on_device.py and output_agreement.py, shipped beside this file (imported only when run)."""
    here = os.path.dirname(os.path.abspath(__file__))
    if here not in sys.path:
        sys.path.insert(0, here)
    import output_agreement
    import validate_on_device

    return validate_on_device, output_agreement


def _polygraphy():  # type: ignore[no-untyped-def]
    try:
        from polygraphy.comparator import IterationResult, RunResults
        from polygraphy.logger import G_LOGGER
    except ImportError:
        return None
    return IterationResult, RunResults, G_LOGGER


def _decode(value: object) -> np.ndarray:
    if isinstance(value, dict) and value.get("polygraphy_class") == "LazyArray":
        value = value.get("values")
    if not isinstance(value, dict) or value.get("polygraphy_class") != "ndarray" or not isinstance(value.get("array"), str):
        raise GoldenError(f"expected a Polygraphy ndarray, got {str(value)[:80]}")
    return np.load(io.BytesIO(base64.b64decode(value["array"].encode(), validate=True)), allow_pickle=False)  # never unpickle


def read_run_results(path: str) -> dict:
    """Output name -> one array per iteration, from Polygraphy RunResults JSON holding exactly one runner."""
    poly = _polygraphy()
    try:
        if poly is not None:
            with poly[2].verbosity(poly[2].WARNING):
                runs = list(poly[1].load(path).items())
            iterations = [{k: np.asarray(it[k]) for k in it.keys()} for it in runs[0][1]] if len(runs) == 1 else None
        else:
            # hand-rolled: polygraphy may be absent on JetPack; its arrays are np.save bytes in base64 (polygraphy/json/serde.py)
            with open(path, encoding="utf-8") as f:
                runs = json.load(f)["lst"]
            iterations = [{k: _decode(v) for k, v in it["outputs"].items()} for it in runs[0][1]] if len(runs) == 1 else None
    except GoldenError:
        raise
    except Exception as err:  # a missing, truncated or foreign file: polygraphy, json, base64 and numpy each raise their own
        raise GoldenError(f"cannot read {path} as Polygraphy RunResults ({type(err).__name__}: {' '.join(str(err).split())[:200]})") from None
    if iterations is None:
        raise GoldenError(f"{path} must hold the outputs of exactly one runner, got {len(runs)}; record it again")
    if not iterations or not iterations[0]:
        raise GoldenError(f"{path} holds no outputs (its runner has {len(iterations)} iterations); record it again")
    for i, it in enumerate(iterations[1:], 1):
        if it.keys() != iterations[0].keys():
            raise GoldenError(f"{path}: iteration {i} has outputs {sorted(it)}, iteration 0 {sorted(iterations[0])}; "
                              "record it again")
    return {name: [it[name] for it in iterations] for name in iterations[0]}


def write_run_results(path: str, runner: str, outputs: dict) -> None:
    """``outputs`` (name -> array) as one iteration of Polygraphy RunResults, with polygraphy when it is importable."""
    poly = _polygraphy()
    if poly is not None:
        results = poly[1]()
        results.add([poly[0]({k: np.asarray(v) for k, v in outputs.items()}, runner_name=runner)], runner_name=runner)
        with poly[2].verbosity(poly[2].WARNING):
            results.save(path)
        return

    def encode(arr: np.ndarray) -> dict:
        buf = io.BytesIO()
        np.save(buf, np.asarray(arr), allow_pickle=False)
        return {"array": base64.b64encode(buf.getvalue()).decode(), "polygraphy_class": "ndarray"}

    iteration = {"outputs": {k: encode(v) for k, v in outputs.items()}, "runtime": None, "runner_name": runner, "polygraphy_class": "IterationResult"}
    with open(path, "w", encoding="utf-8") as f:
        json.dump({"lst": [[runner, [iteration]]], "polygraphy_class": "RunResults"}, f)


def _read_text(path: str) -> str | None:
    try:
        with open(path, encoding="utf-8", errors="replace") as f:
            return f.read().strip() or None
    except OSError:
        return None


def device_stack(backend, device: int = 0) -> dict:  # type: ignore[no-untyped-def]
    """The stack that ran ``backend`` here; JetPack is the L4T release in /etc/nv_tegra_release ("R36 ... REVISION: 4.0" = 6.1)."""
    stack = {"host": platform.node(), "cpu": platform.machine(), "l4t": _read_text("/etc/nv_tegra_release")}
    if backend.name == "tensorrt":
        prop = backend._ok(backend.rt.cudaGetDeviceProperties(device))
        name = prop.name.decode(errors="replace") if isinstance(prop.name, bytes) else str(prop.name)
        version = int(backend._ok(backend.rt.cudaRuntimeGetVersion()))  # 1000 * major + 10 * minor (CUDA Runtime API)
        stack |= {"runtime": "tensorrt", "tensorrt": str(backend.trt.__version__), "gpu": name.strip("\x00 ").strip(),
                  "compute_capability": f"{prop.major}.{prop.minor}", "cuda": f"{version // 1000}.{version % 1000 // 10}"}  # fmt: skip
    else:
        import onnxruntime

        stack |= {"runtime": "onnxruntime", "onnxruntime": onnxruntime.__version__, "providers": "CPUExecutionProvider"}
    return stack


def _stack_line(stack: dict) -> str:
    return " ".join(f"{k}={' '.join(str(stack[k]).split())[:60]}" for k in STACK_KEYS if stack.get(k))


def _load(args: argparse.Namespace, here: str) -> tuple:
    """(golden outputs, stack.json dict, where) from --golden DIR or the bundle's own golden."""
    if args.golden:
        golden, stack_path = os.path.join(args.golden, GOLDEN_JSON), os.path.join(args.golden, STACK_JSON)
    else:
        golden, stack_path = os.path.join(here, GOLDEN_JSON), os.path.join(here, BUNDLE_STACK_JSON)
    for path in (golden, stack_path):
        try:
            mode = os.stat(path).st_mode
        except FileNotFoundError:
            raise GoldenError(f"{path} does not exist; pass --golden DIR recorded by --record-golden DIR, "
                              "or rebuild the bundle") from None
        except OSError as err:
            raise GoldenError(f"{path} cannot be inspected ({err.strerror or err}); check the path") from None
        if not stat.S_ISREG(mode):  # never opened: a FIFO would block the gate
            what = "a FIFO" if stat.S_ISFIFO(mode) else "a directory" if stat.S_ISDIR(mode) else "a device or socket"
            raise GoldenError(f"{path} is {what}, not a regular file; pass a golden written by --record-golden DIR")
    try:
        with open(stack_path, encoding="utf-8") as f:
            meta = json.load(f)
    except (OSError, ValueError) as err:
        raise GoldenError(f"cannot read {stack_path} ({' '.join(str(err).split())[:200]}); record the golden again") from None
    if not isinstance(meta, dict) or not isinstance(meta.get("stack"), dict) or not isinstance(meta.get("kinds"), dict):
        raise GoldenError(f"{stack_path} must hold the golden's 'stack' and 'kinds'; record the golden again")
    return read_run_results(golden), meta, golden


def judge(agreement, old: dict, got: dict, meta: dict) -> tuple:  # type: ignore[no-untyped-def]
    """Every golden output against the engine's: (passed, lines to print)."""
    passed, lines = True, []
    texts = meta.get("texts") or []
    for name, batches in old.items():
        if name not in got:
            raise GoldenError(f"the golden has output {name!r}, the model does not (it has {sorted(got)}); use the golden of this bundle's model")
        a = np.concatenate([np.asarray(b, dtype=np.float64).reshape(len(b), -1) for b in batches])
        b = np.asarray(got[name], dtype=np.float64).reshape(len(got[name]), -1)
        kind = meta["kinds"].get(name, "tensor")
        try:
            metrics, failures, worst = agreement.judge_rows(kind, a, b, meta.get("thresholds"))
        except ValueError as err:
            raise GoldenError(f"output {name!r} cannot be judged against the golden ({err}); the inputs or the model differ") from None
        shown = " ".join(f"{k}={v:.6g}" for k, v in metrics.items())
        lines.append(f"golden {name} ({kind}): {'PASS' if not failures else 'FAIL'} {shown}")
        if failures:
            passed = False
            where = "; ".join(f"{'text' if texts else 'row'} {i}{f' {texts[i][:50]!r}' if i < len(texts) else ''} "
                              f"{agreement.describe_row(c, r)}" for i, c, r in worst[:WORST_SHOWN])
            more = f" (+{len(worst) - WORST_SHOWN} more)" if len(worst) > WORST_SHOWN else ""
            head = f"FAIL: output {name!r} {agreement.failure_verb(metrics)}: {', '.join(failures)}"
            lines.append(head + (f"; moved most: {where}{more}" if where else ""))
    return passed, lines


def _record(args: argparse.Namespace, backend, got: dict, stack: dict) -> None:  # type: ignore[no-untyped-def]
    """DIR/golden.json + DIR/stack.json, written beside and renamed into place: never half a golden."""
    final = os.path.abspath(args.record_golden)
    if os.path.exists(final) and (not os.path.isdir(final) or set(os.listdir(final)) - {GOLDEN_JSON, STACK_JSON}):
        raise GoldenError(f"--record-golden {final} holds other files; pass a new folder or an earlier golden one")
    artifact = args.engine if backend.name == "tensorrt" else args.onnx
    with open(artifact, "rb") as f:
        sha = hashlib.sha256(f.read()).hexdigest()
    kinds = {n: "embedding" if np.asarray(v).ndim == 2 else "tensor" for n, v in got.items()}
    meta = {"schema": 1, "artifact": os.path.basename(artifact), "artifact_sha256": sha, "runner": backend.name, "stack": stack, "kinds": kinds, "texts": None}
    stage = f"{final}.tmp-{os.getpid()}"
    os.makedirs(stage)
    try:
        write_run_results(os.path.join(stage, GOLDEN_JSON), backend.name, got)
        with open(os.path.join(stage, STACK_JSON), "w", encoding="utf-8") as f:
            json.dump(meta, f, indent=2)
        old = f"{final}.old-{os.getpid()}"
        if os.path.exists(final):
            os.rename(final, old)
        os.rename(stage, final)
        shutil.rmtree(old, ignore_errors=True)
    finally:
        shutil.rmtree(stage, ignore_errors=True)


def main(argv: list | None = None) -> int:
    here = os.path.dirname(os.path.abspath(__file__))
    p = argparse.ArgumentParser(description="Judge the engine's outputs against golden outputs, or record the device's own.")
    p.add_argument("--engine", default=os.path.join(here, "model.engine"))
    p.add_argument("--onnx", default=os.path.join(here, "model.onnx"))
    p.add_argument("--reference", default=os.path.join(here, "reference.npz"))
    p.add_argument("--bundle-json", default=os.path.join(here, "bundle.json"))
    p.add_argument("--backend", choices=("auto", "tensorrt", "onnxruntime"), default="auto")
    p.add_argument("--device", type=int, default=0, help="CUDA device index")
    group = p.add_mutually_exclusive_group()
    group.add_argument("--golden", default=None, help="a folder written by --record-golden (default: the bundle's golden.json)")
    group.add_argument("--record-golden", default=None, help="write this device's verified outputs and stack into this folder")
    p.add_argument("--allow-stand-in", action="store_true", help="exit 0/1 on the stand-in's figures instead of 3")
    args = p.parse_args(argv)
    vod, agreement = _siblings()
    try:
        meta, feed, expected, backend = vod._setup(args)
        try:
            got = backend.infer(feed)
        except Exception as err:  # a shape outside the profile, a runtime error: the bundle does not fit the model
            raise GoldenError(f"{backend.name} could not run the reference inputs: {type(err).__name__}: {' '.join(str(err).split())[:200]}") from None
        stack = device_stack(backend, args.device)
        stand_in = backend.name != "tensorrt"
        if args.record_golden:
            verified, _ = vod._compare(meta, expected, got)
            if not verified or (stand_in and not args.allow_stand_in):
                why = "the outputs fail the bundle's reference check" if not verified else "only the stand-in ran (--allow-stand-in records it)"
                print(f"FAIL: not recorded: {why}")
                return 1 if not verified else 3
            _record(args, backend, got, stack)
            print(f"recorded golden {args.record_golden} on: {_stack_line(stack)}")
            return 0
        old, golden_meta, where = _load(args, here)
        print(f"golden: {where} (recorded by {golden_meta.get('runner')})")
        print(f"old stack: {_stack_line(golden_meta['stack'])}")
        print(f"new stack: {_stack_line(stack)}")
        passed, lines = judge(agreement, old, got, golden_meta)
    except (SystemExit, vod.BundleError, GoldenError) as err:
        print(err if isinstance(err, SystemExit) else f"error: {' '.join(str(err).split())[:300]}", file=sys.stderr)
        return 2
    print("\n".join(lines))
    if stand_in and not args.allow_stand_in:
        print(f"{'PASS' if passed else 'FAIL'} on the stand-in only: the engine was not checked (exit 3; --allow-stand-in accepts it)")
        return 3
    print("PASS" if passed else "FAIL")
    return 0 if passed else 1


if __name__ == "__main__":
    sys.exit(main())
