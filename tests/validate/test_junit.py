"""JUnit XML from the gate parses, follows the Ant JUnit element order, names each failing
stage/metric and records which CPU classes were compared."""

from __future__ import annotations

import copy
import xml.etree.ElementTree as ET

from validate.test_gate import AVX2, VNNI, _report

from attn_export.validate.gate.check import check_report, make_baseline
from attn_export.validate.junit import junit_xml, write_junit


def _assert_ant_junit_shape(root: ET.Element) -> None:
    """testsuites > testsuite (properties, testcase*, system-out?), with consistent counts."""
    assert root.tag == "testsuites"
    for suite in root:
        assert suite.tag == "testsuite" and {"name", "tests", "failures", "errors"} <= set(suite.attrib)
        tags = [child.tag for child in suite]
        assert tags[0] == "properties", tags
        body = tags[1:-1] if tags[-1] == "system-out" else tags[1:]
        assert set(body) <= {"testcase"}, tags
        cases = suite.findall("testcase")
        assert int(suite.get("tests")) == len(cases)
        assert int(suite.get("failures")) == sum(c.find("failure") is not None for c in cases)
        for prop in suite.find("properties"):
            assert prop.tag == "property" and set(prop.attrib) == {"name", "value"}
        for case in cases:
            assert {"classname", "name"} <= set(case.attrib)


def test_junit_file_parses_with_one_case_per_metric(tmp_path):
    rep = _report()
    base = make_baseline(rep)
    bad = copy.deepcopy(rep)
    bad["stages"][1]["accuracy"]["cosine"] = 0.9
    bad["stages"].append(dict(bad["stages"][0], name="extra"))
    res = check_report(bad, base, latency_margin=0.2)
    path = write_junit(res, tmp_path / "sub" / "gate.xml")
    root = ET.parse(path).getroot()
    _assert_ant_junit_shape(root)
    suite = root.find("testsuite")
    cases = suite.findall("testcase")
    assert len(cases) == len(res.checks) == int(suite.get("tests"))
    failed = [(c.get("classname"), c.get("name")) for c in cases if c.find("failure") is not None]
    assert failed == [("attn-export-gate.onnx-int8", "cosine")]
    assert suite.get("failures") == "1"
    fail = suite.find("testcase/failure")
    assert "onnx-int8/cosine" in fail.get("message") and "limit" in fail.text
    props = {p.get("name"): p.get("value") for p in suite.find("properties")}
    assert props["new_stages"] == "extra"
    assert (props["report_class"], props["baseline_class"], props["cross_class"]) == (VNNI, VNNI, "false")
    assert not list(tmp_path.joinpath("sub").glob(".*.tmp"))  # atomic write left no temp file


def test_junit_says_when_it_compared_across_classes():
    base = make_baseline(_report(VNNI))
    res = check_report(_report(AVX2), base)
    root = ET.fromstring(junit_xml(res))
    _assert_ant_junit_shape(root)
    suite = root.find("testsuite")
    props = {p.get("name"): p.get("value") for p in suite.find("properties")}
    assert (props["report_class"], props["baseline_class"], props["cross_class"]) == (AVX2, VNNI, "true")
    out = suite.find("system-out").text
    assert "cross-class" in out and "notice:" in out
    assert all("cross-class slack" in c.find("system-out").text for c in suite.findall("testcase"))


def test_text_with_markup_characters_stays_valid_xml():
    rep = _report()
    rep["stages"][1]["name"] = 'int8 <"&">'
    res = check_report(rep, make_baseline(_report()))
    root = ET.fromstring(junit_xml(res))  # parses: ElementTree escaped it
    _assert_ant_junit_shape(root)
    props = {p.get("name"): p.get("value") for p in root.find("testsuite/properties")}
    assert props["new_stages"] == 'int8 <"&">'
