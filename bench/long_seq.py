"""Long sequences: every exported attention form vs PyTorch's own SDPA, memory and latency vs L.

    python bench/long_seq.py [--quick] [--seqs 128,...,8192] [--batch8-seq 4096] [--threads 2] [--out DIR]

The default TransformerLayer (d_model 512, 8 heads, padding mask, 1/8 of every sequence
padded; --mask causal|window|none for the other kinds) at B=1 for each L, and at B=8 for
--batch8-seq. Variants:

* ``eager-math``  PyTorch eager, explicit attention math (the ground truth);
* ``eager-sdpa``  PyTorch eager, ``F.scaled_dot_product_attention`` with the same mask: the peer;
* ``ort-<form>``  ONNX Runtime CPU for each exported attention form: decomposed,
  onnx-attention, ort-contrib, long-seq (the auto-chosen form), and long-seq-chunked (the
  query-block Loop design forced for the padding mask, kept to compare the two designs).

Latency: all variants of a grid point timed round-robin in this process on the same input
(``validate.latency.time_runners``), same thread count for PyTorch and ONNX Runtime; p50 ms.
Peak memory: each variant's first inference in a fresh subprocess (``validate.memory``:
peak RSS delta after ``malloc_trim``, weights excluded), so no runtime's leftovers count.
The subprocess runs with glibc's ``MALLOC_MMAP_THRESHOLD_=131072`` (same for every variant):
glibc otherwise raises its mmap threshold after the first large free and serves later
blocks from a heap it keeps, so the same run read 109 to 165 MiB from one start to the next;
with a fixed threshold every block >= 128 KiB is returned when freed and the figure is the
live-set peak, reproducible to ~1%. ``--glibc-default-malloc`` measures without it.
ONNX Runtime sessions run with the CPU arena and thread spinning off, as in ``attn-export
bench``. Ratios are to ``eager-sdpa`` (latency ratio < 1 and memory ratio < 1 = better).
Writes ``long_seq.json``, ``long_seq.md`` (the table) and ``long_seq.png`` (memory and
latency vs L) to --out.

A variant whose estimated peak exceeds --max-peak-gib or 80% of MemAvailable is skipped
and listed with the reason, never silently dropped. --quick: L 256 and 2048 at B=1 only.
"""

from __future__ import annotations

import os

# Spinning OpenMP threads make eager latency swing 10x on a shared machine; set before torch loads.
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

import argparse
import json
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

D_MODEL, HEADS = 512, 8
FORMS: dict[str, tuple[str, str]] = {  # variant -> (attention form, long-seq strategy)
    "ort-decomposed": ("decomposed", "auto"),
    "ort-onnx-attention": ("onnx-attention", "auto"),
    "ort-contrib": ("ort-contrib", "auto"),
    "ort-long-seq": ("long-seq", "auto"),
    "ort-long-seq-chunked": ("long-seq", "chunked"),
}
EAGER = ("eager-math", "eager-sdpa")
PEER = "eager-sdpa"
WINDOW = 16  # the window mask's half-width (build_layer's default)
MASK_TEXT = {"padding": "padding mask, last L/8 padded", "causal": "causal mask", "window": f"window mask w={WINDOW}", "none": "no mask"}
# Score-sized fp32 tensors alive at the peak, per variant (B*H*L*L*4 bytes each): measured
# at B=1, L=4096 (2.09, 2.06, 1.23, 1.25) and rounded up; used only to skip a run that would
# not fit in memory.
_QUADRATIC_COPIES = {"eager-math": 2.2, "ort-decomposed": 2.2, "ort-onnx-attention": 1.35, "ort-contrib": 1.35}


@dataclass
class Point:
    batch: int
    seq: int


def feed_for(batch: int, seq: int, mask: str = "padding", seed: int = 0) -> dict[str, np.ndarray]:
    """x (B, L, D) and, for the padding mask, a key_padding_mask (B, L) with the last L/8 of every row padded."""
    rng = np.random.default_rng(seed)
    feed = {"x": rng.standard_normal((batch, seq, D_MODEL)).astype(np.float32)}
    if mask == "padding":
        kpm = np.ones((batch, seq), dtype=np.int32)
        kpm[:, seq - seq // 8 :] = 0
        feed["key_padding_mask"] = kpm
    return feed


def _layer(mask: str) -> Any:
    from attn_export.layers import MaskedLayer, build_layer

    return MaskedLayer(build_layer("transformer", D_MODEL, HEADS, mask=mask, window=WINDOW, seed=0), mask)


def build_runner(variant: str, onnx_dir: Path, threads: int, mask: str = "padding") -> Any:
    """One runner per variant; eager layers are rebuilt from the same seed in every process."""
    from attn_export.layers import set_attention_impl_
    from attn_export.runtime import EagerRunner, OrtRunner, SessionFromOnnx

    if variant in EAGER:
        layer = _layer(mask)
        set_attention_impl_(layer, "sdpa" if variant == "eager-sdpa" else "math")
        return EagerRunner(layer, layer.input_names, ["y"], name=variant)
    session = SessionFromOnnx(onnx_dir / f"{variant}.onnx", intra_op_threads=threads, cpu_mem_arena=False)
    return OrtRunner(session, name=variant)


def export_all(onnx_dir: Path, mask: str) -> dict[str, str]:
    """Export the layer once per form (dynamic batch and sequence); returns variant -> describe()."""
    from attn_export.export import ExportSpec, export_onnx

    layer = _layer(mask)
    done = {}
    for variant, (form, strategy) in FORMS.items():
        result = export_onnx(layer, onnx_dir / f"{variant}.onnx", ExportSpec(attention=form, long_seq_strategy=strategy))
        done[variant] = result.describe()
    return done


def _mem_available_bytes() -> int | None:
    try:
        with open("/proc/meminfo", encoding="ascii") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        return None
    return None


def skip_reason(variant: str, point: Point, max_peak_gib: float) -> str | None:
    """Why a variant cannot run at a point without risking the machine's memory (None = run it)."""
    copies = _QUADRATIC_COPIES.get(variant)
    if copies is None:
        return None
    est = copies * point.batch * HEADS * point.seq**2 * 4
    avail = _mem_available_bytes()
    if est > max_peak_gib * 2**30:
        return f"estimated peak {est / 2**30:.1f} GiB > --max-peak-gib {max_peak_gib:g}"
    if avail is not None and est > 0.8 * avail:
        return f"estimated peak {est / 2**30:.1f} GiB > 80% of MemAvailable {avail / 2**30:.1f} GiB"
    return None


def measure_memory_here(variant: str, point: Point, onnx_dir: Path, threads: int, mask: str) -> dict[str, Any]:
    """Run in the fresh subprocess: the first inference's peak RSS delta."""
    from attn_export.validate import set_threads
    from attn_export.validate.memory import memory_method, peak_memory_delta

    set_threads(threads)
    runner = build_runner(variant, onnx_dir, threads, mask)
    runner.activate()
    feed = feed_for(point.batch, point.seq, mask)
    peak = peak_memory_delta(lambda: runner.infer(feed))
    return {"peak_mem_bytes": peak, "method": memory_method()}


def measure_memory(variant: str, point: Point, onnx_dir: Path, threads: int, mask: str, fixed_mmap: bool) -> dict[str, Any]:
    cmd = [sys.executable, __file__, "--memory-of", variant, "--batch", str(point.batch), "--seq", str(point.seq),
           "--onnx-dir", str(onnx_dir), "--threads", str(threads), "--mask", mask]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
    if fixed_mmap:
        env["MALLOC_MMAP_THRESHOLD_"] = "131072"
    proc = subprocess.run(cmd, capture_output=True, text=True, env=env)
    if proc.returncode != 0:
        tail = (proc.stderr.strip().splitlines() or ["no output"])[-1]
        return {"peak_mem_bytes": None, "error": tail}
    return json.loads(proc.stdout.strip().splitlines()[-1])


def time_point(
    runners: dict[str, Any], point: Point, mask: str, budget_s: float, min_repeats: int, max_repeats: int
) -> dict[str, Any]:
    """Accuracy vs eager-math, then round-robin latency with repeats sized to the time budget."""
    from attn_export.validate import accuracy, time_runners

    feed = feed_for(point.batch, point.seq, mask)
    first: dict[str, float] = {}
    outs: dict[str, np.ndarray] = {}
    for name, runner in runners.items():  # warm-up run doubles as the accuracy run
        t0 = time.perf_counter()
        outs[name] = runner.infer(feed)["y"]
        first[name] = time.perf_counter() - t0
    ref = outs.get("eager-math")
    per_round = sum(first.values())
    repeats = int(min(max_repeats, max(min_repeats, budget_s // max(per_round, 1e-3))))
    lat = time_runners(runners, feed, warmup=0, repeats=repeats, batch=point.batch)
    rows = {}
    for name in runners:
        err = None if ref is None else accuracy(ref, outs[name]).max_abs
        rows[name] = {"latency_ms_p50": lat[name].p50, "latency_ms_p90": lat[name].p90, "repeats": repeats, "max_abs_vs_math": err}
    return rows


def render(results: list[dict[str, Any]]) -> str:
    lines = []
    for res in results:
        batch, seq = res["batch"], res["seq"]
        peer = res["variants"].get(PEER, {})
        p_ms, p_mem = peer.get("latency_ms_p50"), peer.get("peak_mem_bytes")
        lines.append(f"\nB={batch} L={seq}  (ratios to {PEER}; < 1 = better)")
        lines.append(f"{'variant':<22}{'peak MiB':>10}{'mem ratio':>11}{'p50 ms':>10}{'lat ratio':>11}{'max abs':>10}")
        for name, row in res["variants"].items():
            if "skipped" in row:
                lines.append(f"{name:<22}  skipped: {row['skipped']}")
                continue
            mem, ms = row.get("peak_mem_bytes"), row.get("latency_ms_p50")
            mem_s = f"{mem / 2**20:10.0f}" if mem is not None else f"{'n/a':>10}"
            mem_r = f"{mem / p_mem:10.2f}x" if mem is not None and p_mem else f"{'':>11}"
            ms_s = f"{ms:10.1f}" if ms is not None else f"{'n/a':>10}"
            ms_r = f"{ms / p_ms:10.2f}x" if ms is not None and p_ms else f"{'':>11}"
            err = row.get("max_abs_vs_math")
            err_s = f"{err:10.1e}" if err is not None else f"{'':>10}"
            lines.append(f"{name:<22}{mem_s}{mem_r}{ms_s}{ms_r}{err_s}")
    return "\n".join(lines)


def render_markdown(results: list[dict[str, Any]]) -> str:
    """One table for docs: peak MiB and p50 ms per variant and grid point, with ratios to the peer."""
    names = list(results[0]["variants"]) if results else []
    head = "| B | L | " + " | ".join(f"`{n}`" for n in names) + " |"
    lines = [head, "|---|---|" + "---|" * len(names)]
    for res in results:
        peer = res["variants"].get(PEER, {})
        cells = []
        for name in names:
            row = res["variants"].get(name, {})
            if "skipped" in row:
                cells.append("skipped")
                continue
            mem, ms = row.get("peak_mem_bytes"), row.get("latency_ms_p50")
            mem_s = f"{mem / 2**20:.0f} MiB" if mem is not None else "n/a"
            ms_s = f"{ms:.0f} ms" if ms is not None else "n/a"
            if name != PEER and mem is not None and peer.get("peak_mem_bytes") and ms is not None and peer.get("latency_ms_p50"):
                mem_s += f" ({mem / peer['peak_mem_bytes']:.2f}x)"
                ms_s += f" ({ms / peer['latency_ms_p50']:.2f}x)"
            cells.append(f"{mem_s}<br>{ms_s}")
        lines.append(f"| {res['batch']} | {res['seq']} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def crossover(results: list[dict[str, Any]], form: str = "ort-long-seq", default: str = "ort-decomposed") -> str:
    """Where the long-seq form starts to beat ORT CPU's default form (B=1): the auto threshold."""
    lines = [f"\n{form} vs {default} (ORT CPU default form), B=1: latency and memory ratios (< 1 = long-seq better)"]
    wins = []
    for res in (r for r in results if r["batch"] == 1):
        a, b = res["variants"].get(form, {}), res["variants"].get(default, {})
        if not (a.get("latency_ms_p50") and b.get("latency_ms_p50")):
            continue
        lat = a["latency_ms_p50"] / b["latency_ms_p50"]
        mem = (a["peak_mem_bytes"] / b["peak_mem_bytes"]) if a.get("peak_mem_bytes") and b.get("peak_mem_bytes") else float("nan")
        wins.append((res["seq"], lat <= 1.0 and not mem > 1.0))
        lines.append(f"  L={res['seq']:<6} latency {lat:5.2f}x  memory {mem:5.2f}x")
    if not wins:
        return f"\n(no crossover: the run needs both {form} and {default} at B=1)"
    first = next((seq for i, (seq, _) in enumerate(wins) if all(w for _, w in wins[i:])), None)
    lines.append(f"  long-seq is no slower and no larger from L={first} on" if first else "  long-seq never wins at every larger L")
    return "\n".join(lines)


def plot(results: list[dict[str, Any]], path: Path, mask_text: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    b1 = [r for r in results if r["batch"] == 1]
    if not b1:
        return
    names = list(b1[0]["variants"])
    fig, (ax_mem, ax_lat) = plt.subplots(1, 2, figsize=(12, 4.5))
    for name in names:
        xs, mems, lats = [], [], []
        for r in b1:
            row = r["variants"].get(name, {})
            if row.get("peak_mem_bytes") and row.get("latency_ms_p50"):
                xs.append(r["seq"])
                mems.append(row["peak_mem_bytes"] / 2**20)
                lats.append(row["latency_ms_p50"])
        style = dict(marker="o", linewidth=2.5 if name in (PEER, "ort-long-seq") else 1.2)
        ax_mem.plot(xs, mems, label=name, **style)
        ax_lat.plot(xs, lats, label=name, **style)
    for ax, ylabel in ((ax_mem, "peak memory (MiB, RSS delta)"), (ax_lat, "latency p50 (ms)")):
        ax.set_xscale("log", base=2)
        ax.set_yscale("log")
        ax.set_xlabel("sequence length L (B=1)")
        ax.set_ylabel(ylabel)
        ax.grid(True, which="both", alpha=0.3)
    ax_lat.legend(fontsize=8)
    fig.suptitle(f"TransformerLayer d512 h8, {mask_text}, ONNX Runtime CPU vs PyTorch eager")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="L 256,2048 at B=1 only (about 2 minutes)")
    ap.add_argument("--mask", default="padding", choices=("padding", "causal", "window", "none"))
    ap.add_argument("--seqs", default="128,256,512,1024,2048,4096,8192", help="B=1 sequence lengths")
    ap.add_argument("--batch8-seq", type=int, default=4096, help="sequence length of the B=8 point (0 = none)")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--budget-s", type=float, default=20.0, help="timing budget per grid point (s)")
    ap.add_argument("--min-repeats", type=int, default=3)
    ap.add_argument("--max-repeats", type=int, default=30)
    ap.add_argument("--max-peak-gib", type=float, default=12.0, help="skip variants estimated above this peak")
    ap.add_argument("--variants", default=",".join((*EAGER, *FORMS)))
    ap.add_argument("--glibc-default-malloc", action="store_true", help="measure memory without the fixed mmap threshold")
    ap.add_argument("--out", default="bench-long-seq")
    # internal: the fresh-subprocess memory measurement
    ap.add_argument("--memory-of", help=argparse.SUPPRESS)
    ap.add_argument("--batch", type=int, default=1, help=argparse.SUPPRESS)
    ap.add_argument("--seq", type=int, default=128, help=argparse.SUPPRESS)
    ap.add_argument("--onnx-dir", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)

    if args.memory_of:
        print(json.dumps(measure_memory_here(args.memory_of, Point(args.batch, args.seq), Path(args.onnx_dir), args.threads, args.mask)))
        return 0

    import onnxruntime
    import torch

    from attn_export.validate import set_threads

    set_threads(args.threads)
    torch.set_flush_denormal(True)  # as ORT's pool threads (session.set_denormal_as_zero)
    points = [Point(1, int(s)) for s in ("256,2048" if args.quick else args.seqs).split(",")]
    if args.batch8_seq and not args.quick:
        points.append(Point(8, args.batch8_seq))
    variants = [v for v in args.variants.split(",") if v]
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    print(f"torch {torch.__version__}, onnxruntime {onnxruntime.__version__}, threads {args.threads}, "
          f"d_model {D_MODEL}, heads {HEADS}, {MASK_TEXT[args.mask]}", flush=True)
    results: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory() as tmp:
        onnx_dir = Path(tmp)
        exported = export_all(onnx_dir, args.mask)
        for name, text in exported.items():
            print(f"  {name}: {text}")
        runners = {v: build_runner(v, onnx_dir, args.threads, args.mask) for v in variants}
        for point in points:
            t0 = time.perf_counter()
            rows: dict[str, dict[str, Any]] = {}
            live = {}
            for v in variants:
                reason = skip_reason(v, point, args.max_peak_gib)
                if reason:
                    rows[v] = {"skipped": reason}
                    continue
                rows[v] = measure_memory(v, point, onnx_dir, args.threads, args.mask, not args.glibc_default_malloc)
                live[v] = runners[v]
            for v, row in time_point(live, point, args.mask, args.budget_s, args.min_repeats, args.max_repeats).items():
                rows[v].update(row)
            results.append({"batch": point.batch, "seq": point.seq, "variants": rows})
            print(render(results[-1:]), f"\n  ({time.perf_counter() - t0:.0f} s)", flush=True)
    meta = {"format": "attn-export-long-seq/1", "threads": args.threads, "d_model": D_MODEL, "heads": HEADS,
            "mask": MASK_TEXT[args.mask], "peer": PEER, "exports": exported,
            "malloc_mmap_threshold": None if args.glibc_default_malloc else 131072,
            "torch": torch.__version__, "onnxruntime": onnxruntime.__version__}
    print(crossover(results))
    (out / "long_seq.json").write_text(json.dumps({"meta": meta, "results": results}, indent=1))
    (out / "long_seq.md").write_text(render_markdown(results) + "\n")
    plot(results, out / "long_seq.png", MASK_TEXT[args.mask])
    print(f"\nwrote {out / 'long_seq.json'}, {out / 'long_seq.md'} and {out / 'long_seq.png'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
