"""Render a report.json (and optionally a bench JSON) to report.md and a self-contained report.html.

The HTML embeds every plot as a base64 data URI and its CSS inline, so the one file can be
attached to a CI run, mailed or opened offline and still shows everything. The Markdown
links the PNGs written beside it, for repositories and PR comments.
"""

from __future__ import annotations

import base64
import html
import json
import logging
import os
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import numpy as np

from attn_export.validate.report import atomic_write_text, load_report

__all__ = ["attention_maps_for_report", "write_reports"]

log = logging.getLogger(__name__)

_COLUMNS = ("stage", "precision", "cosine", "sqnr dB", "rel_l2", "max_abs", "p50 ms", "p90 ms", "eager p50 ms", "speedup", "size", "passed")
_TITLES = {
    "latency": "Latency per stage and speedup vs eager",
    "pareto": "Accuracy vs latency (Pareto front highlighted)",
    "error_histograms": "Error histogram per stage",
    "seq_scaling": "Latency and peak memory vs sequence length",
    "attention_maps": "Attention maps per head: eager vs exported",
}


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


def _header(report: Mapping[str, Any]) -> list[tuple[str, str]]:
    out = []
    for key in ("model", "inputs", "environment"):
        val = report.get(key) or {}
        if val:
            out.append((key, ", ".join(f"{k}={v}" for k, v in val.items())))
    return out


def attention_maps_for_report(report: Mapping[str, Any], report_dir: Path, max_seq: int = 32) -> tuple[np.ndarray, np.ndarray, str] | None:
    """Rebuild the report's reference layer and compare its attention maps with an artifact's.

    The artifact is the last stage's ONNX model that exists (the most compressed one, so the
    plot shows what compression did to each head), found next to the report or at its path.
    Needs ``model`` = {layer, d_model, heads, mask} and ``inputs.seed`` (what the pipeline
    writes); returns None (logged) when the layer cannot be rebuilt or no artifact exists.
    Returns (eager_maps, onnx_maps, stage name).
    """
    from attn_export.layers import MaskedLayer, build_layer
    from attn_export.validate.patterns import check_attention_patterns

    m, inputs = report.get("model") or {}, report.get("inputs") or {}
    if not {"layer", "d_model", "heads"} <= set(m):
        log.info("no attention maps: the report's model is not a reference layer")
        return None
    artifact, name = None, ""
    for s in reversed(report.get("stages", [])):
        path = s.get("artifact")
        if path and str(path).endswith(".onnx"):
            artifact = next((c for c in (report_dir / Path(path).name, Path(path)) if c.is_file()), None)
            name = s["name"]
        if artifact:
            break
    if artifact is None:
        log.info("no attention maps: no ONNX artifact found next to the report")
        return None
    mask = m.get("mask", "none")
    layer = MaskedLayer(build_layer(m["layer"], int(m["d_model"]), int(m["heads"]), mask=mask, seed=int(inputs.get("seed", 0))), mask)
    rng = np.random.default_rng(int(inputs.get("seed", 0)))
    seq = min(int(inputs.get("seq_len", max_seq)), max_seq)
    x = rng.standard_normal((1, seq, int(m["d_model"]))).astype(np.float32)
    kpm = np.ones((1, seq), np.int32) if mask == "padding" else None
    if kpm is not None:
        kpm[:, seq - seq // 4 :] = 0  # a padded tail, so masking shows in the maps
    res = check_attention_patterns(layer, x, artifact, kpm)
    log.info("attention maps of stage %s: %s", name, res)
    return res.eager_maps, res.onnx_maps, name


def _plots(report: Mapping[str, Any], out: Path, bench: Mapping[str, Any] | None, attention: Any, report_dir: Path) -> dict[str, Path]:
    from attn_export.validate import plots

    made: dict[str, Path | None] = {
        "latency": plots.plot_latency(report, out / "latency.png"),
        "pareto": plots.plot_pareto(report, out / "pareto.png"),
        "error_histograms": plots.plot_error_histograms(report, out / "error_histograms.png"),
    }
    if bench is not None:
        made["seq_scaling"] = plots.plot_seq_scaling(bench, out / "seq_scaling.png")
    maps = attention_maps_for_report(report, report_dir) if attention == "auto" else attention
    if maps is not None:
        label = maps[2] if len(maps) > 2 else "ONNX"
        made["attention_maps"] = plots.plot_attention_maps(maps[0], maps[1], out / "attention_maps.png", label=label)
    return {k: v for k, v in made.items() if v is not None}


def _markdown(report: Mapping[str, Any], pngs: Mapping[str, Path]) -> str:
    lines = ["# attn-export report", ""]
    lines += [f"- **{k}**: {v}" for k, v in _header(report)]
    lines += ["", "## Stages", "", "| " + " | ".join(_COLUMNS) + " |", "|" + "---|" * len(_COLUMNS)]
    lines += ["| " + " | ".join(r) + " |" for r in _rows(report)]
    for key, path in pngs.items():
        lines += ["", f"## {_TITLES[key]}", "", f"![{_TITLES[key]}]({path.name})"]
    if report.get("notes"):
        lines += ["", "## Notes", ""] + [f"- {n}" for n in report["notes"]]
    return "\n".join(lines) + "\n"


_CSS = (
    "body{font-family:system-ui,sans-serif;margin:2em auto;max-width:1100px;color:#222}"
    "table{border-collapse:collapse;font-size:13px}td,th{border:1px solid #ccc;padding:3px 8px;text-align:right}"
    "td:first-child,th:first-child{text-align:left}.PASS{color:#1a7f37;font-weight:600}.FAIL{color:#c62828;font-weight:600}"
    "img{max-width:100%;border:1px solid #eee}dt{font-weight:600}"
)


def _html(report: Mapping[str, Any], pngs: Mapping[str, Path]) -> str:
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
    say = progress or (lambda _msg: None)
    report_dir = Path(report).parent if not isinstance(report, Mapping) else Path(out_dir)
    data = dict(report) if isinstance(report, Mapping) else load_report(report)
    bench = json.loads(Path(bench_json).read_text(encoding="utf-8")) if isinstance(bench_json, (str, os.PathLike)) else bench_json
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    say("drawing plots")
    pngs = _plots(data, out, bench, attention, report_dir)
    say("writing report.md and report.html")
    md = atomic_write_text(out / "report.md", _markdown(data, pngs))
    page = atomic_write_text(out / "report.html", _html(data, pngs))
    log.info("wrote %s and %s with %d plots", md, page, len(pngs))
    return {"report.md": md, "report.html": page, **{f"{k}.png": v for k, v in pngs.items()}}
