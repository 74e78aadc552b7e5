"""Triton repository: configs parse with tritonclient's protos and agree with the ONNX model."""

from __future__ import annotations

import onnx
import pytest
from fixtures import small_layer
from google.protobuf import text_format  # protobuf comes with onnx

from attn_export.deploy.triton_repo import TRITON_DTYPES, write_triton_repo
from attn_export.errors import ConfigError
from attn_export.export import ExportSpec, export_onnx
from attn_export.runtime.tensorrt.spec import ShapeProfile

mc = pytest.importorskip("tritonclient.grpc.model_config_pb2", reason="tritonclient is not installed (pip install 'tritonclient[grpc]')")
PROFILE = ShapeProfile((1, 8), (4, 16), (16, 64))


def _parse(path) -> object:  # type: ignore[no-untyped-def]
    return text_format.Parse(path.read_text(), mc.ModelConfig())


@pytest.fixture(scope="module")
def models(tmp_path_factory: pytest.TempPathFactory) -> dict[str, str]:
    layer = small_layer("transformer", "padding", d_model=32, heads=2)
    out = {}
    for name, spec in (("dynamic", ExportSpec()), ("static", ExportSpec(dynamic_batch=False, example_batch=2))):
        path = tmp_path_factory.mktemp(name) / "model.onnx"
        export_onnx(layer, path, spec)
        out[name] = str(path)
    return out


def _cross_check(cfg, onnx_path: str, batched: bool) -> None:  # type: ignore[no-untyped-def]
    graph = onnx.load(onnx_path).graph
    for tensors, entries in ((graph.input, cfg.input), (graph.output, cfg.output)):
        assert [t.name for t in tensors] == [e.name for e in entries]
        for t, e in zip(tensors, entries):
            assert mc.DataType.Name(e.data_type) == TRITON_DTYPES[t.type.tensor_type.elem_type]
            dims = [d.dim_value if d.HasField("dim_value") else -1 for d in t.type.tensor_type.shape.dim]
            assert list(e.dims) == (dims[1:] if batched else dims)


def test_onnx_and_plan_configs(models, tmp_path) -> None:  # type: ignore[no-untyped-def]
    engine = tmp_path / "model.engine"
    engine.write_bytes(b"plan")
    repo = write_triton_repo(tmp_path / "repo", "attn", models["dynamic"], engine, profiles=PROFILE)
    onnx_cfg, plan_cfg = _parse(repo / "attn" / "config.pbtxt"), _parse(repo / "attn_trt" / "config.pbtxt")
    assert (repo / "attn" / "1" / "model.onnx").read_bytes() == open(models["dynamic"], "rb").read()
    assert (repo / "attn_trt" / "1" / "model.plan").read_bytes() == b"plan"
    assert (onnx_cfg.name, onnx_cfg.platform, plan_cfg.platform) == ("attn", "onnxruntime_onnx", "tensorrt_plan")
    for cfg in (onnx_cfg, plan_cfg):
        _cross_check(cfg, models["dynamic"], batched=True)
        assert cfg.max_batch_size == PROFILE.max[0] and cfg.HasField("dynamic_batching")
    x = next(e for e in plan_cfg.input if e.name == "x")
    assert list(x.dims) == [-1, 32] and mc.DataType.Name(x.data_type) == "TYPE_FP32"
    mask = next(e for e in plan_cfg.input if e.name == "key_padding_mask")
    assert list(mask.dims) == [-1] and mc.DataType.Name(mask.data_type) == "TYPE_INT32"


def test_static_batch_means_no_batching(models, tmp_path) -> None:  # type: ignore[no-untyped-def]
    with pytest.raises(ConfigError, match="batch dim is static"):
        write_triton_repo(tmp_path / "r", "attn", models["static"])
    repo = write_triton_repo(tmp_path / "r", "attn", models["static"], dynamic_batching=False)
    cfg = _parse(repo / "attn" / "config.pbtxt")
    assert cfg.max_batch_size == 0 and not cfg.HasField("dynamic_batching")
    _cross_check(cfg, models["static"], batched=False)


def test_batch_must_fit_the_profile(models, tmp_path) -> None:  # type: ignore[no-untyped-def]
    engine = tmp_path / "m.engine"
    engine.write_bytes(b"plan")
    with pytest.raises(ConfigError, match="exceeds the engine profile's max batch 16"):
        write_triton_repo(tmp_path / "r", "attn", models["dynamic"], engine, max_batch_size=64, profiles=PROFILE)
    with pytest.raises(ConfigError, match="min batch is 2"):
        write_triton_repo(tmp_path / "r", "attn", models["dynamic"], engine, profiles=ShapeProfile((2, 8), (4, 16), (8, 16)))
    with pytest.raises(ConfigError, match="plain model name"):
        write_triton_repo(tmp_path / "r", "../x", models["dynamic"])


def test_version_compatible_plan_needs_the_server_flag(models, tmp_path) -> None:  # type: ignore[no-untyped-def]
    """Triton's TensorRT backend loads a version-compatible plan only with --backend-config=tensorrt,version-compatible=true."""
    from attn_export.deploy.triton_repo import VERSION_COMPATIBLE_FLAG
    from attn_export.outdir.manifest import sha256_file
    from attn_export.runtime.tensorrt.sidecar import EngineSidecar, write_sidecar

    engine = tmp_path / "model.engine"
    engine.write_bytes(b"plan")

    def sidecar(vc: bool) -> None:
        write_sidecar(engine, EngineSidecar(
            tensorrt_version="10.14.1.48.post1", gpu_name="NVIDIA H200", compute_capability="9.0", precision="fp16",
            strongly_typed=True, builder_flags=["VERSION_COMPATIBLE"] if vc else [], profiles={}, onnx_sha256=sha256_file(models["dynamic"]),
            engine_sha256=sha256_file(engine), engine_size_bytes=4, version_compatible=vc))

    sidecar(True)
    repo = write_triton_repo(tmp_path / "vc", "attn", models["dynamic"], engine, profiles=PROFILE)
    readme = (repo / "README.md").read_text()
    assert VERSION_COMPATIBLE_FLAG == "--backend-config=tensorrt,version-compatible=true"
    assert f"tritonserver --model-repository={repo} {VERSION_COMPATIBLE_FLAG}" in readme and "version-compatible" in readme
    _parse(repo / "attn_trt" / "config.pbtxt")  # the config itself stays a valid ModelConfig
    sidecar(False)
    repo = write_triton_repo(tmp_path / "plain", "attn", models["dynamic"], engine, profiles=PROFILE)
    assert VERSION_COMPATIBLE_FLAG not in (repo / "README.md").read_text()
    repo = write_triton_repo(tmp_path / "explicit", "attn", models["dynamic"], engine, profiles=PROFILE, version_compatible=True)
    assert VERSION_COMPATIBLE_FLAG in (repo / "README.md").read_text()
