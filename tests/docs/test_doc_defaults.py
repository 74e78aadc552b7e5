"""The defaults README's option tables state are the CLI's resolved defaults (issue 33: `--low-rank-targets` drifted).

Each ``| option | default | meaning |`` row is read as the flags of its first cell and the default cell (one
value for all of them, or one per flag, comma separated). A default written as values (in backticks, or a number)
must name only values the CLI's ``--help`` shows as that option's default (the resolved default from
``subjects/kinds.py``, ``RunConfig`` or ``EngineSpec``: ``tests/test_help.py`` holds --help to those), and every
value of a subject-dependent default ("q,k,v,o for a layer; q,k for --checkpoint"). "off" stands for an
option that is off unless given. Prose defaults ("the memory available") are the help's words, not checked.
"""

from __future__ import annotations

import re
from pathlib import Path



ROOT = Path(__file__).resolve().parents[2]
README = ROOT / "README.md"
FLAG = re.compile(r"[`/](--[a-z][a-z0-9-]+)")
VALUE = re.compile(r"`([^`]+)`|(?<![\w.])(\d+(?:\.\d+)?)(?![\w.])")
TOKEN = re.compile(r"[a-z0-9_.+-]+(?:,[a-z0-9_.+-]+)*")
BOTH = re.compile(r"^(.*) for a layer; (.*) for --checkpoint$")


def readme_defaults(text: str) -> list[tuple[int, str, str]]:
    """(line, flag, default cell part) for every row of README's ``| option | default | meaning |`` tables."""
    out, in_table = [], False
    for lineno, line in enumerate(text.splitlines(), 1):
        if re.match(r"^\|\s*option\s*\|\s*default\s*\|", line):
            in_table = True
            continue
        if not line.startswith("|"):
            in_table = False
        if not in_table or line.startswith("|---"):
            continue
        cells = [c.strip() for c in line.replace("\\|", "/").strip("|").split("|")]
        flags = FLAG.findall(cells[0])
        cell = re.sub(r"\(alone: [^)]*\)", "", cells[1]).strip()  # an optional value's value, not the default
        parts = [p.strip() for p in re.split(r",\s+(?![^(]*\))", cell)] if len(flags) > 1 else [cell]
        if len(parts) == 1:
            parts *= len(flags)
        if len(parts) == len(flags):
            out += [(lineno, f, p) for f, p in zip(flags, parts)]
    return out


def cli_defaults() -> dict[str, tuple[object, str]]:
    """Main-command flag -> (its Python default, the default its --help shows, brackets removed; "" for none)."""
    from fixtures import main_option_defaults

    return {flag: (default, shown) for flag, (_, default, shown) in main_option_defaults().items()}


def drift(text: str) -> list[str]:
    defaults, wrong = cli_defaults(), []
    for lineno, flag, part in readme_defaults(text):
        if flag not in defaults:
            continue
        python_default, shown = defaults[flag]
        where = f"README.md:{lineno} {flag}"
        if part == "off":
            if python_default not in (None, False):
                wrong.append(f"{where}: README says off, the CLI's default is {shown or python_default!r}")
            continue
        values = [a or b for a, b in VALUE.findall(part)]
        values = [v for v in values if v == v.lower()]  # BxL, 4Bx4L: placeholders
        if not values:
            continue  # prose
        tokens = set(TOKEN.findall(shown.lower()))
        wrong += [f"{where}: README says {v!r}, --help shows [default: {shown}]" for v in values if v not in tokens]
        both = BOTH.match(shown)
        if both:
            wrong += [f"{where}: README leaves out {v!r} of [default: {shown}]" for v in both.groups() if v not in values]
    return wrong


def test_the_readme_tables_are_read() -> None:
    rows = {flag for _, flag, _ in readme_defaults(README.read_text(encoding="utf-8"))}
    assert {"--layer", "--low-rank-targets", "--calib-method", "--warmup", "--repeats", "--quiet", "--max-shape"} <= rows


def test_readme_option_defaults_are_the_cli_defaults() -> None:
    wrong = drift(README.read_text(encoding="utf-8"))
    assert not wrong, "README option defaults that are not the CLI's:\n" + "\n".join(wrong)


def test_a_drifted_default_is_caught() -> None:
    """The check fails on the drift issue 33 found: a subject-dependent default given for one subject only."""
    text = README.read_text(encoding="utf-8")
    row = next(line for line in text.splitlines() if line.startswith("| `--low-rank-targets`"))
    assert drift(text.replace(row, "| `--low-rank-targets` | `q,k,v,o` | any of `q,k,v,o,ffn` |"))
    assert drift(text.replace("| `--d-model`, `--heads` | 512, 8 |", "| `--d-model`, `--heads` | 512, 16 |"))
