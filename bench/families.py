"""Every supported encoder family, fp32 and int8, as a user runs it: one row per family and head, from the main command.

    python bench/families.py [--hidden 64] [--layers 2] [--max-texts 48] [--families bert,mpnet] [--json PATH]

For each ``model_type`` the project supports (``checkpoint.families.SUPPORTED_MODEL_TYPES``; a family
without a row here is an error, so a new family comes with its figures) and each head (the bare
encoder, ``...ForSequenceClassification``, ``...ForTokenClassification``), a random-init model is
built by transformers (``AutoModel...from_config``, ``save_pretrained``), its LayerNorms and heads
moved off their init (as the tests do: a swapped key or a wrong head then shows), with a
character-level WordPiece ``tokenizer.json`` carrying the family's special ids (the tests' own
builder, ``tests/checkpoint/hf_models.char_tokenizer``), so the shipped corpus tokenizes to real tokens.

Each row is ``attn-export --checkpoint DIR --quantize int8`` (default routes, ONNX Runtime CPU),
read back from its ``report.json``:

- fidelity at load: our re-implementation vs transformers' own forward (min cosine / max abs);
- fp32 ONNX (the shipped fp32 form) on the report split vs transformers: the judged output's
  mean / min cosine (the sentence embedding for a bare encoder; logits for a head, with label
  agreement);
- the int8 model the run ships: its route, the same figures, and its size against fp32.

Random weights say nothing about a real checkpoint's int8 accuracy (real weights: bench/minilm.py,
bench/mpnet.py); what this shows is that every family and head goes through the whole path, exact in
fp32, with the 8-bit figures its users would read. The CPU and the 1-minute load are printed.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import tempfile
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests" / "checkpoint"))

# model_type -> (special tokens in id order, cls, sep, unk, pad, config overrides as the released checkpoints ship)
_BERT_SPECIALS = (["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"], "[CLS]", "[SEP]", "[UNK]", "[PAD]")
_ROBERTA_SPECIALS = (["<s>", "<pad>", "</s>", "<unk>", "<mask>"], "<s>", "</s>", "<unk>", "<pad>")
_ROBERTA_LIKE = {"type_vocab_size": 1, "pad_token_id": 1, "layer_norm_eps": 1e-5}
FAMILY_ROWS: dict[str, tuple[tuple, dict[str, Any]]] = {
    "bert": (_BERT_SPECIALS, {}),
    "roberta": (_ROBERTA_SPECIALS, _ROBERTA_LIKE),
    "xlm-roberta": (_ROBERTA_SPECIALS, _ROBERTA_LIKE),
    "camembert": (_ROBERTA_SPECIALS, {"pad_token_id": 1}),
    "distilbert": (_BERT_SPECIALS, {}),
    "electra": (_BERT_SPECIALS, {"embedding_size": 32}),
    "albert": (_BERT_SPECIALS, {"embedding_size": 32}),
    "mpnet": (_ROBERTA_SPECIALS, {"pad_token_id": 1}),
    # v3's settings: disentangled attention over log buckets, no absolute positions, no token types
    "deberta-v2": (_BERT_SPECIALS, {"relative_attention": True, "position_buckets": 32, "max_relative_positions": -1, "pos_att_type": "p2c|c2p",
                                    "norm_rel_ebd": "layer_norm", "share_att_key": True, "position_biased_input": False, "type_vocab_size": 0}),
    # the special ids inside the small vocabulary; layer 1 local (a window of 16)
    "modernbert": (_BERT_SPECIALS, {"pad_token_id": 0, "bos_token_id": 2, "eos_token_id": 3, "cls_token_id": 2, "sep_token_id": 3, "local_attention": 16}),
}
HEADS: dict[str, str] = {"bare": "AutoModel", "sequence": "AutoModelForSequenceClassification", "token": "AutoModelForTokenClassification"}
LABELS = {"sequence": 3, "token": 5}


def _sizes(model_type: str, hidden: int, layers: int) -> dict[str, Any]:
    heads = max(1, hidden // 16)
    if model_type == "distilbert":  # its own key names
        return {"dim": hidden, "n_heads": heads, "n_layers": layers, "hidden_dim": 4 * hidden}
    return {"hidden_size": hidden, "num_attention_heads": heads, "num_hidden_layers": layers, "intermediate_size": 4 * hidden}


def build(model_type: str, head: str, folder: Path, hidden: int, layers: int) -> Path:
    """A random-init transformers model of ``model_type`` with ``head``, saved with its tokenizer in ``folder``."""
    import torch
    import transformers
    from hf_models import char_tokenizer

    (specials, cls, sep, unk, pad), overrides = FAMILY_ROWS[model_type]
    folder.mkdir(parents=True)
    vocab = char_tokenizer(folder, specials, cls, sep, unk, pad=(specials.index(pad), pad))
    kwargs = {**_sizes(model_type, hidden, layers), **overrides, "vocab_size": vocab, "max_position_embeddings": 160}
    if head in LABELS:
        kwargs["num_labels"] = LABELS[head]
    config = transformers.AutoConfig.for_model(model_type, **kwargs)
    torch.manual_seed(0)
    model = getattr(transformers, HEADS[head]).from_config(config).eval()
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "norm" in name.lower():  # LayerNorm, layer_norm, ModernBERT's *_norm
                p.add_(0.1 * torch.randn_like(p))
            elif "classifier" in name or "pooler" in name:
                p.mul_(20.0)  # logits of a few units: label agreement means something
            elif "relative_attention_bias" in name:
                p.copy_(3.0 * torch.randn_like(p))  # initialised near 0, where a wrong bucket would not show
    model.save_pretrained(str(folder))
    return folder


def _figures(stage: dict[str, Any] | None) -> dict[str, Any]:
    """A judged stage -> the figures its users read on the report split: the judged output's cosines, label agreement, size."""
    if not stage:
        return {}
    details = stage.get("details") or {}
    judged = details.get("embedding") or details.get("logits") or {}  # a bare encoder's sentence embedding, or a head's logits
    out = {"stage": stage["name"], "passed": stage.get("passed"), "size_bytes": stage.get("size_bytes")}
    out.update({k: judged[k] for k in ("mean_cosine", "min_cosine", "label_agreement", "top1_neighbor_agreement") if judged.get(k) is not None})
    return out


def run_one(model_type: str, head: str, work: Path, args: argparse.Namespace) -> dict[str, Any]:
    from attn_export.cli import main

    folder = build(model_type, head, work / f"{model_type}-{head}", args.hidden, args.layers)
    out = work / f"{model_type}-{head}-out"
    flags = ["--checkpoint", str(folder), "--quantize", "int8", "--out", str(out), "--max-texts", str(args.max_texts),
             "--repeats", "1", "--warmup", "0", "--threads", str(args.threads), "--quiet"]  # fmt: skip
    code = main(flags)
    report = json.loads((out / "report.json").read_text(encoding="utf-8")) if (out / "report.json").exists() else {}
    return {"model_type": model_type, "head": head, "exit": code, "report": report}


def summarize(row: dict[str, Any]) -> dict[str, Any]:
    """The figures of one run: fidelity at load, the shipped fp32 form and the shipped int8 model."""
    report = row["report"]
    stages = {s["name"]: s for s in report.get("stages", [])}
    selection = report.get("selection") or {}
    fp32 = stages.get((selection.get("form") or {}).get("stage", ""))
    int8 = stages.get((selection.get("int8") or {}).get("stage", ""))
    fidelity = (report.get("model") or {}).get("fidelity") or {}
    output = (fp32 or {}).get("details", {}).get("output", "sentence_embedding")
    at_load = (fidelity.get("outputs") or {}).get(output, {})
    return {
        "family": row["model_type"], "head": row["head"], "exit": row["exit"], "output": output,
        "fidelity": {k: at_load.get(k) for k in ("min_cosine", "max_abs")},
        "fp32": _figures(fp32), "int8": _figures(int8), "static_float_gemms": _kept_float(stages.get("int8-static")),
    }  # fmt: skip


def _kept_float(stage: dict[str, Any] | None) -> str:
    """The static (TensorRT) route's sensitivity fallback: which GEMM groups it kept in float, of how many."""
    mixed = ((stage or {}).get("details") or {}).get("mixed_precision") or (((stage or {}).get("details") or {}).get("quantization") or {}).get("mixed_precision")
    if not mixed:
        return "-"
    groups = mixed.get("float_groups") or []
    return f"{mixed.get('gemms_in_float', len(groups))}/{mixed.get('gemms_total', '?')}" + (f" ({', '.join(groups)})" if groups else "")


def markdown(rows: list[dict[str, Any]]) -> str:
    """The table docs/encoder.md quotes."""
    lines = ["| family | head (judged output) | fidelity at load: min cos / max abs | fp32 ONNX: min cos (agreement) | int8 shipped | int8: mean / min cos (agreement) | int8 size vs fp32 | static route: GEMMs kept in float |",
             "|---|---|---|---|---|---|---|---|"]  # fmt: skip

    def agree(f: dict[str, Any]) -> str:
        """Label agreement for a head, top-1 neighbour agreement for a sentence embedding."""
        if "label_agreement" in f:
            return f" (labels {f['label_agreement']:.3f})"
        return f" (top-1 {f['top1_neighbor_agreement']:.3f})" if "top1_neighbor_agreement" in f else ""

    def cos(f: dict[str, Any]) -> str:
        return f"{f.get('mean_cosine', float('nan')):.5f} / {f.get('min_cosine', float('nan')):.5f}{agree(f)}"

    for r in rows:
        fid, fp32, int8 = r["fidelity"], r["fp32"], r["int8"]
        fidelity = "-" if fid.get("min_cosine") is None else f"{fid['min_cosine']:.7f} / {fid['max_abs']:.1e}"
        ratio = f"{int8['size_bytes'] / fp32['size_bytes']:.2f}x" if int8.get("size_bytes") and fp32.get("size_bytes") else "-"
        fp32_cell = f"{fp32.get('min_cosine', float('nan')):.6f}{agree(fp32)}"
        lines.append(f"| {r['family']} | {r['head']} ({r['output']}) | {fidelity} | {fp32_cell} | {int8.get('stage', 'none (exit ' + str(r['exit']) + ')')} | "
                     f"{cos(int8) if int8 else '-'} | {ratio} | {r['static_float_gemms']} |")  # fmt: skip
    return "\n".join(lines)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--hidden", type=int, default=64)
    parser.add_argument("--layers", type=int, default=2)
    parser.add_argument("--max-texts", type=int, default=48)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--families", default="", help="comma-separated model_types (default: every supported one)")
    parser.add_argument("--head-kinds", default="bare,sequence,token", help="which models of each family: bare, sequence, token")
    parser.add_argument("--json", type=Path, default=None)
    args = parser.parse_args()

    from attn_export.checkpoint.families import SUPPORTED_MODEL_TYPES

    missing = sorted(set(SUPPORTED_MODEL_TYPES) - set(FAMILY_ROWS))
    if missing:
        print(f"bench/families.py: no row for the supported families {', '.join(missing)}; add them to FAMILY_ROWS", file=sys.stderr)
        return 2
    families = [f for f in args.families.split(",") if f] or list(SUPPORTED_MODEL_TYPES)
    heads = [h for h in args.head_kinds.split(",") if h]
    print(f"cpu: {platform.processor() or platform.machine()}; load {os.getloadavg()[0]:.1f}", flush=True)
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for family in families:
            for head in heads:
                row = summarize(run_one(family, head, Path(tmp), args))
                rows.append(row)
                print(json.dumps(row), flush=True)
    print(markdown(rows))
    print(f"load after: {os.getloadavg()[0]:.1f}")
    if args.json:
        args.json.write_text(json.dumps(rows, indent=1), encoding="utf-8")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
