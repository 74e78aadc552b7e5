"""JUnit XML for the gate, so CI systems show each stage/metric as a test case.

GitHub Actions, GitLab and Jenkins all render JUnit XML natively; one testcase per
(stage, metric) makes a regression show up as a named failing test instead of a log line.
The CPU classes compared (and a cross-class notice) are suite ``<properties>`` and the
suite's ``<system-out>``, the places the format has for them. Element order follows the Ant
JUnit DTD that CI parsers accept: ``testsuite (properties, testcase*, failure?, error?,
system-out?, system-err?)``.
"""

from __future__ import annotations

import os
import xml.etree.ElementTree as ET
from pathlib import Path

from attn_export.validate.gate.check import GateResult
from attn_export.validate.report import atomic_write_text

__all__ = ["check_junit_target", "is_our_junit", "junit_xml", "write_junit"]

SUITE = "attn-export-gate"


def _num(v: float | None) -> str:
    return "-" if v is None else f"{v:.6g}"


def junit_xml(result: GateResult, suite: str = SUITE) -> str:
    """The gate result as a JUnit ``<testsuites>`` document (one testsuite)."""
    failures = len(result.regressions)
    root = ET.Element("testsuites", name=suite, tests=str(len(result.checks)), failures=str(failures), errors="0")
    ts = ET.SubElement(
        root, "testsuite", name=suite, tests=str(len(result.checks)), failures=str(failures), errors="0", skipped="0", time="0"
    )
    props = ET.SubElement(ts, "properties")  # <properties> must precede the test cases in the JUnit schema
    for name, value in (
        ("report_class", result.report_class),
        ("baseline_class", result.baseline_class or ""),
        ("cross_class", str(result.cross_class).lower()),
        ("compared", result.compared),
    ):
        ET.SubElement(props, "property", name=name, value=value)
    if result.new_stages:
        ET.SubElement(props, "property", name="new_stages", value=",".join(result.new_stages))
    for c in result.checks:
        case = ET.SubElement(ts, "testcase", classname=f"{suite}.{c.stage}", name=c.metric, time="0")
        detail = (
            f"stage {c.stage}, {c.metric}: value {_num(c.value)}, baseline {_num(c.baseline)}, limit {_num(c.limit)} "
            f"({result.compared})" + (f"; {c.message}" if c.message else "")
        )
        if c.ok:
            ET.SubElement(case, "system-out").text = detail
        else:
            fail = ET.SubElement(case, "failure", message=f"{c.stage}/{c.metric}: {c.message or 'regression'}", type="regression")
            fail.text = detail
    ET.SubElement(ts, "system-out").text = "\n".join([result.summary(), *(f"notice: {n}" for n in result.notices)])
    ET.indent(root)
    return '<?xml version="1.0" encoding="UTF-8"?>\n' + ET.tostring(root, encoding="unicode") + "\n"


def write_junit(result: GateResult, path: str | os.PathLike[str], suite: str = SUITE) -> Path:
    """Write ``junit_xml(result)`` atomically to ``path`` (parent folders are created)."""
    p = Path(path)
    p.parent.mkdir(parents=True, exist_ok=True)
    return atomic_write_text(p, junit_xml(result, suite))


def is_our_junit(path: str | os.PathLike[str], suite: str = SUITE) -> bool:
    """Whether ``path`` is a JUnit file ``write_junit`` wrote: XML whose root is ``<testsuites name=suite>``
    (only the start of the file is read, up to its root element)."""
    parser = ET.XMLPullParser(events=("start",))
    try:
        with open(path, "rb") as f:
            for _ in range(16):  # the root element is in the first few KiB of ours; 1 MiB is plenty
                chunk = f.read(1 << 16)
                if not chunk:
                    return False
                parser.feed(chunk)
                for _event, elem in parser.read_events():
                    return elem.tag == "testsuites" and elem.get("name") == suite
    except (OSError, ET.ParseError):
        return False
    return False


def check_junit_target(junit: Path, inputs: dict[str, Path], force: bool) -> None:
    """Refuse a ``--junit`` path that is one of the command's input files (by device and inode: links and hard
    links too) or an existing file that is not attn-export's JUnit XML (unless ``force``); nothing is written."""
    from attn_export.errors import ConfigError

    try:
        st = os.stat(junit)
    except OSError:
        st = None
    for flag, path in inputs.items():
        try:
            other = os.stat(path)
        except OSError:
            continue
        if st is not None and (st.st_dev, st.st_ino) == (other.st_dev, other.st_ino) or os.path.realpath(junit) == os.path.realpath(path):
            raise ConfigError(f"--junit {junit} is the {flag} file {path}; writing JUnit XML there would destroy it: pass another --junit path")
    if st is not None and not force and not is_our_junit(junit):
        raise ConfigError(f"--junit {junit} exists and is not a JUnit file attn-export wrote; pass another --junit path, or add --force to replace it")
