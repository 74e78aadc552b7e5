"""int8 accuracy and speed per CPU instruction set: the evidence behind ``--int8-encoding auto``.

Builds the pipeline's int8 routes of the default layer (and, with ``--minilm``, MiniLM's
dynamic route) in each CPU encoding, then measures their accuracy against eager fp32 on the
report split:

* natively, on this machine's CPU;
* under ``qemu-x86_64 -cpu Haswell`` (AVX2, no VNNI), i.e. ONNX Runtime's real AVX2 kernels,
  with and without the U8U8 session option (``session.x64quantprecision=1``).

The timing column is native only, all encodings side by side in one process, round-robin
(emulated timings mean nothing). Needs ``apt-get install qemu-user`` for the AVX2 columns.

    python bench/int8_isa.py [--minilm] [--repeats 20]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import textwrap
from pathlib import Path

import numpy as np

_EVAL = textwrap.dedent(
    """
    import json, sys, numpy as np, onnxruntime as ort
    spec = json.load(open(sys.argv[1]))
    z = np.load(spec["feeds"]); out = {}
    def cos(a, b):
        a = a.astype(np.float64).ravel(); b = b.astype(np.float64).ravel(); return float(a @ b / np.linalg.norm(a) / np.linalg.norm(b))
    for name, path in spec["models"].items():
        for u8u8 in ("0", "1"):
            so = ort.SessionOptions(); so.intra_op_num_threads = 2
            so.add_session_config_entry("session.x64quantprecision", u8u8)
            s = ort.InferenceSession(path, so, providers=["CPUExecutionProvider"])
            got = [s.run([spec["output"]], {k: z[f"{k}_{i}"] for k in spec["inputs"]})[0] for i in range(int(z["n"]))]
            if spec["output"] == "sentence_embedding":
                ref = z["ref"]; emb = np.concatenate(got)
                c = (ref / np.linalg.norm(ref, axis=1, keepdims=True) * (emb / np.linalg.norm(emb, axis=1, keepdims=True))).sum(1)
                out[f"{name}|{u8u8}"] = float(c.mean())
            else:
                out[f"{name}|{u8u8}"] = cos(z["ref"], np.concatenate([g.ravel() for g in got]))
    print(json.dumps(out))
    """
)


def _save_feeds(path: Path, feeds: list[dict[str, np.ndarray]], ref: np.ndarray) -> None:
    arrays = {f"{k}_{i}": v for i, f in enumerate(feeds) for k, v in f.items()}
    np.savez(path, ref=ref, n=len(feeds), **arrays)


def _evaluate(spec: dict, work: Path, emulate: bool) -> dict[str, float] | None:
    (work / "eval.py").write_text(_EVAL)
    (work / "spec.json").write_text(json.dumps(spec))
    cmd = [os.path.realpath(sys.executable), str(work / "eval.py"), str(work / "spec.json")]
    if emulate:
        if shutil.which("qemu-x86_64") is None:
            return None
        cmd = ["qemu-x86_64", "-cpu", "Haswell", *cmd]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=3600)
    if proc.returncode != 0:
        print(proc.stderr[-2000:], file=sys.stderr)
        return None
    return json.loads(proc.stdout.strip().splitlines()[-1])


def _build(cfg_kwargs: dict, work: Path, encodings: tuple[str, ...]) -> tuple[dict, dict, object]:
    """The pipeline's int8 routes in each encoding, each the plan of ``attn-export --quantize int8 --int8-mode R --int8-encoding E``."""
    from attn_export.config.run import RunConfig
    from attn_export.pipeline.plan import make_plan
    from attn_export.pipeline.runner import RunSettings, build_plans
    from attn_export.subjects import make_subject

    base = {"quantize": "int8", "render": False, **cfg_kwargs}
    subject = make_subject(RunConfig(out=work, **base))
    routes = ("dynamic",) if "checkpoint" in cfg_kwargs else ("static", "dynamic")
    runs = [(route, enc) for route in routes for enc in encodings]
    plans = [make_plan(RunConfig(out=work / f"{r}_{e}", int8_mode=r, int8_encoding=e, **base)) for r, e in runs]
    built, _ = build_plans(plans, subject, RunSettings(threads=2))
    artifacts = {f"{r}-{e}": arts[f"int8-{r}"] for (r, e), arts in zip(runs, built)}  # type: ignore[index]
    feeds = subject.feeds("report")
    if "checkpoint" in cfg_kwargs:
        ref, output = subject.reference_embeddings("report"), "sentence_embedding"  # type: ignore[attr-defined]
    else:
        eager = subject.eager_runner()
        ref, output = np.concatenate([eager.infer(f)["y"].ravel() for f in feeds]), "y"
    _save_feeds(work / "feeds.npz", feeds, ref)
    models = {name: str(a.path) for name, a in artifacts.items()}
    spec = {"feeds": str(work / "feeds.npz"), "models": models, "output": output, "inputs": list(feeds[0])}
    return spec, artifacts, subject


def _timing(artifacts: dict, subject_feed: dict, repeats: int) -> dict[str, float]:
    from attn_export.runtime import OrtRunner, SessionFromOnnx
    from attn_export.validate.latency import time_runners

    runners = {}
    for name, art in artifacts.items():
        runners[name] = OrtRunner(SessionFromOnnx(art.path, intra_op_threads=2))
        if name.endswith("full-range"):
            runners[name.replace("full-range", "u8u8")] = OrtRunner(SessionFromOnnx(art.path, intra_op_threads=2, u8u8=True))
    lat = time_runners(runners, subject_feed, warmup=3, repeats=repeats)
    return {k: v.p50 for k, v in lat.items()}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--minilm", action="store_true", help="also MiniLM's dynamic route (slower under emulation)")
    parser.add_argument("--repeats", type=int, default=20)
    args = parser.parse_args()
    from attn_export.host.environment import cpu_summary_line
    from attn_export.host.process import ProcessSettings, process_settings

    print(cpu_summary_line())
    subjects = [("default layer", {})] + ([("MiniLM", {"checkpoint": "minilm"})] if args.minilm else [])
    rows = []
    with process_settings(ProcessSettings(threads=2)), tempfile.TemporaryDirectory(prefix="attn-int8-isa-") as tmp:
        for label, kwargs in subjects:
            work = Path(tmp) / label.replace(" ", "_")
            work.mkdir()
            spec, artifacts, subject = _build(kwargs, work, ("full-range", "reduce-range"))
            native = _evaluate(spec, work, emulate=False) or {}
            avx2 = _evaluate(spec, work, emulate=True)
            p50 = _timing(artifacts, subject.latency_feed(), args.repeats)
            for name in spec["models"]:
                route, enc = name.split("-", 1)
                rows.append((label, route, enc, native[f"{name}|0"], avx2 and avx2[f"{name}|0"], avx2 and avx2[f"{name}|1"], p50.get(name), p50.get(name.replace("full-range", "u8u8"))))
    print("\naccuracy vs eager fp32 on the report split (cosine; MiniLM: mean embedding cosine); native p50 in ms")
    print("| subject | route | weights | native | AVX2 (qemu) U8S8 | AVX2 (qemu) U8U8 option | native p50 | native p50 with U8U8 option |")
    print("|---|---|---|---|---|---|---|---|")
    for label, route, enc, nat, sat, u8, t, tu in rows:
        f = lambda v: "-" if v is None else f"{v:.6f}"  # noqa: E731
        g = lambda v: "-" if v is None else f"{v:.2f}"  # noqa: E731
        print(f"| {label} | {route} | {enc} | {f(nat)} | {f(sat)} | {f(u8) if enc == 'full-range' else '(same)'} | {g(t)} | {g(tu)} |")


if __name__ == "__main__":
    main()
