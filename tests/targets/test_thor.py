"""A new GPU generation is data: Jetson AGX Thor (sm110, sm101 before CUDA 13) and the JetPack 7 stack are table rows.

``--target jetson --gpu-arch sm110 --quantize auto`` plans FP8 (``sm87``: int8 only), the #4590 caveat of
TensorRT 10.13 on Thor reaches the plan's notes, and the Jetson bundle's trtexec line and README follow the
JetPack that ships the chosen TensorRT.
"""

from __future__ import annotations

import json
import shlex
from pathlib import Path

import pytest
from fixtures import eager, feed_for, small_layer

from attn_export.config.run import RunConfig
from attn_export.errors import ConfigError
from attn_export.targets.gpu_arch import (
    ARCHS,
    SOURCES,
    best_8bit,
    default_arch,
    jetson_release,
    parse_gpu_arch,
    supports,
)
from attn_export.targets.trt_releases import JETPACKS, RELEASES, TrtVersion, jetson_archs, release, release_for_target
from attn_export.targets.trt_releases import SOURCES as RELEASE_SOURCES

CALIB = Path(__file__).resolve().parents[2] / "attn_export" / "data" / "calibration" / "synthetic_d512.npz"


def test_jetpack_rows_name_their_tensorrt_gpus_and_sources() -> None:
    rows = {jp.version: (str(jp.trt), jp.archs) for jp in JETPACKS}
    assert rows["7.0"] == ("10.13", ("sm110",)) and rows["7.1"] == ("10.13", ("sm110",))  # Thor only
    assert rows["7.2"] == ("10.16", ("sm87", "sm110")) and rows["7.2.2"] == ("11.4", ("sm87", "sm110"))  # Orin joins at 7.2
    for jp in JETPACKS:
        assert jp.sources and all("http" in RELEASE_SOURCES[s] for s in jp.sources), jp
        assert all(a in ARCHS for a in jp.archs), jp
    assert jetson_archs(TrtVersion(10, 14)) == () and jetson_archs(TrtVersion(10, 13)) == ("sm110",)
    docs = (Path(__file__).resolve().parents[2] / "docs" / "targets.md").read_text()
    for jp in JETPACKS:  # docs/targets.md's Jetson stack table is this data
        assert f"| {jp.version} | {jp.trt}{' and later 11.x' if jp.and_later else ''} | {', '.join(jp.archs)} | {', '.join(jp.sources)} |" in docs, jp


def test_tensorrt_10_16_is_a_release_row_with_a_noted_opset() -> None:
    row = release("10.16")
    assert row.max_opset == 24 and row.opset_source == "parser-10.16" and "10.15" in RELEASE_SOURCES["parser-10.16"]
    assert row.jetpack == "JetPack 7.2" and RELEASES[TrtVersion(10, 13)].jetpack == "JetPack 7.0, 7.1"
    from attn_export.targets.targets import get_target

    jetson = get_target("jetson").trt_releases
    assert str(release_for_target("jetson", jetson, "10.13").version) == "10.13"
    with pytest.raises(ConfigError, match=r"10\.13 \(JetPack 7\.0, 7\.1\).*10\.16 \(JetPack 7\.2\)"):
        release_for_target("jetson", jetson, "10.14")


def test_sm110_row_fp8_yes_and_sm101_is_its_old_name() -> None:
    thor = ARCHS["sm110"]
    assert thor.cc == (11, 0) and thor.precisions["fp8"] == "yes" and thor.precisions["int8"] == "yes"
    assert thor.precisions["bf16"] == "unverified" and thor.precisions["fp4"] == "unverified"  # not guessed into a yes
    assert [parse_gpu_arch(t) for t in ("sm101", "sm_101", "10.1", "sm110", "11.0")] == ["sm110"] * 5
    assert "sm_101 to sm_110" in SOURCES["sm110"] and "http" in SOURCES["trt-4590"]
    assert not supports("sm110", "fp8", "10.3") and not supports("sm110", "int8", "10.14")  # no JetPack ships those for Thor
    assert best_8bit("sm110", "10.16")[0] == "fp8" and best_8bit("sm87", "10.16")[0] == "int8"


def test_the_4590_caveat_rides_on_thor_fp8_with_tensorrt_10_13_only() -> None:
    s = supports("sm110", "fp8", "10.13")
    assert s and "NVIDIA/TensorRT#4590" in s.reason and "FP32 silently" in s.reason and "trt-4590" in s.sources
    assert "#4590" not in supports("sm110", "fp8", "10.16").reason and "#4590" not in supports("sm110", "int8", "10.13").reason


def test_the_default_gpu_and_release_follow_the_jetpack_table() -> None:
    assert default_arch(True, "10.3") == "sm87" and default_arch(True, "10.13") == "sm110"
    assert default_arch(True, "10.16") is None  # Orin and Thor both run JetPack 7.2: unknown until --gpu-arch
    assert jetson_release("sm110", "10.3") == "10.16" and jetson_release("sm87", "10.3") == "10.3" and jetson_release(None, "10.3") == "10.3"


def _plan(**kw: object):  # type: ignore[no-untyped-def]
    from attn_export.pipeline.plan import make_plan

    cfg = RunConfig(d_model=512, heads=8, mask="padding", seed=0, calib=CALIB, render=False, quantize="auto", target="jetson", **kw)  # type: ignore[arg-type]
    return cfg, make_plan(cfg)


def test_jetson_sm110_auto_plans_fp8_and_sm87_int8() -> None:
    cfg, plan = _plan(gpu_arch="sm110")
    assert cfg.resolved_trt_version == "10.16" and cfg.resolved_gpu_arch == "sm110"
    (selection,) = plan.selections
    assert "fp8-static" in selection.candidates and plan.deploy_precision == "8bit", selection
    assert any("--quantize auto on sm110" in n and "fp8" in n for n in plan.notes), plan.notes
    cfg, plan = _plan(gpu_arch="sm87")
    (selection,) = plan.selections
    assert cfg.resolved_trt_version == "10.3" and selection.candidates == ("int8-static",) and plan.deploy_precision == "int8"


def test_jetson_sm101_on_tensorrt_10_13_notes_the_4590_caveat() -> None:
    cfg, plan = _plan(gpu_arch="sm101", trt_version="10.13")
    assert cfg.resolved_gpu_arch == "sm110" and "fp8-static" in plan.selections[0].candidates
    assert any("NVIDIA/TensorRT#4590" in n for n in plan.notes), plan.notes


def test_jetson_sm110_auto_ships_fp8(tmp_path) -> None:  # type: ignore[no-untyped-def]
    """The whole run: FP8 is built from an opset-19 source graph (jetson exports opset 18), judged, and shipped as the format
    Thor prefers; int8 is built beside it as the fall-back that ships only when FP8 misses its tolerance."""
    from attn_export.cli import main

    out = tmp_path / "run"
    code = main(["--target", "jetson", "--gpu-arch", "sm110", "--quantize", "auto", "--calib", str(CALIB), "--repeats", "1", "--warmup", "0",
                 "--threads", "1", "--quiet", "--out", str(out)])  # fmt: skip
    report = json.loads((out / "report.json").read_text())
    assert code == 0 and report["verdict"]["passed"], report["verdict"]
    shipped = report["selection"]["auto"]
    assert (shipped["stage"], shipped["route"], shipped["precision"]) == ("fp8-static", "static", "fp8"), shipped
    assert (out / "model.fp8.onnx").is_file() and not (out / "model.int8.onnx").exists()
    assert {"fp8-static", "int8-static"} <= {t["stage"] for t in shipped["tried"]}
    assert report["selection"]["deploy"]["trt_check"]["passed"], report["selection"]["deploy"]["trt_check"]


@pytest.mark.parametrize(("version", "jetpack"), [("10.13", "JetPack 7.0, 7.1"), ("10.16", "JetPack 7.2"), ("10.3", "JetPack 6.1+")])
def test_bundle_trtexec_line_and_readme_follow_the_jetpack(tmp_path, version: str, jetpack: str) -> None:  # type: ignore[no-untyped-def]
    from trt_fakes import unknown_flags

    from attn_export.deploy.jetson_bundle import write_jetson_bundle
    from attn_export.export import export_onnx
    from attn_export.targets.targets import export_spec_for
    from attn_export.runtime.tensorrt.spec import EngineSpec, ShapeProfile
    from attn_export.validate import tolerance_for

    layer = small_layer("transformer", "padding", d_model=32, heads=2)
    path = tmp_path / "model.onnx"
    export_onnx(layer, path, export_spec_for("jetson", "fp16", trt_version=version))
    feed = feed_for(layer, 2, 16, seed=3, d_model=32)
    spec = EngineSpec(precision="fp16", profiles=ShapeProfile((1, 8), (2, 16), (4, 32)), workspace_bytes=1 << 30,
                      gpu_arch=default_arch(True, version) or "sm110")  # fmt: skip
    bundle = write_jetson_bundle(path, tmp_path / "b", spec, feed, {"y": eager(layer, feed)}, tolerance_for("fp32"), trt_version=version)
    readme = (bundle / "README.md").read_text()
    assert f"# Engine bundle for Jetson (TensorRT {version})" in readme and f"{jetpack} (TensorRT {version}," in readme, readme
    meta = json.loads((bundle / "bundle.json").read_text())
    assert meta["trt_version"] == version and meta["check"]["passed"]
    line = (bundle / "build_engine.sh").read_text().strip().splitlines()[-1]
    argv = shlex.split(line.replace('"$TRTEXEC"', "trtexec"))
    assert argv[1:] == meta["trtexec"][1:] and "--fp16" in argv, line
    recorded = "10.3" if version == "10.3" else "10.14"  # the nearest trtexec option list on record
    assert unknown_flags(argv, recorded) == [], line
