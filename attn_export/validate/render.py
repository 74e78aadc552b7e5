"""Render a report.json (and optionally a bench JSON) to report.md and a self-contained report.html.

The HTML embeds every plot as a base64 data URI and its CSS inline, so the one file can be
attached to a CI run, mailed or opened offline and still shows everything. The Markdown
links the PNGs written beside it, for repositories and PR comments.

Every string that comes from report.json (stage names, notes, environment values) is data,
not markup: the HTML escapes it, and the Markdown escapes HTML and Markdown syntax (``<``,
``|``, ``*``, ``[``...) and folds newlines, so a note cannot inject a tag or break a table.
Both open with the verdict line (``validate.headline``): PASS/PARTIAL/FAIL, the file that ships
and why, its accuracy on every judged data set, its speed-up and size, then the other selections
(the fp32 form's); in the HTML it is the first element of the page (``id="verdict"``), visible
without scrolling. Below it, the header is labelled tables (``validate.report_header``): model,
inputs and environment, one row per fact, rounded for reading (a Markdown table each;
``<table id="header-model">``...); report.json keeps the exact values. A checkpoint's stage table carries the
figures its tolerance judges (mean and min embedding cosine, top-1 neighbour agreement). The
attention-maps section (``validate.attention_report``; a checkpoint run draws its own,
``checkpoint.attention_maps``) is best effort and never a failed render: no maps is one line saying why.
"""

from __future__ import annotations

import base64
import html
import logging
import os
import re
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path
from typing import Any

import numpy as np

from attn_export.host.memory import format_bytes
from attn_export.validate.attention_report import AttentionSection, attention_section
from attn_export.validate.headline import headline
from attn_export.validate.report import atomic_write_text, load_report
from attn_export.validate.report_header import header_tables

__all__ = ["markdown_escape", "write_reports"]

log = logging.getLogger(__name__)

_COLUMNS = ("stage", "precision", "cosine", "sqnr dB", "rel_l2", "max_abs", "p50 ms", "p90 ms", "eager p50 ms", "speedup", "size", "passed")
# A checkpoint is judged on its sentence embeddings: mean and min cosine and top-1 neighbour agreement replace "cosine".
_EMBEDDING_COLUMNS = ("stage", "precision", "mean cosine", "min cosine", "top-1", "sqnr dB", "rel_l2", "max_abs", "p50 ms", "p90 ms",
                      "eager p50 ms", "speedup", "size", "passed")  # fmt: skip
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


def _embedding(report: Mapping[str, Any]) -> bool:
    return any((s.get("details") or {}).get("embedding") for s in report.get("stages", []))


def _columns(report: Mapping[str, Any]) -> tuple[str, ...]:
    return _EMBEDDING_COLUMNS if _embedding(report) else _COLUMNS


def _rows(report: Mapping[str, Any]) -> list[tuple[str, ...]]:
    embedding = _embedding(report)
    rows = []
    for s in report.get("stages", []):
        a = s.get("accuracy") or {}
        lat = s.get("latency_ms") or {}
        art, eag = lat.get("artifact") or {}, lat.get("eager") or {}
        size = s.get("size_bytes")
        emb = (s.get("details") or {}).get("embedding") or {}
        top1 = emb.get("top1_neighbor_agreement")
        cosines = ((_fmt(emb.get("mean_cosine"), ".6f"), _fmt(emb.get("min_cosine"), ".6f"), "-" if top1 is None else f"{100 * top1:.1f}%")
                   if embedding else (_fmt(a.get("cosine"), ".6f"),))  # fmt: skip
        rows.append((
            s.get("name", "?"), s.get("precision", "?"), *cosines, _fmt(a.get("sqnr_db"), ".1f"),
            _fmt(a.get("rel_l2"), ".2e"), _fmt(a.get("max_abs"), ".2e"), _fmt(art.get("p50"), ".2f"), _fmt(art.get("p90"), ".2f"),
            _fmt(eag.get("p50"), ".2f"), "-" if s.get("speedup_vs_eager") is None else f"{s['speedup_vs_eager']:.2f}x",
            "-" if size is None else format_bytes(size), {True: "PASS", False: "FAIL"}.get(s.get("passed"), "-"),
        ))  # fmt: skip
    return rows


# The punctuation that can start markup mid-line ("#", "+" and "-" only matter at a line
# start, and every line here starts with "- " or "| "; "(" and "!" only after "]" or before "[").
_MD_SPECIAL = re.compile(r"([\\`*_\[\]|~])")


def markdown_escape(text: Any) -> str:
    """Text from report.json as inert Markdown: HTML entities for ``& < >``, backslash escapes
    for Markdown punctuation (CommonMark allows one before any ASCII punctuation), one line."""
    t = html.escape(" ".join(str(text).split()), quote=False)
    return _MD_SPECIAL.sub(r"\\\1", t)


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
    elif isinstance(attention, AttentionSection):  # drawn by the run (a checkpoint's: checkpoint.attention_maps)
        section = attention
    elif attention is not None:
        section = AttentionSection(attention[0], attention[1], attention[2] if len(attention) > 2 else "ONNX")
    if section is not None and section.eager_maps is not None and section.onnx_maps is not None:
        made["attention_maps"] = plots.plot_attention_maps(section.eager_maps, section.onnx_maps, out / "attention_maps.png", label=section.label)
    return {k: v for k, v in made.items() if v is not None}, section


def _stages_with(report: Mapping[str, Any], key: str) -> Iterator[tuple[Mapping[str, Any], Any]]:
    """Each stage whose details carry ``key``, with that entry (the mixed-precision and attestation sections read it)."""
    for s in report.get("stages", []):
        entry = (s.get("details") or {}).get(key)
        if entry:
            yield s, entry


def _mixed_precision(report: Mapping[str, Any]) -> tuple[list[str], list[tuple[str, ...]]]:
    """Per static int8 stage: a summary line, and one row per GEMM (precision, sensitivity, fallback cost)."""
    lines: list[str] = []
    rows: list[tuple[str, ...]] = []
    for s, mp in _stages_with(report, "mixed_precision"):
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


_ATTEST_COLUMNS = ("engine", "GEMM group", "planned", "runs", "engine layers", "status")


def _attestation(report: Mapping[str, Any]) -> tuple[list[str], list[tuple[str, ...]]]:
    """Per engine stage: what its inspector showed (``runtime.tensorrt.attest``), a line each, and one row per GEMM group."""
    from attn_export.runtime.tensorrt.attest import Attestation

    lines: list[str] = []
    rows: list[tuple[str, ...]] = []
    for s, data in _stages_with(report, "attestation"):
        att = Attestation.from_dict(data)
        lines += [f"{s.get('name')}: {att.describe()}"] + [f"{s.get('name')}: {v}" for v in att.violations]
        rows += [(s.get("name", "?"), g.group, g.requested, "/".join(g.actual) or "-", str(len(g.layers)), "ok" if g.ok else "WIDER")
                 for g in att.groups]  # fmt: skip
    return lines, rows


_INPUT_COLUMNS = ("stage", "timed on", "padding", "p50 ms", "eager p50 ms", "speedup")


def _latency_by_input(report: Mapping[str, Any]) -> list[tuple[str, ...]]:
    """One row per stage and timing input (real-text batches, the fixed shape), when a run timed more than one."""
    rows = []
    for s in report.get("stages", []):
        for label, lat in ((s.get("details") or {}).get("latency_by_input") or {}).items():
            art, eag = (lat.get("artifact") or {}).get("p50"), (lat.get("eager") or {}).get("p50")
            pad = lat.get("padding_fraction")
            rows.append((s.get("name", "?"), str(label), "-" if pad is None else f"{100 * pad:.0f}%", _fmt(art, ".2f"), _fmt(eag, ".2f"),
                         f"{eag / art:.2f}x" if art and eag else "-"))  # fmt: skip
    return rows


def _markdown(report: Mapping[str, Any], pngs: Mapping[str, Path], section: AttentionSection | None = None) -> str:
    esc = markdown_escape
    line = headline(report)
    # the verdict is the file's first line, as it is the page's first element and the console's first line (issue 33)
    lines = [f"**{line.verdict}** · " + " · ".join(esc(x) for x in line.parts()), ""]
    lines += [f"- {esc(x)}" for x in line.below] + ([""] if line.below else []) + ["# attn-export report", ""]
    for table in header_tables(report):  # one labelled table per section, one row per fact (issue 33)
        lines += [f"| {table.title} | |", "|---|---|"] + [f"| {esc(k)} | {esc(v)} |" for k, v in table.rows] + [""]
    columns = _columns(report)
    lines += ["## Stages", "", "| " + " | ".join(columns) + " |", "|" + "---|" * len(columns)]
    lines += ["| " + " | ".join(esc(c) for c in r) + " |" for r in _rows(report)]
    by_input = _latency_by_input(report)
    if by_input:
        lines += ["", "## Latency per input", "", "| " + " | ".join(_INPUT_COLUMNS) + " |", "|" + "---|" * len(_INPUT_COLUMNS)]
        lines += ["| " + " | ".join(esc(c) for c in r) + " |" for r in by_input]
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
    at_lines, at_rows = _attestation(report)
    if at_lines:
        lines += ["", "## What the engine runs (attested)", ""] + [f"- {esc(x)}" for x in at_lines]
        lines += ["", "| " + " | ".join(_ATTEST_COLUMNS) + " |", "|" + "---|" * len(_ATTEST_COLUMNS)] if at_rows else []
        lines += ["| " + " | ".join(esc(c) for c in r) + " |" for r in at_rows]
    if report.get("notes"):
        lines += ["", "## Notes", ""] + [f"- {esc(n)}" for n in report["notes"]]
    return "\n".join(lines) + "\n"


_CSS = (
    "body{font-family:system-ui,sans-serif;margin:2em auto;max-width:1100px;color:#222}"
    "table{border-collapse:collapse;font-size:13px}td,th{border:1px solid #ccc;padding:3px 8px;text-align:right}"
    "td:first-child,th:first-child{text-align:left}.PASS{color:#1a7f37;font-weight:600}.FAIL{color:#c62828;font-weight:600}"
    "img{max-width:100%;border:1px solid #eee}"
    ".facts{margin:0 0 1em;width:100%}.facts caption{text-align:left;font-weight:600;padding:.3em 0}"
    ".facts th,.facts td{text-align:left;vertical-align:top}.facts th{width:14em;font-weight:600;background:#f6f8fa}"
    ".verdict{font-size:15px;padding:.6em .8em;border-radius:4px;margin:0 0 1em}.PASS-box{background:#e6f4ea}.FAIL-box{background:#fdecea}"
    ".PARTIAL{color:#a15c00;font-weight:600}.PARTIAL-box{background:#fff4e0}.below-verdict{margin:-.6em 0 1em .8em}"
)


def _html(report: Mapping[str, Any], pngs: Mapping[str, Path], section: AttentionSection | None = None) -> str:
    esc = html.escape
    head = "".join(
        f'<table class="facts" id="header-{t.key}"><caption>{esc(t.title)}</caption>'
        + "".join(f"<tr><th>{esc(k)}</th><td>{esc(v)}</td></tr>" for k, v in t.rows) + "</table>"
        for t in header_tables(report)
    )  # fmt: skip
    th = "".join(f"<th>{esc(c)}</th>" for c in _columns(report))
    line = headline(report)
    verdict = f'<p id="verdict" class="verdict {line.verdict}-box"><b class="{line.verdict}">{line.verdict}</b> · ' + " · ".join(esc(x) for x in line.parts()) + "</p>"
    verdict += "".join(f'<p class="below-verdict">{esc(x)}</p>' for x in line.below)
    trs = "".join(
        "<tr>" + "".join(f'<td class="{esc(c)}">{esc(c)}</td>' if i == len(r) - 1 else f"<td>{esc(c)}</td>" for i, c in enumerate(r)) + "</tr>"
        for r in _rows(report)
    )
    figs = ""
    by_input = _latency_by_input(report)
    if by_input:
        figs += '<h2>Latency per input</h2><table id="latency-by-input"><tr>' + "".join(f"<th>{esc(c)}</th>" for c in _INPUT_COLUMNS) + "</tr>"
        figs += "".join("<tr>" + "".join(f"<td>{esc(c)}</td>" for c in r) + "</tr>" for r in by_input) + "</table>"
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
    at_lines, at_rows = _attestation(report)
    if at_lines:
        figs += '<h2>What the engine runs (attested)</h2><ul id="attestation">' + "".join(f"<li>{esc(x)}</li>" for x in at_lines) + "</ul>"
        figs += ("<table><tr>" + "".join(f"<th>{esc(c)}</th>" for c in _ATTEST_COLUMNS) + "</tr>"
                 + "".join("<tr>" + "".join(f"<td>{esc(c)}</td>" for c in r) + "</tr>" for r in at_rows) + "</table>") if at_rows else ""  # fmt: skip
    notes = "".join(f"<li>{esc(n)}</li>" for n in report.get("notes", []))
    return (
        f'<!DOCTYPE html><html lang="en"><head><meta charset="utf-8"><title>attn-export report</title><style>{_CSS}</style></head>'
        f"<body>{verdict}<h1>attn-export report</h1><div id='header'>{head}</div><h2>Stages</h2><table><tr>{th}</tr>{trs}</table>{figs}"
        + (f"<h2>Notes</h2><ul>{notes}</ul>" if notes else "")
        + "</body></html>\n"
    )


def write_reports(
    report: str | os.PathLike[str] | Mapping[str, Any],
    out_dir: str | os.PathLike[str],
    bench_json: str | os.PathLike[str] | Mapping[str, Any] | None = None,
    attention: str | AttentionSection | tuple[np.ndarray, np.ndarray] | tuple[np.ndarray, np.ndarray, str] | None = "auto",
    progress: Callable[[str], None] | None = None,
) -> dict[str, Path]:
    """Write the PNGs, report.md and report.html into ``out_dir``; returns name -> path.

    ``attention="auto"`` draws attention maps when the report's layer can be rebuilt and an
    ONNX artifact exists; pass an ``AttentionSection`` (maps or a note, as a checkpoint run draws them) or
    ``(eager_maps, onnx_maps[, label])`` to draw given maps, None to skip.
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
