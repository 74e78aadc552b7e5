"""Our shipped int8 encoder against the int8 CPU peers a user would pick, on real text: speed, accuracy, invariance.

    PYTHONPATH=. OV/bin/python bench/int8_peers.py --checkpoint minilm|DIR [--ours RUN | --ours-dir NEW | --peers-only]
        [--optimum-cli OPT/bin/optimum-cli] [--threads 2] [--repeats 3] [--batch 8] [--max-len 128]
        [--fixed-seq 128] [--fixed-calls 20] [--fp32-rows] [--cache DIR] [--json PATH]

``DIR``: a sentence-transformers checkpoint folder, e.g. ``$(python bench/fetch_mpnet.py)`` for the real
all-mpnet-base-v2. Every variant runs in ONE process, so the interpreter must import openvino and nncf
beside the project's packages; optimum runs as a CLI from an environment of its own. Once:

    python -m venv --system-site-packages OV && OV/bin/pip install openvino nncf
    python -m venv OPT && OPT/bin/pip install torch==2.13.0 && OPT/bin/pip install 'optimum-onnx[onnxruntime]'

(openvino and nncf bring no torch, onnxruntime or transformers of their own, so ``OV`` runs the project's
versions; optimum-onnx pins ``transformers<4.58``, hence ``OPT``.) Without openvino the OpenVINO rows are
listed as unavailable, without ``--optimum-cli`` optimum's. Then, e.g. (ours of an ``attn-export --checkpoint
"$MPNET" --quantize int8 --out RUN`` already built)::

    PYTHONPATH=. OV/bin/python bench/int8_peers.py --checkpoint minilm --optimum-cli OPT/bin/optimum-cli
    PYTHONPATH=. OV/bin/python bench/int8_peers.py --checkpoint "$MPNET" --ours RUN --fixed-calls 5 \
        --optimum-cli OPT/bin/optimum-cli

Variants, side by side, round-robin (``validate.latency.time_runners``, as ``bench/real_text.py``):

- **eager sentence-transformers fp32**: ``SentenceTransformer``'s forward on the same token batches;
- **ours**: the ``model.int8.onnx`` that ``attn-export --checkpoint X --quantize int8`` ships, built
  in-process (``real_text.build_ours``, into ``--ours-dir`` when given) or, with ``--ours RUN``, an already
  built run's (padded or packed form: both take ``input_ids``/``attention_mask``; the form is read from the
  run's report);
- **optimum-cli quantize** and **ORT optimizer + quantize_dynamic**: ``real_text.build_peers`` (optimum's
  CLI from ``--optimum-cli``, its own venv: optimum-onnx pins ``transformers<4.58``);
- **OpenVINO fp32** and **OpenVINO + NNCF int8** (``bench/openvino_peer.py``: ``ov.convert_model`` of the
  transformers encoder, ``nncf.quantize(model_type=nncf.ModelType.TRANSFORMER)`` on the texts our
  pipeline calibrates on, compiled for CPU with ``PERFORMANCE_HINT=LATENCY`` and ``INFERENCE_NUM_THREADS``
  = ``--threads``); OpenVINO's default inference precision is bf16 on a CPU with native bf16, so the int8
  model is also run with ``INFERENCE_PRECISION_HINT=f32`` (a row of its own) to separate the two.
- ``--fp32-rows`` adds our ``model.onnx`` and optimum's fp32 export.

ORT sessions are what a user opens (``intra_op_num_threads``, intra-op spinning off so an idle pool
does not steal the core the next variant runs on). Timing: the test split in batches of ``--batch``,
each padded to its longest text, and a fixed (``--batch``, ``--fixed-seq``) input; wall and process-CPU
ms per call, median [min-max] over repeats; ``x best`` = the best peer's time / this one's, per repeat
(median, worst repeat). Accuracy: the sentence embedding of every test text against
``SentenceTransformer.encode`` (the model as its own library runs it), the texts alone and in batches
of 32; batch invariance: ``batch_invariance.invariance`` (min cosine of a text alone vs in batches of 8
and 32, file order and shuffled). The load average and ``uptime`` are printed: the machine may be shared.
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

os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")  # before torch is imported: idle OpenMP threads must not spin

import numpy as np
from batch_invariance import invariance
from real_text import (
    Variant,
    _add_ratios,
    _find_optimum_cli,
    _model_dir,
    _runner,
    _SentenceTransformersRunner,
    _timed,
    build_ours,
    build_peers,
    fixed_feed,
    real_batches,
    sentence_embedding,
)

KEEP_PEERS = ("optimum-cli quantize", "ORT optimizer + quantize_dynamic")
EAGER = "eager sentence-transformers fp32"


def ours_from_folder(run: Path) -> tuple[list[Variant], dict[str, Any]]:
    """The shipped models of an ``attn-export`` run folder, labelled with the stages its report says it shipped."""
    import onnx

    report = json.loads((run / "report.json").read_text()) if (run / "report.json").is_file() else {}
    selection = report.get("selection", {})
    shipped = {k: e.get("stage") for k, e in selection.items() if isinstance(e, dict) and e.get("stage")}
    graph = onnx.load(str(run / "model.int8.onnx"), load_external_data=False).graph
    variants = [
        Variant(f"ours int8 model.int8.onnx ({shipped.get('int8', '?')})", "ours", run / "model.int8.onnx"),
        Variant(f"ours fp32 model.onnx ({shipped.get('form', '?')})", "ours", run / "model.onnx"),
    ]
    record = {"run": str(run), "shipped": shipped, "int8_inputs": [i.name for i in graph.input],
              "int8_encoding": report.get("environment", {}).get("int8_encoding", {})}  # fmt: skip
    return variants, record


def _openvino(folder: Path, train: Any, cache: Path, say: Any) -> tuple[list[Variant], dict[str, Any]]:
    from openvino_peer import OV_FP32, OV_INT8, build_openvino

    try:
        fp32, int8, record = build_openvino(folder, train, cache, say)
    except ImportError as err:  # the interpreter lacks the peer: the rows say so
        why = f"openvino/nncf not importable ({err}); run from a venv with openvino and nncf"
        return [Variant(OV_INT8, "peer", unavailable=why)], {}
    return [
        Variant(OV_FP32, "peer", fp32, pooled=False, session="openvino"),
        Variant(OV_INT8, "peer", int8, pooled=False, session="openvino"),
        Variant(OV_INT8 + ", f32 precision hint", "peer", int8, pooled=False, session="openvino-f32"),
    ], record


def _make_runner(v: Variant, threads: int, u8u8: bool, folder: Path) -> Any:
    if v.kind == "eager":
        return _SentenceTransformersRunner(folder)
    if v.session.startswith("openvino"):
        from openvino_peer import OpenVinoRunner

        return OpenVinoRunner(v.path, threads, v.name, f32=v.session == "openvino-f32")  # type: ignore[arg-type]
    return _runner(v, threads, u8u8 and "int8" in v.name)


def _size_mb(v: Variant, folder: Path) -> float:
    if v.path is None:  # eager: its weights
        return (folder / "model.safetensors").stat().st_size / 1e6
    extra = v.path.with_suffix(".bin") if v.path.suffix == ".xml" else v.path.with_name(v.path.name + ".data")
    return (v.path.stat().st_size + (extra.stat().st_size if extra.is_file() else 0)) / 1e6


def _uptime() -> str:
    return subprocess.run(["uptime"], capture_output=True, text=True).stdout.strip()


def variants(args: argparse.Namespace, work: Path, isa: str, say: Any) -> tuple[list[Variant], Any, dict[str, Any]]:
    """Every variant (eager, ours, optimum's, OpenVINO's), the int8 encoding ours runs with, and what built them."""
    from attn_export.compress.quant.int8_encoding import choose_cpu_encoding
    from attn_export.config.run import RunConfig
    from attn_export.subjects import make_subject

    record: dict[str, Any] = {}
    encoding = choose_cpu_encoding("auto")
    cfg = RunConfig(checkpoint=args.checkpoint, quantize="int8", threads=args.threads, out=work / "x", render=False)
    if args.ours is not None:
        ours, record["ours"] = ours_from_folder(args.ours)
        subject = make_subject(cfg)
    elif args.peers_only:
        ours, subject = [], make_subject(cfg)
    else:
        out = args.ours_dir or work / "run"
        built, subject, encoding = build_ours(out, args.threads, say, checkpoint=args.checkpoint)
        ours = [built[1], built[0]]  # the shipped int8 and fp32 (the twins it did not ship are real_text.py's)
    ours = [v for v in ours if args.fp32_rows or "int8" in v.name]
    conf = subject.encoder.config
    cli = _find_optimum_cli(args.optimum_cli)
    peers, record["optimum"] = build_peers(args.cache, cli, isa, conf.num_attention_heads, conf.hidden_size, say,
                                           checkpoint=args.checkpoint)  # fmt: skip
    peers = [p for p in peers if p.name in KEEP_PEERS or (args.fp32_rows and p.name == "optimum fp32")]
    ov, record["openvino"] = _openvino(_model_dir(args.checkpoint), subject.data.tokens["train"], args.cache, say)
    return [Variant(EAGER, "eager"), *ours, *peers, *ov], encoding, record


def judge(runners: dict[str, Any], folder: Path, tokenizer: Any, max_len: int, say: Any) -> dict[str, dict[str, Any]]:
    """Per runner: accuracy against ``SentenceTransformer.encode`` and batch invariance on the test split."""
    from sentence_transformers import SentenceTransformer

    from attn_export.checkpoint.corpus import load_text_corpus
    from attn_export.checkpoint.text import tokenize

    texts = list(load_text_corpus().test)
    st = SentenceTransformer(str(folder), device="cpu")
    st.max_seq_length = max_len
    reference = st.encode(texts, batch_size=1, convert_to_numpy=True, normalize_embeddings=False)
    judged = {}
    for name, runner in runners.items():
        say(f"accuracy and batch invariance: {name}")

        def embed(batch: list[str], runner: Any = runner) -> np.ndarray:
            t = tokenize(tokenizer, batch, max_len)
            feed = {**t.feed(), "token_type_ids": np.zeros_like(t.input_ids)}
            return sentence_embedding(runner.infer(feed), feed)

        judged[name] = invariance(embed, texts, reference)
    return judged


def run(args: argparse.Namespace) -> dict[str, Any]:
    """Build (or find) every variant, time them round-robin, then judge each against ``SentenceTransformer.encode``."""
    from openvino_peer import kernel_summary

    from attn_export.checkpoint.text import load_tokenizer
    from attn_export.host.environment import capture_environment, detect_cpu
    from attn_export.host.process import ProcessSettings, process_settings

    say = (lambda m: print(f"- {m}", file=sys.stderr)) if not args.quiet else (lambda m: None)
    cpu = detect_cpu()
    folder = _model_dir(args.checkpoint)
    uptime = {"start": _uptime()}
    settings = ProcessSettings(threads=args.threads, flush_denormals=False)
    with process_settings(settings) as proc, tempfile.TemporaryDirectory(prefix="attn-int8-peers-") as tmp:
        every, encoding, record = variants(args, Path(tmp), cpu.isa_class, say)
        live = [v for v in every if v.unavailable is None]
        runners = {v.name: _make_runner(v, args.threads, bool(encoding.session_u8u8), folder) for v in live}
        tokenizer = load_tokenizer(folder)
        batches, real_info = real_batches(tokenizer, args.batch, args.max_len)
        fixed, fixed_info = fixed_feed(tokenizer, args.batch, args.fixed_seq)
        uptime["before_timing"] = _uptime()
        say(f"timing {len(live)} variants on {len(batches)} real batches, {args.repeats} repeats")
        real = _timed(runners, batches, repeats=args.repeats, warmup=1)
        say(f"timing the fixed ({args.batch}, {args.fixed_seq}) input")
        fixed_t = _timed(runners, [fixed] * args.fixed_calls, repeats=args.repeats, warmup=3)
        uptime["after_timing"] = _uptime()
        judged = judge(runners, folder, tokenizer, args.max_len, say)
        openvino = {name: {"properties": r.properties(), "kernels": kernel_summary(r)}
                    for name, r in runners.items() if hasattr(r, "properties")}  # fmt: skip
        for r in runners.values():
            r.deactivate()
        rows = []
        for v in every:  # inside: a temporary run folder's files are still there to be sized
            row: dict[str, Any] = {"variant": v.name, "kind": v.kind, "notes": v.notes}
            if v.unavailable:
                row["unavailable"] = v.unavailable
            else:
                row.update(real=real[v.name], fixed=fixed_t[v.name], mb=_size_mb(v, folder), **judged[v.name])
            rows.append(row)
    uptime["end"] = _uptime()
    _add_ratios(rows)
    fixed_record = {"batch": args.batch, "seq": args.fixed_seq, **fixed_info}
    return {"checkpoint": str(folder), "cpu": cpu.describe(), "isa_class": cpu.isa_class, "threads": args.threads,
            "repeats": args.repeats, "uptime": uptime, **record, "openvino_runtime": openvino,
            "environment": capture_environment(args.threads, proc), "int8_encoding": encoding.to_dict(),
            "real_batches": real_info, "fixed": fixed_record, "rows": rows}  # fmt: skip


def _header(result: dict[str, Any]) -> list[str]:
    rb, fx, up = result["real_batches"], result["fixed"], result["uptime"]
    lines = [
        f"checkpoint: {result['checkpoint']}",
        f"cpu: {result['cpu']}; instruction-set class {result['isa_class']}; {result['threads']} threads; "
        f"{result['repeats']} repeats",
        f"load (shared machine): {up['before_timing']} (before timing) | {up['after_timing']} (after timing)",
        f"real: {rb['batches']} batches of the test split ({rb['texts']} texts, mean {rb['mean_tokens']:.1f} tokens, "
        f"p90 {rb['p90_tokens']:.0f}), padding {100 * rb['padding_fraction']:.1f}%; "
        f"fixed: ({fx['batch']}, {fx['seq']}), padding {100 * fx['padding_fraction']:.1f}%",
    ]
    for name, ov in result.get("openvino_runtime", {}).items():
        p = ov["properties"]
        kernels = ", ".join(f"{k} x{n}" for k, n in ov["kernels"].items())
        lines.append(f"{name}: precision {p.get('INFERENCE_PRECISION_HINT')}, streams {p.get('NUM_STREAMS')}, "
                     f"threads {p.get('INFERENCE_NUM_THREADS')}, pinning {p.get('ENABLE_CPU_PINNING')}; "
                     f"kernels: {kernels}")  # fmt: skip
    return lines


def format_tables(result: dict[str, Any]) -> str:
    lines = [*_header(result), "",
             "ms per call: median [min-max] over repeats; x best = best peer / this, per repeat: median (worst)",
             "| variant | real wall ms | real cpu ms | real x best wall | real x best cpu | "
             "fixed wall ms | fixed cpu ms | fixed x best wall | fixed x best cpu | MB |",
             "|---|---|---|---|---|---|---|---|---|---|"]  # fmt: skip
    acc = ["", "accuracy vs SentenceTransformer.encode (cosine, mean / min) on the test texts; batch invariance: "
           "min cosine of a text alone vs in batches of 8 and 32, file order and shuffled (bar 0.99999)",
           "| variant | alone mean / min | batch 32 mean / min | invariance min cos | worst text |",
           "|---|---|---|---|---|"]  # fmt: skip
    for r in result["rows"]:
        if "unavailable" in r:
            lines.append(f"| {r['variant']} | unavailable: {r['unavailable']} |||||||||")
            continue

        def ms(shape: str, clock: str) -> str:
            v = r[shape][clock]
            return f"{np.median(v):.2f} [{min(v):.2f}-{max(v):.2f}]"

        def x(shape: str, clock: str) -> str:
            q = r[shape].get(f"x_best_{clock}")
            return f"{q['median']:.2f}x ({q['worst']:.2f}x)" if q else ""

        cells = [ms("real", "wall_ms"), ms("real", "cpu_ms"), x("real", "wall_ms"), x("real", "cpu_ms"),
                 ms("fixed", "wall_ms"), ms("fixed", "cpu_ms"), x("fixed", "wall_ms"), x("fixed", "cpu_ms"),
                 f"{r['mb']:.1f}"]  # fmt: skip
        lines.append(f"| {r['variant']} | " + " | ".join(cells) + " |")
        a, b = r["alone"], r["batch32"]
        acc.append(f"| {r['variant']} | {a['mean']:.5f} / {a['min']:.5f} | {b['mean']:.5f} / {b['min']:.5f} | "
                   f"{r['invariance_min_cosine']:.7f} | {r['worst_text'][:50]} |")  # fmt: skip
    return "\n".join(lines + acc)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--checkpoint", default="minilm", help="minilm or a sentence-transformers checkpoint folder")
    ap.add_argument("--ours", type=Path, default=None, help="an attn-export run folder: time its model.int8.onnx")
    ap.add_argument("--ours-dir", type=Path, default=None, help="build ours into this new folder (kept for --ours)")
    ap.add_argument("--peers-only", action="store_true", help="no ours: the peers and eager only")
    ap.add_argument("--optimum-cli", default=None, help="optimum-cli of an environment with optimum-onnx[onnxruntime]")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--max-len", type=int, default=128, help="token limit of the test texts")
    ap.add_argument("--fixed-seq", type=int, default=128)
    ap.add_argument("--fixed-calls", type=int, default=20, help="calls of the fixed input per repeat")
    ap.add_argument("--fp32-rows", action="store_true", help="also our model.onnx and optimum's fp32 export")
    ap.add_argument("--cache", type=Path, default=Path.home() / ".cache" / "attn-export" / "bench-peers",
                    help="where the peers are built once")  # fmt: skip
    ap.add_argument("--json", type=Path, default=None)
    ap.add_argument("--quiet", action="store_true")
    args = ap.parse_args(argv)
    result = run(args)
    if args.json:  # first: a long run's figures survive a formatting problem
        args.json.write_text(json.dumps(result, indent=2, default=str) + "\n", encoding="utf-8")
    print(format_tables(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())
