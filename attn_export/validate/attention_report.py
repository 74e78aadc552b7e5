"""The report's attention-maps section: the shipped artifact's softmax probabilities per head against eager.

Output metrics can hide a head that attends to the wrong tokens; the maps show each head. It
is a diagnostic of the file the run ships (``validate.headline.shipped``), not a second
verdict: the stage is judged on its outputs. It only says FAIL when the shipped stage's own
tolerance bounds absolute differences (``max_abs``: the exact fp32 export, 1e-4) and a
probability differs by more. An 8-bit or fp16 stage is held to relative error and cosine on
its outputs, which say nothing about one probability, so its maps are reported as measured
(issue 23: a passing int8 run printed "attention maps (artifact): FAIL ... (atol 0.0001)",
the fp32 bar applied to an int8 model).

Best effort: a layer without softmax probabilities (linear attention), a report whose model
cannot be rebuilt, or no ONNX artifact gives a note instead of maps, never a failed render.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from attn_export.errors import AttnExportError
from attn_export.validate.headline import shipped
from attn_export.validate.tolerances import TOLERANCES

__all__ = ["AttentionSection", "attention_section", "describe_maps", "shipped_onnx", "stage_file"]

log = logging.getLogger(__name__)

_MAX_REBUILD_D_MODEL = 4096  # a transformer layer of this width is ~200M parameters (0.8 GB) to rebuild


@dataclass
class AttentionSection:
    """What the report shows for attention maps: the maps, or a note saying why there are none."""

    eager_maps: np.ndarray | None = None
    onnx_maps: np.ndarray | None = None
    label: str = "ONNX"
    summary: str = ""  # what was compared, against which bar, and the per-head figures
    note: str = ""
    failed: bool = False  # a probability differs by more than the shipped stage's own max_abs bar


def describe_maps(eager: np.ndarray, onnx: np.ndarray, what: str, max_abs_bar: float | None) -> tuple[str, bool]:
    """(summary line, failed) for maps (B, H, Lq, Lk) of ``what`` against eager; FAIL only above ``max_abs_bar``."""
    e, o = np.asarray(eager, np.float64), np.asarray(onnx, np.float64)
    heads = e.shape[1]
    max_abs = [float(np.abs(e[:, h] - o[:, h]).max(initial=0.0)) for h in range(heads)]
    rel = [float(np.linalg.norm(e[:, h] - o[:, h]) / max(np.linalg.norm(e[:, h]), 1e-30)) for h in range(heads)]
    worst = int(np.argmax(max_abs))
    figures = f"worst head {worst}: max |diff| {max_abs[worst]:.2g}, rel_l2 {rel[worst]:.2g}; per head max |diff|: " + ", ".join(
        f"h{i}={m:.2g}" for i, m in enumerate(max_abs)
    )
    if max_abs_bar is None:
        return f"attention maps, eager fp32 vs {what}, per head (diagnostic: the stage is judged on its outputs): {figures}", False
    failed = max_abs[worst] > max_abs_bar
    verdict = f"FAIL: above the stage's max_abs bar {max_abs_bar:g}" if failed else f"within the stage's max_abs bar {max_abs_bar:g}"
    return f"attention maps, eager fp32 vs {what}, per head: {verdict}; {figures}", failed


def stage_file(stage: Mapping[str, Any], report_dir: Path, names: tuple[str, ...] = ()) -> Path | None:
    """A stage's ONNX file: by ``names`` or its own file name beside the report, else at its recorded path; None if absent."""
    artifact = str(stage.get("artifact") or "")
    if not artifact.endswith(".onnx"):
        return None
    for candidate in [*(report_dir / n for n in (*names, Path(artifact).name) if n), Path(artifact)]:
        if candidate.is_file():
            return candidate
    return None


def shipped_onnx(report: Mapping[str, Any], report_dir: Path) -> tuple[Path | None, Mapping[str, Any] | None, str]:
    """The shipped ONNX file (beside the report, or at its recorded path), its stage, and how to name it."""
    ship = shipped(report)
    stage = ship.stage
    if stage is None or not str(stage.get("artifact") or "").endswith(".onnx"):
        return None, None, ""
    path = stage_file(stage, report_dir, (ship.file,) if ship.file else ())
    if path is None:
        return None, stage, ""
    return path, stage, f"{path.name} ({stage['name']}, the shipped artifact)"


def attention_section(report: Mapping[str, Any], report_dir: Path, max_seq: int = 32) -> AttentionSection:
    """Rebuild the report's reference layer and compare its attention maps with the shipped artifact's.

    Needs ``model`` = {layer, d_model, heads, mask} and ``inputs.seed`` (what the pipeline
    writes). Anything that prevents maps becomes ``note`` instead of an error.
    """
    from attn_export.layers import MaskedLayer, build_layer
    from attn_export.layers.registry import LAYERS
    from attn_export.validate.patterns import check_attention_patterns, has_attention_maps

    m, inputs = report.get("model") or {}, report.get("inputs") or {}
    if m.get("checkpoint"):  # validate/ sits below checkpoint/: the run that holds the model draws them (checkpoint.attention_maps)
        return AttentionSection(note="no attention maps: a checkpoint's maps are drawn by the run that loads it (attn-export --checkpoint ...); "
                                "re-rendering report.json alone cannot load the model")  # fmt: skip
    if not {"layer", "d_model", "heads"} <= set(m) or m["layer"] not in LAYERS:
        return AttentionSection(note=f"no attention maps: the report's model ({m.get('layer', 'unnamed')}) is not a reference layer that can be rebuilt")
    if int(m["d_model"]) > _MAX_REBUILD_D_MODEL:
        return AttentionSection(note=f"no attention maps: d_model {m['d_model']} is too large to rebuild for them (limit {_MAX_REBUILD_D_MODEL})")
    mask = m.get("mask") or "none"
    seed = int(inputs.get("seed") or 0)
    try:
        kwargs = {k: int(m[k]) for k in ("window", "block_size") if isinstance(m.get(k), int)}
        layer = MaskedLayer(build_layer(m["layer"], int(m["d_model"]), int(m["heads"]), mask=mask, seed=seed, **kwargs), mask)
        if not has_attention_maps(layer):
            return AttentionSection(
                note=f"no attention maps: the {m['layer']} layer computes no softmax attention probabilities "
                "(kernelised attention never forms the L x L matrix); its output metrics above are the check"
            )
    except AttnExportError as err:
        return AttentionSection(note=f"no attention maps: {err}")
    artifact, stage, what = shipped_onnx(report, report_dir)
    if artifact is None or stage is None:
        return AttentionSection(note="no attention maps: the shipped ONNX artifact was not found next to the report")
    rng = np.random.default_rng(seed)
    block = getattr(layer.layer, "block_size", 0)  # block-sparse: show at least two blocks
    seq = min(int(inputs.get("seq_len") or max_seq), max(max_seq, 2 * block))
    x = rng.standard_normal((1, seq, int(m["d_model"]))).astype(np.float32)
    kpm = np.ones((1, seq), np.int32) if mask == "padding" else None
    if kpm is not None:
        kpm[:, seq - seq // 4 :] = 0  # a padded tail, so masking shows in the maps
    try:
        res = check_attention_patterns(layer, x, artifact, kpm)
    except AttnExportError as err:
        log.warning("attention maps of stage %s not drawn: %s", stage["name"], err)
        return AttentionSection(note=f"no attention maps for stage {stage['name']}: {err}")
    if res.source != "artifact":  # fused attention has no Softmax output: the maps are of an fp32 decomposed re-export
        what = f"a decomposed fp32 re-export of the layer ({artifact.name} fuses its attention, so its probabilities cannot be read)"
    bar = (stage.get("tolerance") or {}).get("max_abs") if res.source == "artifact" else TOLERANCES["fp32"].tensor.max_abs
    summary, failed = describe_maps(res.eager_maps, res.onnx_maps, what, None if bar is None else float(bar))
    log.info("%s", summary)
    return AttentionSection(res.eager_maps, res.onnx_maps, stage["name"], summary, failed=failed)
