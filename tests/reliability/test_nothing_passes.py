"""Nothing passes on nothing (issue 20, class 13): ``attn-export check`` fails, with a clear line,
on a report that compares nothing, a slack too wide to fail, a removed hash row or a renamed
artifact, and refuses a report whose run did not complete.

Each case starts from a complete run folder made by the run-directory code (``stamped_run``:
report.json stamped with its artifacts' sha256, run.json complete), records a baseline from it,
attacks the report, the baseline or the files, and runs the real ``check`` command. The clean
run passes (the control). Gate-logic cases check the report out of its run folder (artifacts
beside it, no run.json), so the verdict is the gate's alone.
"""

from __future__ import annotations

import json
import shutil
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import pytest
from rel_helpers import assert_refused, run_cli, stamped_run, write_json

from attn_export.validate.gate.check import MAX_SLACK, make_baseline

INT8 = "classes.x86-avx2.stages.onnx-int8.metrics"


@dataclass(frozen=True)
class Case:
    id: str
    attack: Callable[[Path, dict, dict], None]  # (run folder, report, baseline), mutated in place
    expect: str
    code: int = 1
    in_run_folder: bool = True  # False: run.json removed (the report is checked out of its run folder)


def _at(d: dict, path: str) -> dict:
    for k in path.split("."):
        d = d[k]
    return d


def _max_slack(base: dict) -> None:
    for metric, spec in _at(base, INT8).items():
        spec.update(MAX_SLACK[metric])
    base["cross_class_slack"]["int8"] = {m: dict(MAX_SLACK[m]) for m in ("cosine", "sqnr_db", "rel_l2", "max_abs")}


def _cosine_half(out: Path, report: dict, base: dict) -> None:
    """Every slack at its maximum, compared across CPU classes (the widest the gate gets), int8 cosine 0.5."""
    _max_slack(base)
    report["environment"]["cpu"] = {"isa_class": "x86-avx512-vnni", "u8s8_saturates": False}
    report["stages"][1]["accuracy"].update(cosine=0.5, rel_l2=0.04, max_abs=0.05, sqnr_db=25.0)


def _presence_only(out: Path, report: dict, base: dict) -> None:
    for stage in _at(base, "classes.x86-avx2.stages").values():
        stage["metrics"] = {}
        stage.pop("passed", None)


def _all_skipped(out: Path, report: dict, base: dict) -> None:
    report["selection"]["skipped_stages"] = {s["name"]: "not built on this machine" for s in report["stages"]}
    report["stages"] = []


def _hash_row_removed(out: Path, report: dict, base: dict) -> None:
    del report["stages"][1]["details"]["sha256"]
    (out / "model.int8.onnx").write_bytes(b"another run's int8 model")


def _artifact_renamed_in_report(out: Path, report: dict, base: dict) -> None:
    report["stages"][1]["artifact"] = str(out / "model.int8.renamed.onnx")
    (out / "model.int8.onnx").write_bytes(b"another run's int8 model")


def _artifact_renamed_on_disk(out: Path, report: dict, base: dict) -> None:
    (out / "model.int8.onnx").rename(out / "model.int8.old.onnx")


def _another_runs_model(out: Path, report: dict, base: dict) -> None:
    (out / "model.int8.onnx").write_bytes(b"another run's int8 model")


def _run_json(status: str) -> Callable[[Path, dict, dict], None]:
    def attack(out: Path, report: dict, base: dict) -> None:
        manifest = json.loads((out / "run.json").read_text())
        manifest["status"] = status
        (out / "run.json").write_text(json.dumps(manifest))

    return attack


def _run_json_link(out: Path, report: dict, base: dict) -> None:
    (out / "run.json").rename(out.parent / "elsewhere.json")
    (out / "run.json").symlink_to(out.parent / "elsewhere.json")


def _slack(path: str, value: float) -> Callable[[Path, dict, dict], None]:
    def attack(out: Path, report: dict, base: dict) -> None:
        *head, last = path.split(".")
        _at(base, ".".join(head))[last] = value

    return attack


CASES = [
    Case("c13-clean-run-passes", lambda o, r, b: None, "PASS", code=0),
    Case("c13-cross-class-slack-1e300-is-refused", _slack("cross_class_slack.int8.cosine.abs", 1e300), "cross_class_slack.int8.cosine.abs: expected at most 0.01", code=2),
    Case("c13-own-slack-1e300-is-refused", _slack(f"{INT8}.cosine.abs", 1e300), "onnx-int8.metrics.cosine.abs: expected at most", code=2),
    Case("c13-own-rel-slack-1e300-is-refused", _slack(f"{INT8}.rel_l2.rel", 1e300), "rel_l2.rel: expected at most 4", code=2),
    Case("c13-cosine-0.5-fails-at-the-maximum-slack", _cosine_half, "REGRESSION: below limit", in_run_folder=False),
    Case("c13-a-baseline-of-presence-only-stages-compares-nothing", _presence_only, "nothing compared", in_run_folder=False),
    Case("c13-a-report-that-skipped-every-stage-compares-nothing", _all_skipped, "nothing compared", in_run_folder=False),
    Case("c13-a-removed-hash-row-fails", _hash_row_removed, "records no sha256 for model.int8.onnx"),
    Case("c13-a-removed-hash-row-fails-out-of-the-run-folder", _hash_row_removed, "records no sha256 for model.int8.onnx", in_run_folder=False),
    Case("c13-an-edited-report-fails-against-its-run-json", _hash_row_removed, "report.json is not the report its run wrote"),
    Case("c13-an-artifact-renamed-in-the-report-fails", _artifact_renamed_in_report, "model.int8.renamed.onnx, the artifact this report judged, is not beside the report"),
    Case("c13-an-artifact-renamed-on-disk-fails", _artifact_renamed_on_disk, "model.int8.onnx, the artifact this report judged, is not beside the report"),
    Case("c13-another-runs-model-beside-the-report-fails", _another_runs_model, "two runs are mixed"),
    Case("c13-a-running-run-json-is-refused", _run_json("running"), "did not complete", code=2),
    Case("c13-a-run-json-link-is-refused", _run_json_link, "got a symbolic link", code=2),
]


@pytest.mark.parametrize("case", CASES, ids=[c.id for c in CASES])
def test_check_fails_or_refuses_on_nothing_with_a_clear_line(case: Case, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "out"
    report_path = stamped_run(out)
    report = json.loads(report_path.read_text())
    base = make_baseline(report)
    if not case.in_run_folder:
        (out / "run.json").unlink()
    case.attack(out, report, base)
    if report != json.loads(report_path.read_text()):
        report_path.write_text(json.dumps(report))
    baseline = write_json(tmp_path / "baseline.json", base)
    o = run_cli(["check", report_path, "--baseline", baseline], capsys, tmp_path)
    if case.code == 2:
        assert_refused(o, case.expect)
        return
    assert o.code == case.code, (o.code, o.out, o.err)
    assert "Traceback" not in o.err and not o.err.strip(), o.err
    assert case.expect in o.out, o.out
    if case.code == 1:
        assert o.out.strip().splitlines()[-1].startswith("FAIL:"), o.out


def test_c13_a_report_copied_out_of_its_run_folder_passes_with_a_notice(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """Archived reports stay checkable: the artifacts travel with it; the missing run.json is said, not hidden."""
    out = tmp_path / "out"
    stamped_run(out)
    copy = tmp_path / "archive"
    copy.mkdir()
    for name in ("report.json", "model.onnx", "model.int8.onnx"):
        shutil.copy(out / name, copy / name)
    baseline = write_json(tmp_path / "baseline.json", make_baseline(json.loads((out / "report.json").read_text())))
    o = run_cli(["check", copy / "report.json", "--baseline", baseline], capsys, tmp_path)
    assert o.code == 0, o.out
    assert "notice: no run.json beside report.json" in o.out
