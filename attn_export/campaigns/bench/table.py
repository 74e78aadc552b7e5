"""Bench results as rich tables (terminal) or Markdown (reports, PR comments).

``x eager`` is the median of the paired per-round ratios with their quartiles in brackets
(``5.69x [5.21-6.02]``): how far load could move the figure, printed beside it.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from rich.table import Table

__all__ = ["ceilings_line", "markdown_tables", "results_table", "variants_table"]

_RESULT_COLS = ("variant", "B", "L", "p50 ms", "p90 ms", "x eager", "items/s", "GFLOP/s", "eff", "peak MiB")


def ceilings_line(bench: Mapping[str, Any]) -> str:
    c = bench["ceilings"]
    meas = ", ".join(f"{k} {v:.0f}" if v else f"{k} n/a" for k, v in c["measurements"].items())
    cpu = (bench.get("environment") or {}).get("cpu") or {}
    enc = ((bench.get("environment") or {}).get("int8_encoding") or {}).get("encoding")
    where = f"cpu {cpu.get('isa_class', '?')}" + (f", int8 {enc}" if enc else "") + "; "
    return (
        f"{where}ceilings ({c['size']}^3 GEMM, constant B, {c['threads']} threads): fp32 {c['fp32_gflops']:.1f} GFLOP/s, "
        f"fp16 {c['fp16_gflops']:.1f} GFLOP/s, int8 (ONNX Runtime MatMulInteger) {c['int8_gops']:.1f} GOP/s  [{meas}]"
    )


def _ratio(median: float | None, quartiles: list[float] | None) -> str:
    if median is None:
        return "-"
    return f"{median:.2f}x" + (f" [{quartiles[0]:.2f}-{quartiles[1]:.2f}]" if quartiles else "")


def _result_rows(bench: Mapping[str, Any]) -> list[tuple[str, ...]]:
    rows = []
    for r in sorted(bench["results"], key=lambda r: (r["batch"], r["seq"])):
        lat, mem = r["latency_ms"], r.get("peak_mem_bytes")
        sp, eff = r.get("speedup_vs_eager"), r.get("efficiency")
        rows.append((
            r["variant"], str(r["batch"]), str(r["seq"]), f"{lat['p50']:.2f}", f"{lat['p90']:.2f}",
            _ratio(sp, r.get("speedup_quartiles")), f"{r['throughput_per_s']:.1f}", f"{r['gflops_per_s']:.1f}",
            "-" if eff is None else f"{100 * eff:.1f}%", "-" if mem is None else f"{mem / 2**20:.1f}",
        ))  # fmt: skip
    return rows


def _variant_rows(bench: Mapping[str, Any]) -> list[tuple[str, ...]]:
    rows = []
    for v in bench["variants"]:
        a = v.get("accuracy") or {}
        status = "ok" if v["available"] else f"unavailable: {v['reason']}"
        rows.append((
            v["name"], v["precision"], "-" if not a else f"{a['cosine']:.6f}", "-" if not a else f"{a['sqnr_db']:.1f}",
            "-" if v.get("size_bytes") is None else f"{v['size_bytes'] / 2**20:.2f}", "; ".join([status, *v.get("notes", [])]),
        ))  # fmt: skip
    return rows


def results_table(bench: Mapping[str, Any]) -> Table:
    t = Table(title="attn-export bench: latency, ratio to eager (median [quartiles] of paired rounds), efficiency vs the measured ceilings",
              caption=ceilings_line(bench))  # fmt: skip
    for col in _RESULT_COLS:
        t.add_column(col, justify="left" if col == "variant" else "right")
    last = None
    for row in _result_rows(bench):
        if last is not None and row[1:3] != last:
            t.add_section()
        t.add_row(*row)
        last = row[1:3]
    return t


def variants_table(bench: Mapping[str, Any]) -> Table:
    t = Table(title="variants: accuracy vs eager fp32 (validation inputs) and status")
    for col in ("variant", "precision", "cosine", "SQNR dB", "size MiB", "status / notes"):
        t.add_column(col, justify="left" if col in ("variant", "precision", "status / notes") else "right")
    for row in _variant_rows(bench):
        t.add_row(*row)
    return t


def markdown_tables(bench: Mapping[str, Any]) -> str:
    """Both tables, the ceilings and the skipped grid points as GitHub Markdown."""

    def md(cols: tuple[str, ...], rows: list[tuple[str, ...]]) -> list[str]:
        return ["| " + " | ".join(cols) + " |", "|" + "---|" * len(cols)] + ["| " + " | ".join(r) + " |" for r in rows]

    lines = [ceilings_line(bench), ""] + md(_RESULT_COLS, _result_rows(bench)) + [""]
    lines += md(("variant", "precision", "cosine", "SQNR dB", "size MiB", "status / notes"), _variant_rows(bench))
    for s in bench.get("skipped", []):
        who = f"{s['variant']} at " if s.get("variant") else ""
        lines.append(f"\nskipped {who}batch {s['batch']}, seq {s['seq']}: {s['reason']}")
    return "\n".join(lines) + "\n"
