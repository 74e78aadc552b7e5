"""Long documents on a ModernBERT: the exported long-seq ONNX on ONNX Runtime CPU vs transformers' own SDPA model, peak memory vs L.

    python bench/modernbert_long.py [--seqs 1024,4096,8192] [--layers 6] [--threads 2] [--json PATH]

A real-size-ish random-init ModernBERT built by transformers (hidden 768, 12 heads, intermediate 1152,
``--layers`` layers with ``global_attn_every_n_layers`` 3, ``local_attention`` 128, 8192 positions) and
saved with ``save_pretrained``; attn-export loads it (``checkpoint.loader``) and exports the padded
encoder with ``--attention long-seq`` (fp32): the global layers lower to the unpadded
MultiHeadAttention flash kernel, the local layers to the query-block Loop whose keys are sliced to
the window (``export/forms/long_seq.py``), so neither materialises an (L, L) score tensor.

The peer is transformers' ``ModernBertModel`` with ``attn_implementation="sdpa"`` (what a user runs
on CPU; flash-attention 2 is CUDA-only), float32, ``torch.no_grad``. Each (variant, L) point runs at
B = 1 with no padding in a fresh Python process (after one 16-token warm-up call, so one-time library
set-up is not counted, the first inference at L), with glibc's ``MALLOC_MMAP_THRESHOLD_=131072`` for both (its reason is in
``bench/long_seq.py``), ONNX Runtime's CPU arena off and ``--threads`` intra-op threads for both:
peak RSS delta over the loaded model (``attn_export.validate.memory``; weights are not counted).
The wall time of that one call is printed too (a first call; not a latency benchmark). At the first
L the outputs of both are compared (max abs, min token cosine): the figures are for the same maths.
"""

from __future__ import annotations

import os

os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")  # as bench/long_seq.py: no spinning OpenMP threads

import argparse
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np

CONFIG = dict(vocab_size=50368, hidden_size=768, num_attention_heads=12, intermediate_size=1152, max_position_embeddings=8192,
              global_attn_every_n_layers=3, local_attention=128, pad_token_id=50283)  # fmt: skip
VARIANTS = ("ort-long-seq", "torch-sdpa")


def feed_for(seq: int, seed: int = 0) -> dict[str, np.ndarray]:
    """One document of ``seq`` random token ids, no padding."""
    ids = np.random.default_rng(seed).integers(1000, 50000, (1, seq)).astype(np.int64)
    return {"input_ids": ids, "attention_mask": np.ones_like(ids)}


def build(work: Path, layers: int) -> tuple[Path, Path, str]:
    """The checkpoint folder (transformers' save_pretrained) and its long-seq ONNX; returns (folder, onnx, export summary)."""
    import torch
    import transformers

    from attn_export.checkpoint.export import export_encoder
    from attn_export.checkpoint.loader import load_bert_checkpoint
    from attn_export.export.spec import ExportSpec

    folder = work / "modernbert"
    torch.manual_seed(0)
    transformers.ModernBertModel(transformers.ModernBertConfig(**CONFIG, num_hidden_layers=layers)).eval().save_pretrained(str(folder))
    path = work / "modernbert.long-seq.onnx"
    result = export_encoder(load_bert_checkpoint(folder), path, ExportSpec(attention="long-seq"))
    return folder, path, result.describe()


def _runner(variant: str, folder: Path, onnx_path: Path, threads: int) -> Any:
    """A callable feed -> last_hidden_state (1, L, D) float32."""
    if variant == "ort-long-seq":
        import onnxruntime as ort

        so = ort.SessionOptions()
        so.intra_op_num_threads, so.enable_cpu_mem_arena, so.log_severity_level = threads, False, 3
        so.add_session_config_entry("session.intra_op.allow_spinning", "0")
        sess = ort.InferenceSession(str(onnx_path), so, providers=["CPUExecutionProvider"])
        return lambda feed: sess.run(["last_hidden_state"], feed)[0]
    import torch
    import transformers

    torch.set_num_threads(threads)
    model = transformers.ModernBertModel.from_pretrained(str(folder), attn_implementation="sdpa", dtype=torch.float32).eval()

    def run(feed: dict[str, np.ndarray]) -> np.ndarray:
        with torch.no_grad():
            return model(**{k: torch.from_numpy(v) for k, v in feed.items()}).last_hidden_state.numpy()

    return run


def child(variant: str, folder: Path, onnx_path: Path, seq: int, threads: int, save: Path | None) -> None:
    """One point in this (fresh) process: print its peak RSS delta and wall time as JSON."""
    from attn_export.validate.memory import memory_method, peak_memory_delta

    run = _runner(variant, folder, onnx_path, threads)
    run(feed_for(16))  # a 16-token warm-up: one-time library set-up (thread pools, kernels) is not the inference's memory
    feed = feed_for(seq)
    out: list[np.ndarray] = []
    t0 = time.perf_counter()
    peak = peak_memory_delta(lambda: out.append(run(feed)))
    wall = time.perf_counter() - t0
    if save is not None:
        np.save(save, out[0])
    print(json.dumps({"peak_mem_bytes": peak, "wall_s": wall, "method": memory_method()}))


def measure(variant: str, folder: Path, onnx_path: Path, seq: int, threads: int, save: Path | None) -> dict[str, Any]:
    cmd = [sys.executable, __file__, "--child", variant, str(folder), str(onnx_path), str(seq), "--threads", str(threads)]
    if save is not None:
        cmd += ["--save", str(save)]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path), "MALLOC_MMAP_THRESHOLD_": "131072"}
    proc = subprocess.run(cmd, capture_output=True, text=True, env=env)
    if proc.returncode != 0:
        return {"peak_mem_bytes": None, "error": (proc.stderr.strip().splitlines() or ["no output"])[-1]}
    return json.loads(proc.stdout.strip().splitlines()[-1])


def agreement(ref: np.ndarray, got: np.ndarray) -> tuple[float, float]:
    """(max abs, min token cosine) of two (1, L, D) outputs."""
    r, g = ref[0].astype(np.float64), got[0].astype(np.float64)
    cos = (r * g).sum(-1) / np.maximum(np.linalg.norm(r, axis=-1) * np.linalg.norm(g, axis=-1), 1e-30)
    return float(np.abs(r - g).max()), float(cos.min())


def format_table(rows: list[dict[str, Any]], layers: int, threads: int) -> str:
    mib = lambda b: "-" if b is None else f"{b / 2**20:,.0f}"  # noqa: E731
    lines = [f"ModernBERT hidden 768, 12 heads, {layers} layers (global every 3, local_attention 128), B=1, fp32, {threads} threads",
             "peak RSS delta of the first inference, MiB (fresh process each)", "",
             f"{'L':>6}{'ort long-seq MiB':>18}{'torch sdpa MiB':>16}{'ratio':>8}{'ort s':>8}{'torch s':>9}"]  # fmt: skip
    for row in rows:
        o, t = row["ort-long-seq"], row["torch-sdpa"]
        ratio = f"{o['peak_mem_bytes'] / t['peak_mem_bytes']:.2f}" if o.get("peak_mem_bytes") and t.get("peak_mem_bytes") else "-"
        lines.append(f"{row['seq']:>6}{mib(o.get('peak_mem_bytes')):>18}{mib(t.get('peak_mem_bytes')):>16}{ratio:>8}"
                     f"{o.get('wall_s', float('nan')):>8.1f}{t.get('wall_s', float('nan')):>9.1f}")  # fmt: skip
        for v in VARIANTS:
            if row[v].get("error"):
                lines.append(f"        {v}: {row[v]['error']}")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--child", nargs=4, metavar=("VARIANT", "FOLDER", "ONNX", "SEQ"), help=argparse.SUPPRESS)
    ap.add_argument("--save", type=Path, default=None, help=argparse.SUPPRESS)
    ap.add_argument("--seqs", default="1024,4096,8192")
    ap.add_argument("--layers", type=int, default=6)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--json", type=Path, default=None)
    args = ap.parse_args(argv)
    if args.child:
        variant, folder, onnx_path, seq = args.child
        child(variant, Path(folder), Path(onnx_path), int(seq), args.threads, args.save)
        return 0
    seqs = [int(s) for s in args.seqs.split(",")]
    rows: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory(prefix="attn-modernbert-long-") as tmp:
        work = Path(tmp)
        folder, onnx_path, summary = build(work, args.layers)
        print(f"- exported {onnx_path.name}: {summary}", file=sys.stderr)
        for i, seq in enumerate(seqs):
            row: dict[str, Any] = {"seq": seq}
            for v in VARIANTS:
                save = work / f"{v}.npy" if i == 0 else None
                row[v] = measure(v, folder, onnx_path, seq, args.threads, save)
                print(f"- L={seq} {v}: {row[v]}", file=sys.stderr)
            if i == 0 and all((work / f"{v}.npy").is_file() for v in VARIANTS):
                err, cos = agreement(np.load(work / "torch-sdpa.npy"), np.load(work / "ort-long-seq.npy"))
                row["agreement"] = {"max_abs": err, "min_cosine": cos}
            rows.append(row)
    print(format_table(rows, args.layers, args.threads))
    for row in rows:
        if "agreement" in row:
            print(f"L={row['seq']}: ort long-seq vs torch sdpa last_hidden_state max abs {row['agreement']['max_abs']:.2e}, "
                  f"min token cosine {row['agreement']['min_cosine']:.7f}")  # fmt: skip
    if args.json:
        args.json.write_text(json.dumps({"layers": args.layers, "threads": args.threads, "rows": rows}, indent=2) + "\n", encoding="utf-8")
    return 0


if __name__ == "__main__":
    sys.exit(main())
