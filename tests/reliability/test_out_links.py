"""``--out`` never follows a link (issue 20, class 11): a shared output folder is hostile territory.

Each attack plants links (or a forged ``run.json``) in ``--out`` aimed at a sacrificial file or
folder outside it, runs the real command, and checks the refusal (exit 2, one line) and that the
target is untouched: contents, mtime and, for a folder, every entry. ``--out`` itself is
unchanged too: nothing was moved before the refusal.
"""

from __future__ import annotations

import hashlib
import json
import os
from collections.abc import Callable
from pathlib import Path

import pytest
from rel_helpers import TINY, assert_refused, earlier_run, files_of, run_cli, tree

FORGED = {"format": "attn-export-run/1", "status": "complete"}


def _victim(t: Path) -> Path:
    (t / "outside").mkdir(exist_ok=True)
    victim = t / "outside" / "victim.txt"
    victim.write_text("precious, and not attn-export's\n")
    return victim


def _sha(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def _forge(out: Path, artifacts: dict[str, str]) -> None:
    """A run.json listing ``artifacts`` (name -> the sha256 an attacker computes from the file)."""
    listed = {name: {"sha256": sha, "size_bytes": 1} for name, sha in artifacts.items()}
    (out / "run.json").write_text(json.dumps({**FORGED, "artifacts": listed}))


# each builds the attack under t and returns (--out, the sacrificial paths outside it)
def _lock_symlink(t: Path) -> tuple[Path, list[Path]]:
    out, victim = t / "out", _victim(t)
    out.mkdir()
    (out / ".attn-export.lock").symlink_to(victim)
    return out, [victim]


def _lock_hardlink(t: Path) -> tuple[Path, list[Path]]:
    out, victim = t / "out", _victim(t)
    out.mkdir()
    os.link(victim, out / ".attn-export.lock")  # same inode: truncating the lock would truncate the victim
    return out, [victim]


def _previous_symlink(t: Path) -> tuple[Path, list[Path]]:
    out, folder = t / "out", t / "outside" / "cron.d"
    folder.mkdir(parents=True)
    earlier_run(out)
    (out / ".attn-export-previous").symlink_to(folder)
    return out, [folder]


def _planted_file_through_previous(t: Path) -> tuple[Path, list[Path]]:
    """The issue's cron attack: a forged run.json lists a planted file, the aside folder points at /etc/cron.d."""
    out, folder = t / "out", t / "outside" / "cron.d"
    folder.mkdir(parents=True)
    out.mkdir()
    payload = out / "payload"
    payload.write_text("* * * * * root sh -c 'echo owned'\n")
    _forge(out, {"payload": _sha(payload)})
    (out / ".attn-export-previous").symlink_to(folder)
    return out, [folder]


def _listed_through_linked_folder(t: Path) -> tuple[Path, list[Path]]:
    out, victim = t / "out", _victim(t)
    out.mkdir()
    (out / "link").symlink_to(victim.parent)
    _forge(out, {"link/victim.txt": _sha(victim)})
    return out, [victim.parent]


def _manifest_symlink(t: Path) -> tuple[Path, list[Path]]:
    out, victim = t / "out", _victim(t)
    out.mkdir()
    (out / "run.json").symlink_to(victim)
    return out, [victim]


def _artifact_symlink(t: Path) -> tuple[Path, list[Path]]:
    """model.onnx -> a file outside: the export would write through it."""
    out, victim = t / "out", _victim(t)
    earlier_run(out)
    (out / "model.onnx").unlink()
    (out / "model.onnx").symlink_to(victim)
    return out, [victim]


def _out_symlink(t: Path) -> tuple[Path, list[Path]]:
    real = t / "outside" / "real"
    real.mkdir(parents=True)
    (real / "keep.txt").write_text("mine")
    (t / "out").symlink_to(real)
    return t / "out", [real]


ATTACKS: dict[str, Callable[[Path], tuple[Path, list[Path]]]] = {
    "c11-lock-is-a-symlink-to-a-file-outside": _lock_symlink,
    "c11-lock-is-a-hard-link-to-a-file-outside": _lock_hardlink,
    "c11-previous-is-a-symlink-to-a-folder-outside": _previous_symlink,
    "c11-forged-run-json-moves-a-planted-file-through-a-linked-previous": _planted_file_through_previous,
    "c11-forged-run-json-lists-a-file-through-a-linked-folder": _listed_through_linked_folder,
    "c11-run-json-is-a-symlink-to-a-file-outside": _manifest_symlink,
    "c11-an-artifact-name-is-a-symlink-to-a-file-outside": _artifact_symlink,
    "c11-out-is-a-symlink": _out_symlink,
}


@pytest.mark.parametrize("attack", list(ATTACKS), ids=list(ATTACKS))
def test_an_attack_through_a_link_is_refused_and_its_target_untouched(attack: str, tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                                                      monkeypatch: pytest.MonkeyPatch) -> None:  # fmt: skip
    monkeypatch.chdir(tmp_path)
    out, targets = ATTACKS[attack](tmp_path)
    before = {p: tree(p) for p in targets}
    out_before = tree(out)
    o = run_cli([*TINY, "--out", out], capsys, tmp_path)
    assert_refused(o, "hard links" if "hard-link" in attack else "is a symbolic link")
    assert {p: tree(p) for p in targets} == before, "the target outside --out changed"
    assert tree(out) == out_before, "--out changed before the refusal"


@pytest.mark.parametrize("argv", [["--out", ""], ["bench", "--out", ""], ["report", "r.json", "--out", ""], ["--out="]],
                         ids=["c11-out-empty-string", "c11-bench-out-empty-string", "c11-report-out-empty-string", "c11-out-equals-empty"])  # fmt: skip
def test_an_empty_out_is_refused_not_the_current_folder(argv: list[str], tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                                        monkeypatch: pytest.MonkeyPatch) -> None:  # fmt: skip
    from rel_helpers import good_report, write_json

    monkeypatch.chdir(tmp_path)
    write_json(tmp_path / "r.json", good_report())
    o = run_cli([*TINY, *argv] if argv[0].startswith("--") else argv, capsys, tmp_path)
    assert_refused(o, "empty string")


def test_c11_a_forged_run_json_naming_paths_outside_moves_nothing(tmp_path: Path) -> None:
    from attn_export.outdir.claim import claim

    victim = _victim(tmp_path)
    out = tmp_path / "out"
    out.mkdir()
    _forge(out, {"../outside/victim.txt": _sha(victim), str(victim): _sha(victim), ".attn-export-previous/x": "0" * 64})
    before = tree(victim.parent)
    with claim(out) as owner:
        (owner.out / "model.onnx").write_text("new")
    assert tree(victim.parent) == before
    assert set(json.loads((out / "run.json").read_text())["artifacts"]) == {"model.onnx"}


def test_c11_a_listed_file_that_is_not_what_the_run_wrote_is_left_alone(tmp_path: Path) -> None:
    """run.json lists a planted file with a sha256 that does not match it: never moved or deleted."""
    from attn_export.outdir.claim import claim

    out = tmp_path / "out"
    out.mkdir()
    (out / "payload").write_text("someone's file")
    _forge(out, {"payload": "0" * 64})
    before = tree(out / "payload")
    with claim(out) as owner:
        (owner.out / "model.onnx").write_text("new")
    assert tree(out / "payload") == before
    with pytest.raises(RuntimeError), claim(out) as owner:  # a failing run leaves it too
        raise RuntimeError("boom")
    assert tree(out / "payload") == before


def test_c11_a_deployment_folder_inside_out_that_is_a_link_is_refused(tmp_path: Path) -> None:
    from attn_export.errors import ConfigError
    from attn_export.outdir.claim import claim

    folder = tmp_path / "outside" / "repo"
    folder.mkdir(parents=True)
    out = tmp_path / "out"
    out.mkdir()
    (out / "triton").symlink_to(folder)
    with pytest.raises(ConfigError, match="triton is a symbolic link"), claim(out, deployed={"--triton": out / "triton" / "models"}):
        pass
    assert list(folder.iterdir()) == [] and sorted(os.listdir(out)) == ["triton"]


def test_c11_a_link_the_run_does_not_use_is_left_alone(tmp_path: Path) -> None:
    """Not every link is an attack: a user's link to their data is neither followed nor removed."""
    from attn_export.outdir.claim import claim

    victim = _victim(tmp_path)
    out = tmp_path / "out"
    earlier = earlier_run(out)
    (out / "data").symlink_to(victim.parent)
    with claim(out) as owner:
        (owner.out / "model.onnx").write_text("new")
    assert os.readlink(out / "data") == str(victim.parent) and victim.read_text().startswith("precious")
    assert set(earlier) == {"model.onnx", "latency.png", "report.json", "run.json"}
    assert set(files_of(out)) == {"model.onnx", "run.json"}
