"""Render a report.json (and optionally a bench JSON) to report.md and a self-contained report.html.

The HTML embeds every plot as a base64 data URI and its CSS inline, so the one file can be
attached to a CI run, mailed or opened offline and still shows everything. The Markdown
links the PNGs written beside it, for repositories and PR comments.

Every string that comes from report.json (stage names, notes, environment values) is data,
not markup: the HTML escapes it, and the Markdown escapes HTML and Markdown syntax (``<``,
``|``, ``*``, ``[``...) and folds newlines, so a note cannot inject a tag or break a table.
The attention-maps section is best effort: a layer without softmax probabilities (linear
attention), a report whose model cannot be rebuilt, or no ONNX artifact gives a note in the
report instead of maps, never a failed render.
"""

from __future__ import annotations

import base64
import html
import logging
import os
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from attn_export.errors import AttnExportError
from attn_export.validate.report import atomic_write_text, load_report

__all__ = ["AttentionSection", "attention_section", "markdown_escape", "write_reports"]

log = logging.getLogger(__name__)

_COLUMNS = ("stage", "precision", "cosine", "sqnr dB", "rel_l2", "max_abs", "p50 ms", "p90 ms", "eager p50 ms", "speedup", "size", "passed")
_TITLES = {
    "latency": "Latency per stage and speedup vs eager",
    "pareto": "Accuracy vs latency (Pareto front highlighted)",
    "error_histograms": "Error histogram per stage",
    "seq_scaling": "Latency and peak memory vs sequence length",
    "attention_maps": "Attention maps per head: eager vs exported",
    "sensitivity": "int8 sensitivity per GEMM group and the float fallback",
}
_MP_COLUMNS = ("stage", "gemm", "group", "precision", "sensitivity", "rank", "fallback latency cost ms")


def _fmt(v: Any, spec: str) -> str:
    return "-" if v is None else format(v, spec)


def _rows(report: Mapping[str, Any]) -> list[tuple[str, ...]]:
    rows = []
    for s in report.get("stages", []):
        a = s.get("accuracy") or {}
        lat = s.get("latency_ms") or {}
        art, eag = lat.get("artifact") or {}, lat.get("eager") or {}
        size = s.get("size_bytes")
        rows.append((
            s.get("name", "?"), s.get("precision", "?"), _fmt(a.get("cosine"), ".6f"), _fmt(a.get("sqnr_db"), ".1f"),
            _fmt(a.get("rel_l2"), ".2e"), _fmt(a.get("max_abs"), ".2e"), _fmt(art.get("p50"), ".2f"), _fmt(art.get("p90"), ".2f"),
            _fmt(eag.get("p50"), ".2f"), "-" if s.get("speedup_vs_eager") is None else f"{s['speedup_vs_eager']:.2f}x",
            "-" if size is None else f"{size / 2**20:.2f} MiB", {True: "PASS", False: "FAIL"}.get(s.get("passed"), "-"),
        ))  # fmt: skip
    return rows


def _value(v: Any) -> str:
    """A header value on one line: nested objects as k=v, lists comma-separated."""
    if isinstance(v, Mapping):
        return "{" + ", ".join(f"{k}={_value(x)}" for k, x in v.items()) + "}"
    if isinstance(v, (list, tuple)):
        return "[" + ", ".join(_value(x) for x in v) + "]"
    return str(v)


def _header(report: Mapping[str, Any]) -> list[tuple[str, str]]:
    out = []
    for key in ("model", "inputs", "environment"):
        val = report.get(key) or {}
        if val:
            out.append((key, ", ".join(f"{k}={_value(v)}" for k, v in val.items())))
    return out


# The punctuation that can start markup mid-line ("#", "+" and "-" only matter at a line
# start, and every line here starts with "- " or "| "; "(" and "!" only after "]" or before "[").
_MD_SPECIAL = re.compile(r"([\\`*_\[\]|~])")


def markdown_escape(text: Any) -> str:
    """Text from report.json as inert Markdown: HTML entities for ``& < >``, backslash escapes
    for Markdown punctuation (CommonMark allows one before any ASCII punctuation), one line."""
    t = html.escape(" ".join(str(text).split()), quote=False)
    return _MD_SPECIAL.sub(r"\\\1", t)


_MAX_REBUILD_D_MODEL = 4096  # a transformer layer of this width is ~200M parameters (0.8 GB) to rebuild


@dataclass
class AttentionSection:
    """What the report shows for attention maps: the maps, or a note saying why there are none."""

    eager_maps: np.ndarray | None = None
    onnx_maps: np.ndarray | None = None
    label: str = "ONNX"
    summary: str = ""  # the per-head comparison (AttentionPatternResult's str)
    note: str = ""


def attention_section(report: Mapping[str, Any], report_dir: Path, max_seq: int = 32) -> AttentionSection:
    """Rebuild the report's reference layer and compare its attention maps with an artifact's.

    The artifact is the last stage's ONNX model that exists (the most compressed one, so the
    plot shows what compression did to each head), found next to the report or at its path.
    Needs ``model`` = {layer, d_model, heads, mask} and ``inputs.seed`` (what the pipeline
    writes). Anything that prevents maps (linear attention, a model that is not a reference
    layer or too large to rebuild here, no ONNX artifact, a comparison that cannot run)
    becomes ``note`` instead of an error; maps that disagree are drawn, with FAIL in ``summary``.
    """
    from attn_export.layers import MaskedLayer, build_layer
    from attn_export.layers.registry import LAYERS
    from attn_export.validate.patterns import check_attention_patterns, has_attention_maps

    m, inputs = report.get("model") or {}, report.get("inputs") or {}
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
    artifact, name = None, ""
    for s in reversed(report.get("stages", [])):
        path = s.get("artifact")
        if path and str(path).endswith(".onnx"):
            artifact = next((c for c in (report_dir / Path(path).name, Path(path)) if c.is_file()), None)
            name = s["name"]
        if artifact:
            break
    if artifact is None:
        return AttentionSection(note="no attention maps: no ONNX artifact found next to the report")
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
        log.warning("attention maps of stage %s not drawn: %s", name, err)
        return AttentionSection(note=f"no attention maps for stage {name}: {err}")
    log.info("attention maps of stage %s: %s", name, res)
    return AttentionSection(res.eager_maps, res.onnx_maps, name, str(res))


def _plots(
    report: Mapping[str, Any], out: Path, bench: Mapping[str, Any] | None, attention: Any, report_dir: Path
) -> tuple[dict[str, Path], AttentionSection | None]:
    from attn_export.validate import plots

    made: dict[str, Path | None] = {
        "latency": plots.plot_latency(report, out / "latency.png"),
        "pareto": plots.plot_pareto(report, out / "pareto.png"),
        "error_histograms": plots.plot_error_histograms(report, out / "error_histograms.png"),
        "sensitivity": plots.plot_sensitivity(report, out / "sensitivity.png"),
    }
    if bench is not None:
        made["seq_scaling"] = plots.plot_seq_scaling(bench, out / "seq_scaling.png")
    section: AttentionSection | None = None
    if attention == "auto":
        section = attention_section(report, report_dir)
    elif attention is not None:
        section = AttentionSection(attention[0], attention[1], attention[2] if len(attention) > 2 else "ONNX")
    if section is not None and section.eager_maps is not None and section.onnx_maps is not None:
        made["attention_maps"] = plots.plot_attention_maps(section.eager_maps, section.onnx_maps, out / "attention_maps.png", label=section.label)
    return {k: v for k, v in made.items() if v is not None}, section


def _mixed_precision(report: Mapping[str, Any]) -> tuple[list[str], list[tuple[str, ...]]]:
    """Per static int8 stage: a summary line, and one row per GEMM (precision, sensitivity, fallback cost)."""
    lines: list[str] = []
    rows: list[tuple[str, ...]] = []
    for s in report.get("stages", []):
        mp = (s.get("details") or {}).get("mixed_precision")
        if not mp:
            continue
        cost = ""
        if mp.get("latency_ms_all_int8") and mp.get("latency_ms_mixed"):
            cost = (f"; latency {mp['latency_ms_all_int8']:.2f} -> {mp['latency_ms_mixed']:.2f} ms ({100 * mp.get('latency_cost', 0):+.1f}%, "
                    f"{mp.get('latency_note', '')})")  # fmt: skip
        goal = ", ".join(f"{k} {v}" for k, v in (mp.get("goal") or {}).items())
        met = {True: "met", False: "NOT met", None: "-"}.get(mp.get("met"))
        lines.append(f"{s.get('name')}: fallback {mp.get('mode')}, {mp.get('gemms_in_float', 0)}/{mp.get('gemms_total', 0)} GEMMs kept in "
                     f"{mp.get('float_precision')} ({', '.join(mp.get('float_groups') or []) or 'none'}); goal ({goal}) {met} on the select split{cost}")  # fmt: skip
        for g in mp.get("gemms", []):
            rows.append((
                s.get("name", "?"), g.get("gemm", "?"), g.get("group", "?"), g.get("precision", "?"), _fmt(g.get("sensitivity"), ".2e"),
                _fmt(g.get("rank"), "d"), _fmt(g.get("latency_cost_ms"), ".2f"),
            ))  # fmt: skip
    return lines, rows


def _markdown(report: Mapping[str, Any], pngs: Mapping[str, Path], section: AttentionSection | None = None) -> str:
    esc = markdown_escape
    lines = ["# attn-export report", ""]
    lines += [f"- **{esc(k)}**: {esc(v)}" for k, v in _header(report)]
    lines += ["", "## Stages", "", "| " + " | ".join(_COLUMNS) + " |", "|" + "---|" * len(_COLUMNS)]
    lines += ["| " + " | ".join(esc(c) for c in r) + " |" for r in _rows(report)]
    for key, path in pngs.items():
        lines += ["", f"## {_TITLES[key]}", "", f"![{_TITLES[key]}]({path.name})"]
        if key == "attention_maps" and section is not None and section.summary:
            lines += ["", esc(section.summary)]
    if section is not None and section.note:
        lines += ["", f"## {_TITLES['attention_maps']}", "", esc(section.note)]
    mp_lines, mp_rows = _mixed_precision(report)
    if mp_lines:
        lines += ["", "## int8 precision per GEMM", ""] + [f"- {esc(x)}" for x in mp_lines]
        lines += ["", "| " + " | ".join(_MP_COLUMNS) + " |", "|" + "---|" * len(_MP_COLUMNS)]
        lines += ["| " + " | ".join(esc(c) for c in r) + " |" for r in mp_rows]
    if report.get("notes"):
        lines += ["", "## Notes", ""] + [f"- {esc(n)}" for n in report["notes"]]
    return "\n".join(lines) + "\n"


_CSS = (
    "body{font-family:system-ui,sans-serif;margin:2em auto;max-width:1100px;color:#222}"
    "table{border-collapse:collapse;font-size:13px}td,th{border:1px solid #ccc;padding:3px 8px;text-align:right}"
    "td:first-child,th:first-child{text-align:left}.PASS{color:#1a7f37;font-weight:600}.FAIL{color:#c62828;font-weight:600}"
    "img{max-width:100%;border:1px solid #eee}dt{font-weight:600}"
)


def _html(report: Mapping[str, Any], pngs: Mapping[str, Path], section: AttentionSection | None = None) -> str:
    esc = html.escape
    head = "".join(f"<dt>{esc(k)}</dt><dd>{esc(v)}</dd>" for k, v in _header(report))
    th = "".join(f"<th>{esc(c)}</th>" for c in _COLUMNS)
    trs = "".join(
        "<tr>" + "".join(f'<td class="{esc(c)}">{esc(c)}</td>' if i == len(r) - 1 else f"<td>{esc(c)}</td>" for i, c in enumerate(r)) + "</tr>"
        for r in _rows(report)
    )
    figs = ""
    for key, path in pngs.items():
        data = base64.b64encode(path.read_bytes()).decode("ascii")
        figs += f'<h2>{esc(_TITLES[key])}</h2><img id="plot-{key}" alt="{esc(_TITLES[key])}" src="data:image/png;base64,{data}">'
        if key == "attention_maps" and section is not None and section.summary:
            figs += f"<p>{esc(section.summary)}</p>"
    if section is not None and section.note:
        figs += f'<h2>{esc(_TITLES["attention_maps"])}</h2><p id="attention-note">{esc(section.note)}</p>'
    mp_lines, mp_rows = _mixed_precision(report)
    if mp_lines:
        figs += '<h2>int8 precision per GEMM</h2><ul id="mixed-precision">' + "".join(f"<li>{esc(x)}</li>" for x in mp_lines) + "</ul>"
        figs += "<table><tr>" + "".join(f"<th>{esc(c)}</th>" for c in _MP_COLUMNS) + "</tr>"
        figs += "".join("<tr>" + "".join(f"<td>{esc(c)}</td>" for c in r) + "</tr>" for r in mp_rows) + "</table>"
    notes = "".join(f"<li>{esc(n)}</li>" for n in report.get("notes", []))
    return (
        f'<!DOCTYPE html><html lang="en"><head><meta charset="utf-8"><title>attn-export report</title><style>{_CSS}</style></head>'
        f"<body><h1>attn-export report</h1><dl>{head}</dl><h2>Stages</h2><table><tr>{th}</tr>{trs}</table>{figs}"
        + (f"<h2>Notes</h2><ul>{notes}</ul>" if notes else "")
        + "</body></html>\n"
    )


def write_reports(
    report: str | os.PathLike[str] | Mapping[str, Any],
    out_dir: str | os.PathLike[str],
    bench_json: str | os.PathLike[str] | Mapping[str, Any] | None = None,
    attention: str | tuple[np.ndarray, np.ndarray] | tuple[np.ndarray, np.ndarray, str] | None = "auto",
    progress: Callable[[str], None] | None = None,
) -> dict[str, Path]:
    """Write the PNGs, report.md and report.html into ``out_dir``; returns name -> path.

    ``attention="auto"`` draws attention maps when the report's layer can be rebuilt and an
    ONNX artifact exists; pass ``(eager_maps, onnx_maps[, label])`` to draw given maps, None to skip.
    """
    from attn_export.validate.schema import BenchSchema, read_json, validate, validate_report

    say = progress or (lambda _msg: None)
    report_dir = Path(report).parent if not isinstance(report, Mapping) else Path(out_dir)
    if isinstance(report, Mapping):
        data = dict(report)
        validate_report(data, "report")
    else:
        data = load_report(report)
    bench = bench_json
    bench_fix = "run attn-export bench --json FILE first, or pass the right path"
    if isinstance(bench_json, (str, os.PathLike)):
        bench = read_json(bench_json, "a bench.json from attn-export bench", bench_fix)
    if bench is not None:
        validate(BenchSchema, bench, str(bench_json) if isinstance(bench_json, (str, os.PathLike)) else "bench", bench_fix)
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    say("drawing plots")
    pngs, section = _plots(data, out, bench, attention, report_dir)
    say("writing report.md and report.html")
    md = atomic_write_text(out / "report.md", _markdown(data, pngs, section))
    page = atomic_write_text(out / "report.html", _html(data, pngs, section))
    log.info("wrote %s and %s with %d plots", md, page, len(pngs))
    return {"report.md": md, "report.html": page, **{f"{k}.png": v for k, v in pngs.items()}}
