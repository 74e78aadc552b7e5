"""outdir/manifest.py: run.json written and read back through one schema, its one-line refusals, and the one sha256."""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path

import pytest

from attn_export.errors import ConfigError, DataError
from attn_export.outdir.manifest import MANIFEST_FORMAT, manifest_bytes, manifest_record, parse_manifest, sha256_file, sha256_regular


def test_a_record_round_trips_through_the_schema():
    record = manifest_record("complete", command=["attn-export"], seed=3, started="t0", config={"seq_len": 8},
                             artifacts={"model.onnx": {"sha256": "0" * 64, "size_bytes": 4}})  # fmt: skip
    data = parse_manifest(manifest_bytes(record), "run.json", "fix")
    assert data["format"] == MANIFEST_FORMAT and data["pid"] == os.getpid() and data["versions"]["attn_export"]
    assert list(data)[-1] == "config" and data["artifacts"]["model.onnx"]["size_bytes"] == 4


@pytest.mark.parametrize(
    "manifest,expect",
    [({"format": "x/1", "status": "complete"}, "format: expected 'attn-export-run/1', got \"x/1\""),
     ({"format": MANIFEST_FORMAT}, "status: expected a value, got nothing (the key is missing)"),
     ({"format": MANIFEST_FORMAT, "status": "complete", "artifacts": {"m.onnx": {"sha256": "x", "size_bytes": 1}}},
      "artifacts.m.onnx.sha256: expected a string matching"),
     ([], "expected a JSON object, got a list")],
)  # fmt: skip
def test_a_file_that_is_not_a_manifest_is_one_line_of_the_callers_error(manifest, expect):
    with pytest.raises(DataError) as err:
        parse_manifest(json.dumps(manifest).encode(), "out/run.json", "move it away", error=DataError)
    text = str(err.value)
    assert text.startswith("out/run.json: ") and expect in text and text.endswith("; move it away") and "\n" not in text


def test_oversized_and_undecodable_manifests_are_refused():
    with pytest.raises(ConfigError, match="undecodable"):
        parse_manifest(b"\xff\xfe", "run.json", "fix")
    with pytest.raises(ConfigError, match="over 64 MiB"):
        parse_manifest(b" " * ((64 << 20) + 1), "run.json", "fix")


def test_one_sha256_for_every_reader(tmp_path: Path):
    f = tmp_path / "model.onnx"
    f.write_bytes(b"bytes" * 1000)
    want = hashlib.sha256(f.read_bytes()).hexdigest()
    assert sha256_file(f) == want and sha256_regular(f) == (want, None)
    link = tmp_path / "link.onnx"
    link.symlink_to(f)
    assert sha256_file(link) == want  # a path the user named: followed
    assert sha256_regular(link) == (None, "a symbolic link")  # a file beside a report: never followed
    fifo = tmp_path / "fifo.onnx"
    os.mkfifo(fifo)
    digest, what = sha256_regular(fifo)  # opened O_NONBLOCK: never blocks
    assert digest is None and what and "FIFO" in what.upper()
    assert sha256_regular(tmp_path / "gone.onnx") == (None, "missing")
