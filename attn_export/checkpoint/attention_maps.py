"""A checkpoint report's attention maps: one layer's heads, the user's model against the exported ONNX, on one real text.

Issue 33: checkpoint reports had no attention maps and did not say why. The layer path
rebuilds the reference layer from report.json (``validate.attention_report``); a checkpoint
cannot be rebuilt from it, so the run draws these while it holds the model. Eager maps are
the user's model as transformers runs it (``LibraryReference.attentions``, eager attention);
exported maps are the Softmax outputs of a copy of the ONNX file with every main-graph Softmax
added as a graph output (``validate.patterns.expose_softmax``), run in ONNX Runtime.
One text and one layer keep the cost small (MiniLM: ~0.4 s, most of it copying the graph).

A fused attention form (``com.microsoft.MultiHeadAttention``, the ONNX ``Attention`` op,
which the packed encoder uses on ONNX Runtime) has no Softmax to read: the maps then come
from the same precision's padded (decomposed) stage of the same run, and the summary says
so; with none, the section is one line naming why and which export would have them.
"""

from __future__ import annotations

import logging
import tempfile
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from attn_export.errors import AttnExportError
from attn_export.validate.attention_report import AttentionSection, describe_maps, shipped_onnx, stage_file

__all__ = ["MAX_MAP_TOKENS", "MapInputs", "checkpoint_attention_section", "one_text"]

log = logging.getLogger(__name__)

MAX_MAP_TOKENS = 32  # a map of more tokens than this is unreadable at report width
_MAX_TRIED = 3  # files read in search of probabilities (MiniLM: ~0.6 s each): the shipped one and its nearest twins
_FUSED = {
    "MultiHeadAttention": "com.microsoft.MultiHeadAttention",
    "Attention": "the ONNX Attention op",
    "Loop": "a Loop over query blocks",
}


@dataclass(frozen=True)
class MapInputs:
    """What the maps are computed on: the reference's token feed, the exported graph's feed, which layer."""

    tokens: Mapping[str, np.ndarray]  # input_ids, attention_mask[, token_type_ids], (1, S)
    onnx_feed: Mapping[str, np.ndarray]  # what the exported file takes (the tokens, or layer N's hidden states)
    layer: int  # the reference layer whose heads are drawn
    softmax_index: int  # which main-graph Softmax of the exported file is that layer's
    softmax_count: int  # how many Softmax nodes the exported file must have for the index to mean that layer
    text: str


def one_text(
    texts: Sequence[str], input_ids: np.ndarray, attention_mask: np.ndarray, types: np.ndarray | None
) -> tuple[dict[str, np.ndarray], str]:
    """The first text of 8 to ``MAX_MAP_TOKENS`` tokens (else the first text, cut to that many), as a (1, S) feed."""
    lengths = attention_mask.sum(axis=1)
    fits = np.flatnonzero((lengths >= 8) & (lengths <= MAX_MAP_TOKENS))
    i = int(fits[0]) if fits.size else 0
    n = int(min(lengths[i], MAX_MAP_TOKENS))
    feed = {"input_ids": input_ids[i : i + 1, :n], "attention_mask": attention_mask[i : i + 1, :n]}
    if types is not None:
        feed["token_type_ids"] = types[i : i + 1, :n]
    text = texts[i] if i < len(texts) else ""
    return {k: np.ascontiguousarray(v) for k, v in feed.items()}, (text if len(text) <= 80 else text[:77] + "...") + (
        "" if n == lengths[i] else f" (first {n} tokens)"
    )


def _exported_maps(path: Path, inputs: MapInputs) -> tuple[np.ndarray | None, str]:
    """(the layer's probabilities (1, H, S, S), "") from ``path``, or (None, why not); the file is read once."""
    import onnx_ir as ir

    from attn_export.runtime.ort import OrtRunner, SessionFromOnnx
    from attn_export.validate.patterns import expose_softmax

    model = ir.load(path)
    names = expose_softmax(model)
    if not names:
        fused = sorted({_FUSED[n.op_type] for n in model.graph if n.op_type in _FUSED}) or ["no Softmax node"]
        return None, f"{path.name} computes attention in {', '.join(fused)}, which does not output its probabilities"
    if len(names) != inputs.softmax_count:
        return (
            None,
            f"{path.name} has {len(names)} Softmax nodes for {inputs.softmax_count} attention layers, so none can be told to be layer {inputs.layer}'s",
        )
    with tempfile.TemporaryDirectory(prefix="attn-maps-") as tmp:
        ir.save(
            model, Path(tmp) / "maps.onnx", external_data="maps.onnx.data"
        )  # weights beside it: a model over 2 GB saves too
        try:
            with OrtRunner(SessionFromOnnx(Path(tmp) / "maps.onnx")) as runner:
                out = runner.infer({n: np.asarray(inputs.onnx_feed[n]) for n in runner.input_names})
        except Exception as err:  # ONNX Runtime's own errors are plain Exceptions: the report says why, the run goes on
            return (
                None,
                f"ONNX Runtime could not run {path.name} with its Softmax outputs exposed ({' '.join(str(err).split())[:200]})",
            )
    return np.asarray(out[names[inputs.softmax_index]], dtype=np.float32), ""


def _candidates(report: Mapping[str, Any], report_dir: Path) -> list[tuple[Path, Mapping[str, Any], str]]:
    """The shipped ONNX file first, then the run's other stages of its precision and route (its padded twin), then fp32."""
    path, stage, what = shipped_onnx(report, report_dir)
    if path is None or stage is None:
        return []
    out = [(path, stage, what)]
    route = (stage.get("details") or {}).get("route")
    others = [s for s in report.get("stages", []) if s is not stage and s.get("precision") == stage.get("precision")]
    others.sort(key=lambda s: (s.get("details") or {}).get("route") != route)
    for s in [
        *others,
        *(s for s in report.get("stages", []) if s.get("precision") == "fp32" and s not in others and s is not stage),
    ]:
        if (p := stage_file(s, report_dir)) is not None:
            out.append((p, s, f"{p.name} ({s['name']})"))
    return out[:_MAX_TRIED]


def checkpoint_attention_section(
    reference: Any, inputs: MapInputs, report: Mapping[str, Any], report_dir: Path
) -> AttentionSection:
    """The maps of ``inputs.layer``, the reference against the shipped ONNX file (or a stand-in of the run that exposes them);
    a note naming why when none can."""
    tried = _candidates(report, report_dir)
    if not tried:
        return AttentionSection(
            note="no attention maps: the shipped artifact is not an ONNX file found next to the report"
        )
    try:
        eager = reference.attentions(
            *(inputs.tokens[k] for k in ("input_ids", "attention_mask")), inputs.tokens.get("token_type_ids")
        )[inputs.layer]
        why_not: list[str] = []
        for path, stage, what in tried:
            onnx, why = _exported_maps(path, inputs)
            if onnx is None:
                why_not.append(why)
                continue
            if onnx.shape != eager.shape:
                why_not.append(
                    f"{path.name}'s layer-{inputs.layer} probabilities have shape {onnx.shape}, the reference's {eager.shape}"
                )
                continue
            if stage is not tried[0][1]:
                what = f"{what}, standing in for the shipped {tried[0][0].name} ({why_not[0]})"
            summary, _ = describe_maps(eager, onnx, f"{what}, layer {inputs.layer}, on {inputs.text!r}", None)
            summary = summary.replace("eager fp32", "the user's model (transformers, eager)", 1)
            log.info("%s", summary)
            return AttentionSection(eager, onnx, f"{stage['name']} (layer {inputs.layer})", summary)
    except (
        AttnExportError,
        OSError,
        RuntimeError,
        ValueError,
    ) as err:  # best effort: the report says why, the run goes on
        log.warning("attention maps not drawn: %s", err)
        return AttentionSection(note=f"no attention maps: {' '.join(str(err).split())[:300]}")
    return AttentionSection(
        note=f"no attention maps: {why_not[0]}; a --encoder-form padded --attention decomposed export has one Softmax per layer to read them from"
    )
