"""Option values written in README.md and docs/*.md exist in the CLI (issue 23: docs drifted from the code).

Every ``--flag value`` in the documents (prose, tables and code blocks; ``a|b`` lists are read
as alternatives, comma lists of sweep axes as points), and every value an option table row
lists for its one flag (``| `--mask` | `padding` | `none`, `padding` ... |``), is checked the way a run checks it:
main-command values become a ``RunConfig`` through the CLI's own option parsing and
``config_from_options``, with the flags that make them meaningful added (``--int8-mode`` needs
``--quantize int8``); bench's ``--variants`` against its variant table. Placeholders
(``DIR``, ``N``, ``[RATIO]``, ``<...>``) and paths are not values.
"""

from __future__ import annotations

import contextlib
import importlib.util
import json
import re
import sys
from pathlib import Path

import pytest
import typer

from attn_export.cli.app import _register, app
from attn_export.cli.main_command import config_from_options
from attn_export.errors import AttnExportError

ROOT = Path(__file__).resolve().parents[2]
DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
OPTION = re.compile(r"(?<![\w-])(--[a-z][a-z0-9-]+)[ =]([^\s`|)\]\"'<>;]+(?:\|[^\s`|)\]\"'<>;]+)*)")
# What a value needs beside it to mean something (RunConfig refuses it alone, rightly).
ENABLERS = {
    "--int8-mode": ["--quantize", "int8"], "--int8-encoding": ["--quantize", "int8"], "--calib-method": ["--quantize", "int8"],
    "--smoothquant": ["--quantize", "int8"], "--int8-fallback": ["--quantize", "int8"], "--int8-qat": ["--quantize", "int8"],
    "--int8-qat-scales": ["--quantize", "int8", "--int8-qat", "10"], "--distill": ["--low-rank", "0.5"],
    "--low-rank-method": ["--low-rank", "0.5"], "--low-rank-targets": ["--low-rank", "0.5"],
    "--layers": ["--checkpoint", "minilm"], "--max-len": ["--checkpoint", "minilm"], "--max-texts": ["--checkpoint", "minilm"],
    "--languages": ["--checkpoint", "minilm"], "--pooling": ["--checkpoint", "minilm"],
    "--trt-version": ["--target", "tensorrt"], "--workspace": ["--target", "tensorrt"], "--builder-optimization-level": ["--target", "tensorrt"],
    "--hardware-compatibility": ["--target", "tensorrt"], "--dla-core": ["--target", "jetson"], "--min-shape": ["--target", "tensorrt"],
    "--opt-shape": ["--target", "tensorrt"], "--max-shape": ["--target", "tensorrt"], "--gpu-arch": ["--target", "tensorrt"],
    "--length-buckets": ["--target", "tensorrt"], "--sort-window": ["--target", "tensorrt"],
    "--quantize": ["--target", "tensorrt", "--gpu-arch", "sm90"], "--precision": ["--target", "tensorrt", "--gpu-arch", "sm90"], "--encoder-form": ["--checkpoint", "minilm"],
}  # fmt: skip
# Values that name a file or folder, or a run's own output: not a vocabulary to check.
PATHS = {"--out", "--calib", "--bundle", "--triton", "--triton-config", "--timing-cache", "--baseline", "--junit", "--json", "--bench", "--trt"}
# Options whose int8 flags need the --int8-mode they pair with in the text: checked with the mode that accepts them.
ROUTE_OF = {"--int8-qat": "static", "--int8-qat-scales": "static"}


def _long_seq_variants() -> frozenset[str]:
    spec = importlib.util.spec_from_file_location("bench_long_seq", ROOT / "bench" / "long_seq.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # its dataclasses look their module up
    spec.loader.exec_module(module)  # definitions only: its work is in main()
    return frozenset((*module.EAGER, *module.FORMS))


LONG_SEQ_VARIANTS = _long_seq_variants()


def _placeholder(value: str) -> bool:
    return value.startswith(("[", "<", "-", "$", "{")) or value.isupper() or bool(re.fullmatch(r"[A-Z][A-Z0-9_]*[:=]?.*", value)) or value in ("...", "…")


TABLE_FLAG = re.compile(r"^\|\s*`(--[a-z][a-z0-9-]+)`\s*\|(.*)$")
TABLE_VALUE = re.compile(r"`([a-z][a-z0-9+-]*(?:,[a-z0-9+-]+)*)`")


def _table_values(line: str) -> list[tuple[str, str]]:
    """A table row for one flag: the values its default and meaning cells name in backticks."""
    m = TABLE_FLAG.match(line)
    if not m:
        return []
    return [(m.group(1), v) for v in TABLE_VALUE.findall(m.group(2))]


def occurrences() -> list[tuple[str, str, str]]:
    """(where, flag, value) for every option value written in the documents."""
    out = []
    for doc in DOCS:
        for lineno, line in enumerate(doc.read_text(encoding="utf-8").splitlines(), 1):
            line = line.replace("\\|", "|")  # a pipe escaped inside a Markdown table cell
            out += [(f"{doc.relative_to(ROOT)}:{lineno} (table)", f, v) for f, v in _table_values(line)]
            for flag, raw in OPTION.findall(line):
                for value in raw.split("|"):
                    value = value.rstrip(".,:")
                    if value and not _placeholder(value):
                        out.append((f"{doc.relative_to(ROOT)}:{lineno}", flag, value))
    return out


def _main_flags() -> dict[str, object]:
    _register()
    root = typer.main.get_command(app)
    return {opt: p for p in root.params for opt in p.opts if opt.startswith("--")}


def _main_value_ok(flag: str, value: str, params: dict[str, object]) -> str | None:
    """None when ``--flag value`` (with its enablers) makes a valid RunConfig, else why not."""
    _register()
    root = typer.main.get_command(app)
    args = [flag, value, *ENABLERS.get(flag, [])]
    if flag == "--gpu-arch":  # the target that covers the GPU the docs name (Jetson GPUs: jetson)
        from attn_export.targets.targets import TARGETS
        from attn_export.targets.gpu_arch import parse_gpu_arch

        with contextlib.suppress(AttnExportError):
            args = [flag, value, "--target", next(t.name for t in TARGETS.values() if parse_gpu_arch(value) in t.gpu_archs)]
    if flag in ROUTE_OF:
        args += ["--int8-mode", ROUTE_OF[flag]]
    try:
        ctx = root.make_context("attn-export", args, resilient_parsing=False)
        config_from_options(ctx.params)
    except (typer.BadParameter, AttnExportError, Exception) as err:  # noqa: BLE001 - click's usage errors and ours alike
        return f"{type(err).__name__}: {err}"
    return None


def test_the_documents_write_option_values():
    """The scan finds the values it is meant to check (a scan that finds nothing proves nothing)."""
    found = {(f, v) for _, f, v in occurrences()}
    assert {("--quantize", "int8"), ("--target", "jetson"), ("--int8-encoding", "u8u8"), ("--int8-mode", "static"), ("--mask", "window")} <= found


def test_every_option_value_in_the_docs_is_accepted_by_the_cli():
    from attn_export.campaigns.bench.variants import VARIANTS

    params = _main_flags()
    bad = []
    for where, flag, value in occurrences():
        if flag in PATHS or (flag == "--checkpoint" and ("/" in value or value.isupper())):
            continue
        if flag == "--variants":  # attn-export bench's, or bench/long_seq.py's (its own eager-math/ort-* names)
            names = value.split(",")
            if not (set(names) <= set(VARIANTS) or set(names) <= LONG_SEQ_VARIANTS):
                bad.append(f"{where}: {flag} {value}: not variants of attn-export bench nor of bench/long_seq.py")
            continue
        if flag not in params:
            continue  # a subcommand's own option (--seqs, --latency-margin, ...): its values are numbers or files
        if where.endswith("(table)") and params[flag].bare_type() in ("int", "float"):
            continue  # a numeric option's table names forms in backticks (`--opset`: "23 for `onnx-attention`"), not values
        points = value.split(",") if "," in value and flag not in ("--low-rank-targets", "--languages", "--length-buckets") else [value]  # sweep axes
        for point in points:
            if point in ("none",) and flag in ("--low-rank", "--distill", "--quantize"):
                continue  # a sweep axis' "leave it out" point
            why = _main_value_ok(flag, point, params)
            if why:
                bad.append(f"{where}: {flag} {point}: {why}")
    assert not bad, "option values the docs write that the CLI refuses:\n" + "\n".join(bad)


def test_the_checker_refuses_a_value_the_cli_does_not_take():
    params = _main_flags()
    assert _main_value_ok("--int8-encoding", "reduce-range", params) is None
    assert "int8-encoding" in (_main_value_ok("--int8-encoding", "7bit", params) or "")
    assert _main_value_ok("--target", "tensorrtt", params)


def test_the_readme_report_example_has_the_real_selection_band_and_preference():
    from attn_export.targets.targets import TARGETS
    from attn_export.pipeline.select import NOISE_BAND

    text = (ROOT / "README.md").read_text(encoding="utf-8")
    example = next(json.loads(m.group(1)) for m in re.finditer(r"```json\n(.*?)```", text, re.S) if '"stages"' in m.group(1))
    selection = example["selection"]["int8"]
    assert selection["band"] == pytest.approx(NOISE_BAND)
    assert tuple(selection["preference"]) == TARGETS["ort-cpu"].route_preference["int8"]
