"""JUnit XML from the gate parses and names each failing stage/metric."""

from __future__ import annotations

import copy
import xml.etree.ElementTree as ET

from validate.test_gate import _report

from attn_export.validate.gate import check_report, make_baseline
from attn_export.validate.junit import write_junit


def test_junit_file_parses_with_one_case_per_metric(tmp_path):
    rep = _report()
    base = make_baseline(rep)
    bad = copy.deepcopy(rep)
    bad["stages"][1]["accuracy"]["cosine"] = 0.9
    bad["stages"].append(dict(bad["stages"][0], name="extra"))
    res = check_report(bad, base, latency_margin=0.2)
    path = write_junit(res, tmp_path / "sub" / "gate.xml")
    root = ET.parse(path).getroot()
    suite = root.find("testsuite")
    cases = suite.findall("testcase")
    assert len(cases) == len(res.checks) == int(suite.get("tests"))
    failed = [(c.get("classname"), c.get("name")) for c in cases if c.find("failure") is not None]
    assert failed == [("attn-export-gate.onnx-int8", "cosine")]
    assert suite.get("failures") == "1"
    fail = suite.find("testcase/failure")
    assert "onnx-int8/cosine" in fail.get("message") and "limit" in fail.text
    assert suite.find("properties/property").get("value") == "extra"
    assert not list(tmp_path.joinpath("sub").glob(".*.tmp"))  # atomic write left no temp file
