"""The gate ties a report to the files beside it: every artifact it judged has its sha256 row,
is present and has those bytes, and the run that wrote it completed (``gate_hashes``)."""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path

import pytest

from attn_export.errors import DataError
from attn_export.validate.gate.check import check_run_folder, verify_artifact_hashes


def _report(folder: Path) -> dict:
    (folder / "model.onnx").write_bytes(b"fp32")
    (folder / "model.int8.onnx").write_bytes(b"int8")
    stages = [{"name": n, "artifact": str(folder / f), "details": {"sha256": hashlib.sha256((folder / f).read_bytes()).hexdigest()}}
              for n, f in (("onnx-fp32", "model.onnx"), ("onnx-int8", "model.int8.onnx"))]  # fmt: skip
    stages.append({"name": "torchao", "artifact": None, "details": {}})  # an eager-only route: nothing to hash
    return {"stages": stages, "selection": {"int8": {"artifact": str(folder / "model.int8.onnx"), "sha256": stages[1]["details"]["sha256"]}}}


def _bad(checks: list) -> dict[str, str]:
    return {c.stage: c.message for c in checks if not c.ok}


def test_matching_artifacts_pass_one_check_each(tmp_path: Path) -> None:
    checks = verify_artifact_hashes(_report(tmp_path), tmp_path)
    assert [(c.stage, c.ok) for c in checks] == [("onnx-fp32", True), ("onnx-int8", True), ("selection.int8", True)]


def test_a_removed_hash_row_is_an_error_not_an_omission(tmp_path: Path) -> None:
    report = _report(tmp_path)
    del report["stages"][1]["details"]["sha256"]
    assert "records no sha256 for model.int8.onnx" in _bad(verify_artifact_hashes(report, tmp_path))["onnx-int8"]


def test_a_renamed_or_missing_artifact_fails(tmp_path: Path) -> None:
    report = _report(tmp_path)
    report["stages"][0]["artifact"] = str(tmp_path / "renamed.onnx")
    (tmp_path / "model.int8.onnx").unlink()
    bad = _bad(verify_artifact_hashes(report, tmp_path))
    assert "renamed.onnx, the artifact this report judged, is not beside the report" in bad["onnx-fp32"]
    assert set(bad) == {"onnx-fp32", "onnx-int8", "selection.int8"}


def test_a_fifo_or_a_link_under_an_artifacts_name_fails_without_blocking(tmp_path: Path) -> None:
    report = _report(tmp_path)
    (tmp_path / "model.int8.onnx").unlink()
    os.mkfifo(tmp_path / "model.int8.onnx")
    (tmp_path / "model.onnx").rename(tmp_path / "real.onnx")
    (tmp_path / "model.onnx").symlink_to(tmp_path / "real.onnx")
    bad = _bad(verify_artifact_hashes(report, tmp_path))
    assert "is a FIFO (named pipe), not the file the run wrote" in bad["onnx-int8"]
    assert "is a symbolic link, not the file the run wrote" in bad["onnx-fp32"]


def _manifest(folder: Path, status: str = "complete", report: bytes | None = None) -> Path:
    artifacts = {} if report is None else {"report.json": {"sha256": hashlib.sha256(report).hexdigest(), "size_bytes": len(report)}}
    path = folder / "run.json"
    path.write_text(json.dumps({"format": "attn-export-run/1", "status": status, "artifacts": artifacts}))
    return path


def test_the_run_folder_check_refuses_an_incomplete_run_and_passes_a_complete_one(tmp_path: Path) -> None:
    report = tmp_path / "report.json"
    report.write_bytes(b"{}")
    _manifest(tmp_path, "running", b"{}")
    with pytest.raises(DataError) as err:
        check_run_folder(report)
    assert "its run did not complete" in str(err.value) and "'running'" in str(err.value) and "\n" not in str(err.value)
    _manifest(tmp_path, "complete", b"{}")
    checks, notices = check_run_folder(report)
    assert [c.ok for c in checks] == [True] and notices == []


def test_an_edited_or_foreign_report_fails_against_its_run_json(tmp_path: Path) -> None:
    report = tmp_path / "report.json"
    report.write_bytes(b'{"edited": true}')
    _manifest(tmp_path, "complete", b"{}")
    [check] = check_run_folder(report)[0]
    assert not check.ok and "not the report its run wrote" in check.message
    other = tmp_path / "other.json"
    other.write_bytes(b"{}")
    [check] = check_run_folder(other)[0]
    assert not check.ok and "not among the files the run beside it wrote" in check.message


def test_a_run_json_that_is_a_link_is_refused_and_none_is_a_notice(tmp_path: Path) -> None:
    report = tmp_path / "report.json"
    report.write_bytes(b"{}")
    assert check_run_folder(report)[0] == [] and "no run.json beside report.json" in check_run_folder(report)[1][0]
    (tmp_path / "elsewhere").mkdir()
    real = _manifest(tmp_path / "elsewhere", "complete", b"{}")
    (tmp_path / "run.json").symlink_to(real)
    with pytest.raises(DataError, match="got a symbolic link"):
        check_run_folder(report)
