"""Round four, TensorRT releases and check-trt: releases that do not exist, releases a target has no
build of, an opset decided after the export instead of before it, and names from a user's ONNX
file that forge lines in check-trt's output (issue 28).

c26: TensorRT releases and target combinations that do not exist; c29: misleading messages (an opset
refused only after the export); c04: check-trt's output forged by a hostile graph.
"""

from __future__ import annotations

import json
from pathlib import Path

import onnx
import pytest
from onnx import TensorProto, helper
from rel_helpers import TINY, assert_refused, run_cli

from attn_export.checks.trt_compat import check_trt_compat
from attn_export.checks.trt_support import OP_SUPPORT
from attn_export.targets.targets import TARGETS, export_spec_for, get_target

FORGED = "x\nERROR: forged"


def _relu_model(path: Path, input_name: str = "x", node_name: str = "relu", opset: int = 18) -> Path:
    """One Relu over a (batch, seq, 8) input, built with onnx.helper; the names are the caller's."""
    x = helper.make_tensor_value_info(input_name, TensorProto.FLOAT, ["batch", "seq", 8])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch", "seq", 8])
    node = helper.make_node("Relu", [input_name], ["y"], name=node_name)
    model = helper.make_model(helper.make_graph([node], "g", [x], [y]), opset_imports=[helper.make_opsetid("", opset)], ir_version=10)
    onnx.checker.check_model(model)
    onnx.save(model, path)
    return path


# -- c26: a release the tables do not know, a release the target has no build of ----------------------
@pytest.mark.parametrize("version", ["11.99", "10.99", "12.0", "11.6.0.1"], ids=lambda v: f"c26-unknown-{v}")
def test_c26_unknown_trt_version_is_refused_listing_the_known_ones(version: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    o = run_cli(["--target", "tensorrt", "--trt-version", version, *TINY, "--out", tmp_path / "out"], capsys, tmp_path)
    assert_refused(o, version)
    assert "10.0-10.16" in o.err and "11.0-11.5" in o.err, o.err  # the releases it does know


def test_c26_check_trt_refuses_an_unknown_release_before_writing(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    model = _relu_model(tmp_path / "m.onnx")
    o = run_cli(["check-trt", model, "--trt", "11.99", "--json", tmp_path / "findings.json"], capsys, tmp_path)
    assert_refused(o, "11.99")
    assert "--trt" in o.err and "10.0-10.16" in o.err, o.err
    with pytest.raises(Exception, match="11.99"):
        check_trt_compat(model, "11.99")


@pytest.mark.parametrize("version", ["11.0", "11.2", "10.14", "10.8"], ids=lambda v: f"c26-jetson-{v}")
def test_c26_jetson_refuses_a_release_no_jetpack_ships(version: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    o = run_cli(["--target", "jetson", "--trt-version", version, *TINY, "--out", tmp_path / "out"], capsys, tmp_path)
    assert_refused(o, f"TensorRT {version}")
    # the releases the target has, each with the JetPack that ships it (from the release table)
    assert "10.3 (JetPack 6.1+)" in o.err and "11.4 (JetPack 7.2.2+)" in o.err, o.err


def test_c26_jetson_accepts_exactly_the_releases_a_jetpack_ships() -> None:
    from attn_export.targets.trt_releases import RELEASES

    jetson = get_target("jetson")
    shipped = {str(r.version) for r in RELEASES.values() if r.jetpack}
    assert shipped == {"10.3", "10.13", "10.16", "11.4"}  # JetPack 6.1, 7.0/7.1, 7.2, 7.2.2 (targets/trt_releases.py JETPACKS)
    for version in RELEASES:
        if str(version) in shipped:
            assert jetson.release(str(version)).jetpack
        else:
            with pytest.raises(Exception, match="names no JetPack that ships it"):
                jetson.release(str(version))
    assert get_target("tensorrt").release("11.0").version == next(v for v in RELEASES if str(v) == "11.0")  # servers have every release


# -- c29: the opset is decided from the release, before the export --------------------------------------
def test_c29_the_default_opset_follows_the_release(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """--trt-version 10.0 (parser: opset <= 20) used to export at opset 23 and refuse afterwards."""
    o = run_cli(["--target", "tensorrt", "--trt-version", "10.0", *TINY, "--out", tmp_path / "out"], capsys, tmp_path)
    assert o.code == 0, o.err
    model = onnx.load(tmp_path / "out" / "model.onnx", load_external_data=False)
    opset = next(i.version for i in model.opset_import if i.domain in ("", "ai.onnx"))
    assert opset == 20, opset
    assert "TensorRT 10.0 check: PASS" in o.out, o.out


def test_c29_every_release_gets_an_opset_its_parser_reads() -> None:
    from attn_export.targets.trt_releases import RELEASES

    for version, row in RELEASES.items():
        for name, target in TARGETS.items():
            if version not in target.trt_releases:
                continue
            for precision in ("fp32", "fp16"):
                spec = export_spec_for(name, precision, trt_version=str(version))
                assert spec.resolved_opset <= row.max_opset, (name, version, spec)
                assert spec.resolved_opset == min(target.opset, row.max_opset), (name, version, spec)


def test_c29_the_release_table_cites_a_source_for_every_max_opset() -> None:
    from attn_export.targets.trt_releases import RELEASES, SOURCES

    for version, row in RELEASES.items():
        assert row.opset_source in SOURCES and 20 <= row.max_opset <= 25, version
        if row.jetpack:
            assert row.jetpack_source in SOURCES, version
    # the Attention importer (10.14) never lands on a release whose parser cannot read opset 23
    since = OP_SUPPORT["Attention"].since
    assert all(r.max_opset >= 23 for v, r in RELEASES.items() if since is not None and v >= since)


@pytest.mark.parametrize(
    ("options", "expect"),
    [
        ({"target": "tensorrt", "trt_version": "10.0", "opset": 23}, ("--opset 23", "20")),
        ({"target": "jetson", "opset": 21}, ("--opset 21", "20")),
        ({"target": "tensorrt", "trt_version": "10.9", "opset": 23}, ("--opset 23", "22")),
        ({"target": "tensorrt", "trt_version": "10.3", "attention": "onnx-attention"}, ("--attention onnx-attention", "20", "23")),
    ],
    ids=["c29-opset23-on-10.0", "c29-opset21-on-jetson", "c29-opset23-on-10.9", "c29-onnx-attention-on-10.3"],
)
def test_c29_an_opset_the_release_cannot_parse_is_refused_up_front(
    options: dict[str, object], expect: tuple[str, ...], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Refused while the options are validated (the RunConfig itself), naming both opsets, not by the check after an export."""
    from attn_export.config.run import RunConfig
    from attn_export.errors import ConfigError

    with pytest.raises(ConfigError) as err:
        RunConfig(**options)  # type: ignore[arg-type]
    for word in expect:
        assert word in str(err.value), (word, str(err.value))
    args = [a for k, v in options.items() for a in (f"--{k.replace('_', '-')}", str(v))]
    o = run_cli([*args, *TINY, "--out", tmp_path / "out"], capsys, tmp_path)
    assert_refused(o, expect[0])
    assert "fails the TensorRT" not in o.err, o.err


# -- c04: names from the user's ONNX file cannot forge check-trt's lines ----------------------------
def test_c04_a_newline_in_an_input_name_does_not_forge_a_line(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    model = _relu_model(tmp_path / "m.onnx", input_name=FORGED, node_name="relu\u2028ERROR: second\x1b[31m")
    findings_json = tmp_path / "findings.json"
    o = run_cli(["check-trt", model, "--trt", "10.3", "--json", findings_json], capsys, tmp_path)
    assert o.code == 0, o.err
    lines = o.out.splitlines()
    report = check_trt_compat(model, "10.3")
    assert len(lines) == 1 + len(report.findings), lines  # the head, then one line per finding
    assert not any(line.startswith("ERROR:") for line in lines), lines
    assert any("x\\nERROR: forged" in line for line in lines), lines  # shown escaped, as repr writes it
    assert "\x1b" not in o.out
    data = json.loads(findings_json.read_text())
    nodes = [f["node"] for f in data["findings"]]
    assert "x\\nERROR: forged" in nodes and not any("\n" in n for n in nodes), nodes


def test_c04_names_in_messages_and_errors_are_escaped_too(tmp_path: Path) -> None:
    """A STRING input (an error naming the input) and a forged graph name: every line of the report is one finding."""
    x = helper.make_tensor_value_info(FORGED, TensorProto.STRING, [2])
    y = helper.make_tensor_value_info("y\r\nWARNING fake", TensorProto.STRING, [2])
    node = helper.make_node("Identity", [FORGED], ["y\r\nWARNING fake"], name="id\x85INFO fake")
    model = helper.make_model(helper.make_graph([node], "graph\nERROR: head", [x], [y]), opset_imports=[helper.make_opsetid("", 18)])
    report = check_trt_compat(model, "10.3")
    text = str(report)
    assert report.errors and len(text.splitlines()) == 1 + len(report.findings), text.splitlines()
    assert all(line.split(" ", 1)[0] in ("ERROR", "WARNING", "INFO") for line in text.splitlines()[1:]), text
    assert "graph\\nERROR: head" in text.splitlines()[0]
    assert "\x85" not in text and "\r" not in text
