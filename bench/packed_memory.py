"""Peak memory of one inference: all-MiniLM-L6-v2's padded and packed encoder forms, fp32 and int8, and the best CPU peer.

    python bench/packed_memory.py [--ours-dir DIR] [--cache DIR] [--threads 2] [--json PATH]

The models are those ``bench/real_text.py`` times: ``attn-export --checkpoint minilm --quantize int8``
run in-process (``--ours-dir`` reuses a run, e.g. the one ``real_text.py --ours-dir`` left), its
``model.padded.onnx`` / ``model.packed.onnx`` and both int8 twins, and the peer ``optimum-cli
onnxruntime quantize`` if ``real_text.py`` built it into ``--cache``. Each (model, input) point runs
in a fresh Python process (so no earlier allocation is counted) with a plain ONNX Runtime session
(``--threads`` intra-op threads, memory arena off, so the figure is the inference's, not the
arena's high-water mark from another shape): one warm-up call, then the peak RSS delta of one call
(``attn_export.validate.memory``, method ``vmhwm-reset``; weights already loaded are not counted).

Inputs: the first 8 test texts padded to 128 tokens (the fixed input of ``real_text.py``), and
random token ids with no padding at (1, 512) and (8, 512): the packed form's worst case (nothing to
skip). MiniLM has 512 positions, so (1, 4096) is a reference-layer figure: the long-sequence form
keeps its own path and bench (``bench/long_seq.py``).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

import numpy as np

POINTS = (("8x128 real texts", 8, 128, "texts"), ("1x512 no padding", 1, 512, "random"), ("8x512 no padding", 8, 512, "random"))
OURS = {"ours fp32 padded": "model.padded.onnx", "ours fp32 packed": "model.packed.onnx",
        "ours int8 padded": "model.int8-dynamic.onnx", "ours int8 packed": "model.int8-dynamic-packed.onnx"}  # fmt: skip


def _feed(batch: int, seq: int, kind: str) -> dict[str, np.ndarray]:
    if kind == "texts":
        from real_text import _model_dir, fixed_feed

        from attn_export.checkpoint.text import load_tokenizer

        return fixed_feed(load_tokenizer(_model_dir()), batch, seq)[0]
    ids = np.random.default_rng(0).integers(1000, 30000, (batch, seq)).astype(np.int64)
    ids[:, 0], ids[:, -1] = 101, 102  # [CLS] ... [SEP]
    return {"input_ids": ids, "attention_mask": np.ones_like(ids), "token_type_ids": np.zeros_like(ids)}


def child(path: str, batch: int, seq: int, kind: str, threads: int) -> None:
    """One point in this (fresh) process: print its peak RSS delta in bytes as JSON."""
    import onnxruntime as ort

    from attn_export.validate.memory import memory_method, peak_memory_delta

    so = ort.SessionOptions()
    so.intra_op_num_threads, so.enable_cpu_mem_arena, so.log_severity_level = threads, False, 3
    sess = ort.InferenceSession(path, so, providers=["CPUExecutionProvider"])
    names = {i.name for i in sess.get_inputs()}
    feed = {k: v for k, v in _feed(batch, seq, kind).items() if k in names}
    sess.run(None, feed)
    peak = peak_memory_delta(lambda: sess.run(None, feed))
    print(json.dumps({"peak_bytes": peak, "method": memory_method(), "padding": 1.0 - float(feed["attention_mask"].mean())}))


def measure(models: dict[str, Path], threads: int) -> list[dict[str, Any]]:
    rows = []
    for name, path in models.items():
        row: dict[str, Any] = {"model": name, "path": str(path)}
        for label, batch, seq, kind in POINTS:
            cmd = [sys.executable, __file__, "--child", str(path), str(batch), str(seq), kind, "--threads", str(threads)]
            out = subprocess.run(cmd, capture_output=True, text=True, check=True, env={**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)})
            row[label] = json.loads(out.stdout.strip().splitlines()[-1])
        rows.append(row)
    return rows


def format_table(rows: list[dict[str, Any]]) -> str:
    labels = [p[0] for p in POINTS]
    lines = ["peak RSS delta of one inference, MiB (fresh process, plain session, arena off)",
             "| model | " + " | ".join(labels) + " |", "|---|" + "---|" * len(labels)]  # fmt: skip
    for row in rows:
        cells = [f"{row[l]['peak_bytes'] / 2**20:.1f}" if row[l]["peak_bytes"] is not None else "n/a" for l in labels]
        lines.append(f"| {row['model']} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--child", nargs=4, metavar=("PATH", "BATCH", "SEQ", "KIND"), help=argparse.SUPPRESS)
    ap.add_argument("--ours-dir", type=Path, default=None, help="a run of attn-export --checkpoint minilm --quantize int8 to reuse")
    ap.add_argument("--cache", type=Path, default=Path.home() / ".cache" / "attn-export" / "bench-peers", help="real_text.py's peer cache")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--json", type=Path, default=None)
    args = ap.parse_args(argv)
    if args.child:
        path, batch, seq, kind = args.child
        child(path, int(batch), int(seq), kind, args.threads)
        return 0
    from real_text import build_ours

    with tempfile.TemporaryDirectory(prefix="attn-packed-memory-") as tmp:
        work = args.ours_dir or Path(tmp)
        build_ours(work, args.threads, lambda m: print(f"- {m}", file=sys.stderr), reuse=args.ours_dir is not None)
        models = {name: work / file for name, file in OURS.items() if (work / file).is_file()}
        peer = sorted(args.cache.glob("*/optimum_q_*/model_quantized.onnx"))
        if peer:
            models["optimum-cli quantize"] = peer[0]
        rows = measure(models, args.threads)
    print(format_table(rows))
    if args.json:
        args.json.write_text(json.dumps(rows, indent=2) + "\n", encoding="utf-8")
    return 0


if __name__ == "__main__":
    sys.exit(main())
