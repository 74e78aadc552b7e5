"""Every fenced code block in README.md and docs/*.md runs as written, or says why it cannot run here.

Python blocks are found with ``pytest-examples`` (the fence rule it uses is applied to the
shell blocks too: it finds Python blocks only). Each document's blocks run in order in one
temporary folder, like a reader following it; Python blocks of one document share a namespace.
Info-string settings, in pytest-examples' ``key="value"`` syntax:

* ``test="skip" reason="..."``: not runnable here (needs a GPU, installs packages, takes
  minutes); the reason is required and printed;
* ``test="pytest"``: a test module, run with pytest and the ``attn_export.testing`` plugin;
* ``json`` blocks are report/baseline examples, validated with the toolkit's own schemas.

Shell blocks run with ``bash -euo pipefail`` and the ``attn-export`` of this environment.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
SHELL = {"bash", "sh", "shell"}
PYTHON = {"python", "py"}
# Files a document may refer to by their repository path (copied into the run folder).
REPO_FILES = ("tests/baselines",)
FENCE = re.compile(r"(^ *```)( *)(.*?)\n(.+?)\1", flags=re.M | re.S)  # pytest-examples' own fence rule
SETTING = re.compile(r"""([^{\s]+?)=(['"])(.+?)\2""")


@dataclass(frozen=True)
class Block:
    doc: Path
    line: int
    lang: str
    settings: dict[str, str]
    source: str

    def __str__(self) -> str:
        return f"{self.doc.relative_to(ROOT)}:{self.line} [{self.lang}]"


def blocks(doc: Path) -> list[Block]:
    text = doc.read_text(encoding="utf-8")
    out = []
    for m in FENCE.finditer(text):
        info = m.group(3).strip()
        lang = info.split()[0].lower() if info else ""
        out.append(Block(doc, text[: m.start()].count("\n") + 1, lang, {k: v for k, _, v in SETTING.findall(info)}, m.group(4)))
    return out


def _python_blocks_match_pytest_examples(doc: Path) -> None:
    """The Python blocks this test runs are exactly the ones pytest-examples finds."""
    from pytest_examples import find_examples

    ours = sorted(b.line for b in blocks(doc) if b.lang in PYTHON)
    theirs = sorted(ex.start_line for ex in find_examples(str(doc)))
    assert ours == theirs, (doc, ours, theirs)


def _run_shell(block: Block, cwd: Path) -> None:
    env = {**os.environ, "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}", "COLUMNS": "200"}
    proc = subprocess.run(["bash", "-euo", "pipefail", "-c", block.source], cwd=cwd, env=env, capture_output=True, text=True, timeout=900)
    assert proc.returncode == 0, f"{block} failed (exit {proc.returncode}):\n{proc.stdout[-2000:]}\n{proc.stderr[-2000:]}"


def _run_pytest(block: Block, cwd: Path) -> None:
    test_file = cwd / f"test_doc_{block.line}.py"
    test_file.write_text(block.source, encoding="utf-8")
    proc = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "attn_export.testing", "-p", "no:cacheprovider", str(test_file)],
                          cwd=cwd, capture_output=True, text=True, timeout=600)  # fmt: skip
    assert proc.returncode == 0 and " passed" in proc.stdout, f"{block} failed:\n{proc.stdout[-3000:]}"


def _check_json(block: Block) -> None:
    from attn_export.validate.schema import validate_baseline, validate_report

    data = json.loads(block.source)
    if "stages" in data and isinstance(data["stages"], list):
        validate_report(data, str(block))
    elif data.get("format", "").startswith("attn-export-baseline/"):
        validate_baseline(data, str(block))


def _inventory() -> dict[str, list[Block]]:
    return {str(doc.relative_to(ROOT)): blocks(doc) for doc in DOCS}


def test_every_block_is_runnable_or_says_why_not():
    """A skipped block must give its reason; prints the tally for the closing note."""
    tally = {"run": 0, "skipped": 0, "data": 0}
    reasons = []
    for doc, found in _inventory().items():
        for b in found:
            if b.lang in SHELL | PYTHON:
                if b.settings.get("test") == "skip":
                    assert b.settings.get("reason", "").strip(), f"{b}: test=\"skip\" needs reason=\"...\""
                    tally["skipped"] += 1
                    reasons.append(f"{b}: {b.settings['reason']}")
                else:
                    tally["run"] += 1
            else:
                tally["data"] += 1
    print(f"\ndocumentation blocks: {tally}\n" + "\n".join(reasons))
    assert tally["run"] > 0


@pytest.mark.slow
@pytest.mark.parametrize("doc", DOCS, ids=lambda p: p.name)
def test_document_runs_as_written(doc: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    _python_blocks_match_pytest_examples(doc)
    for rel in REPO_FILES:
        shutil.copytree(ROOT / rel, tmp_path / rel)
    monkeypatch.chdir(tmp_path)
    namespace: dict[str, object] = {"__name__": f"doc_{doc.stem}"}
    for b in blocks(doc):
        if b.settings.get("test") == "skip":
            continue
        if b.lang == "json":
            _check_json(b)
        elif b.lang in SHELL:
            _run_shell(b, tmp_path)
        elif b.lang in PYTHON and b.settings.get("test") == "pytest":
            _run_pytest(b, tmp_path)
        elif b.lang in PYTHON:
            exec(compile(b.source, str(b), "exec"), namespace)  # noqa: S102 - the documentation's own example


def test_report_example_in_the_readme_matches_a_real_report():
    """README's report.json example passes the report schema and shows every top-level key a run writes."""
    from attn_export.validate.report import Report

    [example] = [b for b in blocks(ROOT / "README.md") if b.lang == "json" and '"stages"' in b.source]
    _check_json(example)
    shown = set(json.loads(example.source))
    written = set(Report(model={}).to_dict())
    assert written <= shown, f"README's report.json example lacks {written - shown}"
