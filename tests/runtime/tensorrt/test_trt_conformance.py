"""The manifests of the real TensorRT bindings, the strict doubles built from them, and the
version strings those bindings report.
"""

from __future__ import annotations

import pytest
from trt_fakes import FakeTensorRT, load_manifest, major_minor, manifest_versions

from attn_export.runtime.tensorrt.sidecar import EngineSidecar, check_compatible
from attn_export.runtime.tensorrt.spec import TrtVersion, parse_trt_version

VERSIONS = manifest_versions()
# Other __version__ strings of tensorrt-cu12-bindings wheels on PyPI (pip index versions).
PYPI_VERSION_STRINGS = {"10.13.3.9.post1": (10, 13), "10.7.0.post1": (10, 7), "10.6.0.post2": (10, 6), "10.2.0.post1": (10, 2)}


def test_manifests_cover_the_supported_versions() -> None:
    mm = {major_minor(v) for v in VERSIONS}
    assert len(VERSIONS) >= 6 and {(10, 3), (10, 8), (10, 9), (10, 14), (11, 0)} <= mm and max(mm) >= (11, 4), VERSIONS
    assert any(v.endswith(".post1") and major_minor(v) == (10, 14) for v in VERSIONS)
    for v in VERSIONS:
        m = load_manifest(v)
        assert m["__version__"] == v and m["generated_by"] == "tools/trt_manifest.py" and len(m["wheel"]["sha256"]) == 64
        assert {"Builder", "IBuilderConfig", "Runtime", "ICudaEngine", "IExecutionContext", "OnnxParser"} <= set(m["classes"])
        assert "IBuilderConfig.set_timing_cache" in m["signatures"] and m["nptype"]["FLOAT"] == "float32"


@pytest.mark.parametrize("version", VERSIONS)
def test_parse_the_real_version_strings(version: str) -> None:
    """What ``tensorrt.__version__`` says on a pip install, .post1 included (10.14's only wheel)."""
    assert parse_trt_version(load_manifest(version)["__version__"]) == TrtVersion(*major_minor(version))


@pytest.mark.parametrize(("text", "mm"), sorted(PYPI_VERSION_STRINGS.items()) + [("11.0.0rc1", (11, 0)), ("10.3.0+cuda12.5", (10, 3))])
def test_parse_suffixed_version_strings(text: str, mm: tuple[int, int]) -> None:
    assert parse_trt_version(text) == TrtVersion(*mm)


def test_version_compatible_engine_across_post_releases() -> None:
    sidecar = EngineSidecar(tensorrt_version="10.13.3.9.post1", gpu_name="H200", compute_capability="9.0", precision="fp16",
                            strongly_typed=True, builder_flags=["VERSION_COMPATIBLE"], profiles={}, onnx_sha256="a" * 64,
                            engine_sha256="b" * 64, engine_size_bytes=1, version_compatible=True)
    assert check_compatible(sidecar, "10.14.1.48.post1", "H200", "9.0") == []
    assert check_compatible(sidecar, "10.7.0.post1", "H200", "9.0") == ["TensorRT 10.7.0.post1 is older than the version-compatible engine's 10.13.3.9.post1"]


# --- the strict doubles are strict --------------------------------------------------------


@pytest.fixture(params=[VERSIONS[0], VERSIONS[-1]])
def trt(request: pytest.FixtureRequest) -> FakeTensorRT:
    return FakeTensorRT(request.param)


def test_unknown_names_raise_attribute_error(trt: FakeTensorRT) -> None:
    with pytest.raises(AttributeError, match="has no attribute 'Bulder'"):
        trt.Bulder  # noqa: B018
    with pytest.raises(AttributeError):
        trt.ProfilingVerbosity.DETAILD  # noqa: B018
    with pytest.raises(AttributeError, match="type object 'Logger' has no attribute 'WARN'"):
        trt.Logger.WARN  # noqa: B018
    config = trt.Builder(trt.Logger(trt.Logger.WARNING)).create_builder_config()
    with pytest.raises(AttributeError, match="'IBuilderConfig' object has no attribute 'builder_optimisation_level'"):
        config.builder_optimisation_level = 3
    with pytest.raises(AttributeError, match="has no attribute 'set_timing_cach'"):
        config.set_timing_cach  # noqa: B018
    runtime = trt.Runtime(trt.Logger())
    with pytest.raises(AttributeError, match="property 'num_DLA_cores' of 'Runtime' object has no setter"):
        runtime.num_DLA_cores = 2


def test_calls_are_checked_against_the_recorded_signatures(trt: FakeTensorRT) -> None:
    config = trt.Builder(trt.Logger()).create_builder_config()
    with pytest.raises(TypeError, match="unexpected keyword 'ignore_mismatches'"):
        config.set_timing_cache(config.create_timing_cache(b""), ignore_mismatches=True)
    with pytest.raises(TypeError, match="missing argument 'ignore_mismatch'"):
        config.set_timing_cache(config.create_timing_cache(b""))
    with pytest.raises(TypeError, match="'pool' must be MemoryPoolType"):
        config.set_memory_pool_limit("workspace", 1 << 20)
    with pytest.raises(TypeError, match="incompatible function arguments"):
        trt.Builder()


def test_real_enum_values_and_removed_members() -> None:
    for v in VERSIONS:
        t = FakeTensorRT(v)
        strongly = int(t.NetworkDefinitionCreationFlag.STRONGLY_TYPED)
        assert strongly == (0 if major_minor(v) >= (11, 0) else 1), v
        assert hasattr(t.BuilderFlag, "FP16") is (major_minor(v) < (11, 0)), v
        assert hasattr(t.HardwareCompatibilityLevel, "SAME_COMPUTE_CAPABILITY") is (major_minor(v) >= (10, 9)), v
        for dt in ("BF16", "FP8", "INT4"):
            with pytest.raises(TypeError, match="Could not resolve TensorRT datatype"):
                t.nptype(getattr(t.DataType, dt))
