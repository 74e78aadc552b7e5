"""Every ``--calib`` file is checked before torch is imported (issue 33): its encoding, line count, size and format.

A bad file was refused only after torch had loaded (12-13 s on a busy machine) because the checks ran where
the file is read. The subject kinds' preflight runs the same rules first (``subjects.text_data.read_text_file``
for a checkpoint's texts, ``compress.calib.files.check_arrays_file`` for a layer's activations). One subprocess
runs every case and reports, after each, whether torch was imported: the import is checked, not the clock.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from rel_helpers import REPO

_DRIVER = r"""
import contextlib, io, json, sys
from attn_export.cli import main
for argv in json.loads(sys.argv[1]):
    err = io.StringIO()
    with contextlib.redirect_stderr(err), contextlib.redirect_stdout(io.StringIO()):
        code = main(argv)
    print(json.dumps({"code": code, "err": err.getvalue(), "torch": "torch" in sys.modules}), flush=True)
"""


def test_bad_calib_files_are_refused_before_torch_is_imported(tmp_path: Path) -> None:
    from attn_export.checkpoint.corpus import MIN_USER_TEXTS
    from attn_export.compress.calib.files import DEFAULT_MAX_BYTES

    (tmp_path / "latin1.txt").write_bytes("caf\xe9 au lait\n".encode("latin-1") + b"".join(b"text %d\n" % i for i in range(12)))
    (tmp_path / "one.txt").write_text("only one text\n", encoding="utf-8")
    (tmp_path / "not-a-zip.npz").write_bytes(b"garbage, not an archive\n")
    with open(tmp_path / "huge.npz", "wb") as f:  # sparse: no disk used
        f.truncate(DEFAULT_MAX_BYTES + 1)
    ckpt, layer = ["--checkpoint", "minilm", "--quantize", "int8"], ["--d-model", "32", "--heads", "4", "--quantize", "int8"]
    cases = {
        "latin1.txt": ([*ckpt, "--calib", "latin1.txt"], "is not UTF-8 text"),
        "one.txt": ([*ckpt, "--calib", "one.txt"], f"pass at least {MIN_USER_TEXTS} distinct texts"),
        "not-a-zip.npz": ([*layer, "--calib", "not-a-zip.npz"], "is not a .npz archive"),
        "huge.npz": ([*layer, "--calib", "huge.npz"], "exceeds the"),
    }
    argvs = [[*args[:-1], str(tmp_path / args[-1]), "--out", str(tmp_path / f"out-{i}")] for i, (args, _) in enumerate(cases.values())]
    proc = subprocess.run([sys.executable, "-c", _DRIVER, json.dumps(argvs)], capture_output=True, text=True, timeout=120, cwd=REPO)
    results = [json.loads(line) for line in proc.stdout.splitlines() if line.startswith("{")]
    assert len(results) == len(cases), proc.stdout + proc.stderr[-2000:]
    for (name, (_, expect)), res in zip(cases.items(), results):
        lines = [line for line in res["err"].splitlines() if line.strip()]
        assert res["code"] == 2 and len(lines) == 1 and lines[0].startswith("attn-export: error:"), (name, res)
        assert expect in lines[0], (name, lines[0])
        assert not res["torch"], f"--calib {name} was refused only after torch was imported: {lines[0]}"
    assert not any((tmp_path / f"out-{i}").exists() for i in range(len(cases)))
