"""The report's header as labelled tables: model, inputs and environment, one row per fact, rounded for reading.

Issue 33: report.md's header was report.json's dicts on one line each (``pooling={modes=[mean],
normalize=True, ...}``, ``label_agreement=None``), about ten dense lines for MiniLM. A reader
wants one fact per row: the family, the pooling, the checkpoint, the texts judged and their
lengths, the CPU, the versions. ``FACTS`` is that table, as data: each row names its section,
the report.json keys it reads and how it reads them. Figures are rounded here; report.json
keeps the exact values. A key no row reads (a newer writer's) still shows, flattened into
``key · subkey`` rows of readable values, so nothing the report records is hidden and no
``{``, ``True`` or ``None`` reaches the page.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

__all__ = ["HeaderTable", "header_tables", "readable"]

Row = tuple[str, str]


@dataclass(frozen=True)
class HeaderTable:
    """One labelled table of the header: ``title`` (Model, Inputs, Environment, Time to ship) and its (fact, value) rows."""

    key: str  # the report.json section it reads: model | inputs | environment | time_to_ship
    title: str
    rows: tuple[Row, ...]


def readable(v: Any) -> str:
    """A scalar for reading: yes/no, '-' for nothing, floats to 4 significant digits, lists comma-separated."""
    if v is None:
        return "-"
    if isinstance(v, bool):
        return "yes" if v else "no"
    if isinstance(v, float):
        return f"{v:.4g}"
    if isinstance(v, int):
        return f"{v:,}" if abs(v) >= 10_000 else str(v)
    if isinstance(v, Mapping):
        return "; ".join(f"{k} {readable(x)}" for k, x in v.items()) or "-"
    if isinstance(v, (list, tuple)):
        return ", ".join(readable(x) for x in v) or "none"
    return str(v)


def _count(n: Any) -> str:
    """A parameter count as people say it: 22.7 M, 85.2 k."""
    n = int(n)
    for size, unit in ((10**9, "G"), (10**6, "M"), (10**3, "k")):
        if n >= size:
            return f"{n / size:.1f} {unit}"
    return str(n)


def _lengths(p: Mapping[str, Any]) -> str:
    """A length profile (``subjects.text_data.length_profile``): texts and tokens min / p50 / p90 / max."""
    spread = ", ".join(
        f"{k} {readable(p[k]) if not isinstance(p[k], float) else f'{p[k]:.0f}'}"
        for k in ("min", "p50", "p90", "max")
        if k in p
    )
    return f"{p.get('texts', '?')} texts: {spread}"


def _checkpoint(m: Mapping[str, Any]) -> str:
    name, path = m.get("name"), m.get("checkpoint")
    return str(path) if name in (None, path) else f"{name} ({path})"


def _shape(m: Mapping[str, Any]) -> str:
    parts = [f"d_model {m['d_model']}" if "d_model" in m else "", f"{m['heads']} heads" if "heads" in m else ""]
    if "num_layers" in m:
        layers = m.get("layers")
        parts.append(
            f"{m['num_layers']} layers" + ("" if layers in (None, "all") else f" (exported: {readable(layers)})")
        )
    return ", ".join(p for p in parts if p)


def _params(m: Mapping[str, Any]) -> str:
    own, subject = m.get("params"), m.get("subject_params")
    text = _count(own) if own is not None else "-"
    return text if subject in (None, own) else f"{text} (exported subject {_count(subject)})"


def _pooling(p: Any) -> str:
    if not isinstance(p, Mapping):
        return readable(p)
    return (
        f"{p.get('name') or '+'.join(p.get('modes') or [])} ({p['source']})"
        if p.get("source")
        else str(p.get("name", readable(p)))
    )


def _fidelity(f: Mapping[str, Any]) -> str:
    """The load-time check against the checkpoint's own library: verdict, worst figures, probes, bar."""
    outs = [o for o in (f.get("outputs") or {}).values() if isinstance(o, Mapping)]
    cos = [o["min_cosine"] for o in outs if isinstance(o.get("min_cosine"), (int, float))]
    diff = [o["max_abs"] for o in outs if isinstance(o.get("max_abs"), (int, float))]
    figures = ", ".join(
        x for x in (f"min cosine {min(cos):.6f}" if cos else "", f"max |diff| {max(diff):.1e}" if diff else "") if x
    )
    probes = ", ".join(str(k) for k in (f.get("probes") or {}))
    bar = ", ".join(f"{k} {readable(v)}" for k, v in (f.get("tolerance") or {}).items())
    verdict = {True: "PASS", False: "FAIL"}.get(f.get("passed"), "-")
    return f"{verdict}: {figures}" + (f" on {probes}" if probes else "") + (f" (bar: {bar})" if bar else "")


def _head(h: Any) -> str:
    return f"{h.get('task')} classification, {h.get('labels')} labels" if isinstance(h, Mapping) else readable(h)


def _prompt(p: Any) -> str:
    if not isinstance(p, Mapping):
        return readable(p)
    return "none" if not p.get("text") else f"{p['text']!r} ({p.get('name') or p.get('source')})"


def _timed_on(points: Sequence[Any]) -> str:
    out = []
    for t in points:
        if not isinstance(t, Mapping):
            continue
        bits = [f"batch {t.get('batch')}"] + ([f"{t['batches']} batches"] if t.get("batches") else [])
        if isinstance(t.get("padding_fraction"), (int, float)):
            bits.append(f"{100 * t['padding_fraction']:.0f}% padding")
        out.append(f"{t.get('label')} ({', '.join(bits)})")
    return "; ".join(out)


def _padding(p: Any) -> str:
    """``inputs.tensorrt_padding`` (``targets.length_buckets``): the share of token slots each strategy pads."""
    if not isinstance(p, Mapping) or "error" in p:
        return readable(p.get("error") if isinstance(p, Mapping) else p)
    shares = ", ".join(f"{k.replace('_', ' ')} {100 * float(p[k]):.1f}%" for k in ("padded", "bucketed", "bucket_max", "packed") if k in p)
    window = f"sort window {p['sort_window']}" if p.get("sort_window") else "no sorting across batches"
    buckets = ",".join(str(b) for b in p.get("length_buckets") or [])
    return f"{shares} (batches of {p.get('batch')}, {window}, buckets {buckets})"


def _also_judged(sets: Mapping[str, Any]) -> list[Row]:
    rows = []
    for name, s in sets.items():
        s = s if isinstance(s, Mapping) else {}
        lengths = f" ({_lengths(s['lengths'])})" if isinstance(s.get("lengths"), Mapping) else ""
        rows.append((f"also judged on: {name}", f"{s.get('why', '')}{lengths}"))
    return rows


def _cpu(e: Mapping[str, Any]) -> str:
    cpu = e.get("cpu") if isinstance(e.get("cpu"), Mapping) else {}
    name = e.get("processor") or cpu.get("model")
    machine = e.get("machine") or cpu.get("machine")
    bits = [f"{name} ({machine})" if name and machine and machine != name else str(name or machine or "")]
    if e.get("cpu_count") is not None:
        bits.append(f"{e['cpu_count']} cores")
    if cpu.get("isa_class"):
        flags = ", ".join(cpu.get("flags") or [])
        bits.append(f"{cpu['isa_class']}" + (f" ({flags})" if flags else ""))
    if cpu.get("u8s8_saturates"):
        bits.append("u8 x s8 products saturate")
    return ", ".join(b for b in bits if b)


def _threads(e: Mapping[str, Any]) -> str:
    p = e.get("process") if isinstance(e.get("process"), Mapping) else {}
    bits = []
    if p.get("omp_wait_policy"):
        bits.append(
            f"OpenMP wait {p['omp_wait_policy']}" + ("" if p.get("omp_wait_policy_applied", True) else ", as found")
        )
    if "flush_denormals" in p:
        bits.append("denormals flushed" if p["flush_denormals"] else "denormals kept")
    return f"{e.get('threads', p.get('threads', '-'))}" + (f" ({', '.join(bits)})" if bits else "")


_VERSIONS = (
    "attn_export",
    "python",
    "torch",
    "onnx",
    "onnxruntime",
    "transformers",
    "sentence_transformers",
    "numpy",
    "tensorrt",
)


def _versions(e: Mapping[str, Any]) -> str:
    ort_dist = e.get("onnxruntime_distribution")
    return ", ".join(f"{k} {e[k]}" + (f" ({ort_dist})" if k == "onnxruntime" and ort_dist and ort_dist != "onnxruntime" else "")
                     for k in _VERSIONS if e.get(k))  # fmt: skip


def _encoding(enc: Any) -> str:
    return f"{enc.get('encoding')}: {enc.get('reason', '')}".rstrip(": ") if isinstance(enc, Mapping) else readable(enc)


@dataclass(frozen=True)
class Fact:
    """One header row: the keys of a report.json section it reads, its label, and how it reads them (None: no row)."""

    section: str
    keys: tuple[str, ...]
    label: str
    read: Callable[[Mapping[str, Any]], str | list[Row] | None]


def _one(key: str, fmt: Callable[[Any], str] = readable) -> Callable[[Mapping[str, Any]], str]:
    return lambda sec: fmt(sec[key])


FACTS: tuple[Fact, ...] = (
    # model: a checkpoint's identity first, then a reference layer's, then the shape both have
    Fact("model", ("checkpoint", "name"), "checkpoint", _checkpoint),
    Fact("model", ("family",), "family", _one("family")),
    Fact("model", ("subject", "layer"), "subject", lambda m: ": ".join(str(m[k]) for k in ("subject", "layer") if m.get(k))),
    Fact("model", ("d_model", "heads", "num_layers", "layers"), "shape", _shape),
    Fact("model", ("mask",), "mask", _one("mask")),
    Fact("model", ("window",), "window", lambda m: f"{m['window']} tokens"),
    Fact("model", ("block_size",), "block size", lambda m: f"{m['block_size']} tokens"),
    Fact("model", ("params", "subject_params"), "parameters", _params),
    Fact("model", ("pooling",), "pooling", _one("pooling", _pooling)),
    Fact("model", ("head",), "head", _one("head", _head)),
    Fact("model", ("reference",), "reference", _one("reference")),
    Fact("model", ("fidelity",), "fidelity to the reference", lambda m: _fidelity(m["fidelity"]) if isinstance(m["fidelity"], Mapping) else readable(m["fidelity"])),
    # inputs: what the figures were measured on, then how latency was timed
    Fact("inputs", ("accuracy_data",), "judged on", _one("accuracy_data")),
    Fact("inputs", ("report_lengths",), "lengths judged (tokens)", lambda i: _lengths(i["report_lengths"]) if isinstance(i["report_lengths"], Mapping) else readable(i["report_lengths"])),
    Fact("inputs", ("also_judged_on",), "also judged on", lambda i: _also_judged(i["also_judged_on"]) if isinstance(i["also_judged_on"], Mapping) else readable(i["also_judged_on"])),
    Fact("inputs", ("selection_data",), "selection data", _one("selection_data")),
    Fact("inputs", ("training_data",), "training data", _one("training_data")),
    Fact("inputs", ("tensorrt_padding",), "padding on TensorRT", lambda i: _padding(i["tensorrt_padding"])),
    Fact("inputs", ("split_sizes",), "split sizes", lambda i: readable(i["split_sizes"])),
    Fact("inputs", ("split",), "split", _one("split")),
    Fact("inputs", ("max_len",), "max tokens per text", _one("max_len")),
    Fact("inputs", ("prompt",), "prompt", _one("prompt", _prompt)),
    Fact("inputs", ("batch", "seq_len"), "timing shape", lambda i: " x ".join(f"{k} {i[k]}" for k in ("batch", "seq_len") if k in i)),
    Fact("inputs", ("latency_data",), "latency data", _one("latency_data")),
    Fact("inputs", ("timed_on",), "timed on", lambda i: _timed_on(i["timed_on"]) if isinstance(i["timed_on"], list) else readable(i["timed_on"])),
    Fact("inputs", ("seed",), "seed", _one("seed")),
    # environment: where it ran and with what
    Fact("environment", ("processor", "machine", "cpu_count", "cpu"), "CPU", _cpu),
    Fact("environment", ("threads", "process"), "threads", _threads),
    Fact("environment", ("target",), "target", _one("target")),
    Fact("environment", ("int8_encoding",), "int8 weights", _one("int8_encoding", _encoding)),
    Fact("environment", (*_VERSIONS, "onnxruntime_distribution"), "versions", _versions),
)  # fmt: skip
_TITLES = {"model": "Model", "inputs": "Inputs", "environment": "Environment", "time_to_ship": "Time to ship"}


def _flatten(label: str, v: Any) -> list[Row]:
    """A key no fact reads: nested objects become ``key · subkey`` rows, so it shows without braces."""
    if isinstance(v, Mapping) and v:
        return [row for k, x in v.items() for row in _flatten(f"{label} · {k}", x)]
    if isinstance(v, (list, tuple)) and any(isinstance(x, Mapping) for x in v):
        return [row for i, x in enumerate(v) for row in _flatten(f"{label} · {i + 1}", x)]
    return [(label, readable(v))]


def _seconds(wall: Any, cpu: Any) -> str:
    return f"{float(wall):.1f} s wall, {float(cpu):.1f} s CPU"


def _phase_rows(sec: Mapping[str, Any]) -> list[Row]:
    rows: list[Row] = [(str(p.get("name", "?")), _seconds(p.get("wall_s", 0), p.get("cpu_s", 0))) for p in sec.get("phases", [])]
    return [*rows, ("total", _seconds(sec.get("wall_s", 0), sec.get("cpu_s", 0)))]


def header_tables(report: Mapping[str, Any]) -> list[HeaderTable]:
    """The header's tables, in order (sections the report leaves empty are left out)."""
    tables = []
    for key, title in _TITLES.items():
        sec = report.get(key) or {}
        if not isinstance(sec, Mapping) or not sec:
            continue
        if key == "time_to_ship":  # one row per phase, in the order they ran, then the total
            tables.append(HeaderTable(key, title, tuple(_phase_rows(sec))))
            continue
        rows: list[Row] = []
        read: set[str] = set()
        for fact in FACTS:
            if fact.section != key or not any(k in sec for k in fact.keys):
                continue
            read.update(fact.keys)
            value = fact.read(sec)
            if isinstance(value, list):
                rows += value
            elif value:
                rows.append((fact.label, value))
        for k, v in sec.items():
            if k not in read:
                rows += _flatten(k.replace("_", " "), v)
        tables.append(HeaderTable(key, title, tuple(rows)))
    return tables
