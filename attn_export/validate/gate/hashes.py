"""The gate's checks that a report is about the files beside it, and that its run completed.

``RunDir.stamp`` records the sha256 of every artifact a report judged (``details.sha256``,
``selection[*].sha256``) and the run's ``run.json`` records the sha256 of every file it wrote,
``report.json`` included, and says ``"status": "complete"`` only once the run finished. So:

* a report whose ``run.json`` is not complete (the run was killed, or is still going) is
  refused (``check_run_folder``: one line, exit 2): its report may be half-written;
* a report that is not the file its ``run.json`` recorded (edited or replaced since) fails;
* a stage that names an artifact but records no sha256 fails: a removed hash row is an
  error, not an omission (every artifact a run writes is in ``--out`` and hashed);
* an artifact that is not beside the report (renamed, deleted), or is not a regular file,
  fails; one whose bytes differ fails: the outputs of two runs are mixed.

Files are opened without following a link and checked to be regular first (a FIFO planted
under an artifact's name never blocks the gate).
"""

from __future__ import annotations

import os
import stat
from collections.abc import Mapping
from pathlib import Path, PurePath
from typing import Any

from attn_export.errors import DataError
from attn_export.outdir.manifest import MANIFEST_NAME, RunManifestSchema, sha256_regular
from attn_export.validate.gate.result import GateCheck

__all__ = ["check_run_folder", "verify_artifact_hashes"]

_RERUN = "rerun attn-export into its own --out"


def verify_artifact_hashes(report: Mapping[str, Any], folder: str | os.PathLike[str]) -> list[GateCheck]:
    """One check per artifact the report judged (each stage and selection entry naming one): its
    sha256 is recorded, its file is beside the report (in ``folder``) and has those bytes."""
    entries: list[tuple[str, Any, Any]] = [(str(s.get("name")), s.get("artifact"), (s.get("details") or {}).get("sha256")) for s in report.get("stages") or []]
    entries += [(f"selection.{k}", v.get("artifact"), v.get("sha256")) for k, v in (report.get("selection") or {}).items() if isinstance(v, Mapping)]
    checks: list[GateCheck] = []
    for name, artifact, expected in entries:
        if not isinstance(artifact, str) or not artifact:
            continue  # nothing judged from a file (an eager-only route)
        path = Path(folder) / PurePath(artifact).name
        if not isinstance(expected, str):
            msg = (f"the report records no sha256 for {path.name}, the artifact it judged: it was edited, or not written by "
                   f"attn-export, so nothing ties it to the file beside it; {_RERUN}")  # fmt: skip
            checks.append(GateCheck(name, "sha256", None, None, None, False, msg))
            continue
        got, problem = sha256_regular(path)
        if got is None:
            what = "is not beside the report (renamed or deleted)" if problem == "missing" else f"is {problem}, not the file the run wrote"
            checks.append(GateCheck(name, "sha256", None, None, None, False,
                                    f"{path.name}, the artifact this report judged, {what}; check the report in its run folder, or {_RERUN}"))  # fmt: skip
            continue
        ok = got == expected
        msg = "matches the report" if ok else (
            f"{path.name} is not the file this report judged (sha256 {got[:12]}..., the report has {expected[:12]}...): "
            f"the outputs of two runs are mixed; {_RERUN}"
        )  # fmt: skip
        checks.append(GateCheck(name, "sha256", None, None, None, ok, msg))
    return checks


def check_run_folder(report_path: str | os.PathLike[str]) -> tuple[list[GateCheck], list[str]]:
    """(checks, notices) from the ``run.json`` beside ``report_path``.

    Raises DataError (one line) when that ``run.json`` is not a regular file, not a run manifest,
    or not complete. A report without one (copied out of its run folder) gets a notice."""
    from attn_export.host.paths import file_kind
    from attn_export.outdir.recovery import PREVIOUS_NAME
    from attn_export.validate.schema import read_json, validate

    report_path = Path(report_path)
    if report_path.parent.name == PREVIOUS_NAME:  # the last complete run, set aside while a later run was under way
        raise DataError(
            f"{report_path}: this is the last complete run, set aside while a later run in {report_path.parent.parent} was under way "
            f"(killed or still running); run attn-export again with --out {report_path.parent.parent} (a failing run puts it back), then check there"
        )
    manifest = report_path.parent / MANIFEST_NAME
    try:
        st = os.lstat(manifest)
    except FileNotFoundError:
        return [], [f"no {MANIFEST_NAME} beside {report_path.name}: whether its run completed, and that the report is the one it wrote, "
                    "cannot be checked (check the report in its run folder)"]  # fmt: skip
    fix = f"check a report in the folder of a run that completed, or {_RERUN}"
    if not stat.S_ISREG(st.st_mode):
        raise DataError(f"{manifest}: expected the run's {MANIFEST_NAME}, got {file_kind(st.st_mode)}; {fix}")
    data = read_json(manifest, f"an attn-export {MANIFEST_NAME}", fix)
    validate(RunManifestSchema, data, str(manifest), fix)
    if data["status"] != "complete":
        from attn_export.outdir.bookkeeping import lock_is_held
        from attn_export.outdir.recovery import LOCK_NAME

        held = lock_is_held(report_path.parent / LOCK_NAME)  # a live run holds its folder's lock; a killed one cannot
        why = {True: f"it is still running (pid {data.get('pid')} holds {LOCK_NAME}): wait for it to finish",
               False: f"it was killed (no process holds {LOCK_NAME}): the next run into {report_path.parent} clears its files",
               None: "it was killed or is still running"}[held]  # fmt: skip
        raise DataError(f"{report_path}: its run did not complete ({manifest} says status {data['status']!r}; {why}), "
                        f"so the report may be half-written and its files a mix; {_RERUN}")
    recorded = (data.get("artifacts") or {}).get(report_path.name)
    if recorded is None:
        msg = f"{report_path.name} is not among the files the run beside it wrote ({manifest}); check that run's own report.json, or {_RERUN}"
        return [GateCheck(report_path.name, "sha256", None, None, None, False, msg)], []
    got, problem = sha256_regular(report_path)
    ok = got == recorded["sha256"]
    msg = f"matches {MANIFEST_NAME}" if ok else (
        f"{report_path.name} is not the report its run wrote (sha256 {(got or problem or '')[:12]}..., {MANIFEST_NAME} has "
        f"{recorded['sha256'][:12]}...): it was edited or replaced after the run; {_RERUN}"
    )  # fmt: skip
    return [GateCheck(report_path.name, "sha256", None, None, None, ok, msg)], []
