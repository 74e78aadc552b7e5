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


def _engine_with_profiles(tmp_path, profiles: list[dict]):  # type: ignore[no-untyped-def]
    """A plan file and the sidecar attn-export writes beside it, recording ``profiles`` (input -> (min, opt, max))."""
    from attn_export.runtime.tensorrt.sidecar import EngineSidecar, write_sidecar

    engine = tmp_path / "m.engine"
    engine.write_bytes(b"plan")
    recorded = [{n: {"min": list(lo), "opt": list(opt), "max": list(hi)} for n, (lo, opt, hi) in p.items()} for p in profiles]
    write_sidecar(engine, EngineSidecar(
        tensorrt_version="10.3.0", gpu_name="Orin", compute_capability="8.7", precision="fp16", strongly_typed=False, builder_flags=["FP16"],
        profiles=recorded[0], optimization_profiles=recorded if len(recorded) > 1 else [], onnx_sha256="0" * 64, engine_sha256="0" * 64,
        engine_size_bytes=4))  # fmt: skip
    return engine


def _bucket(lo: int, hi: int, batch: int) -> dict:
    return {"x": ((1, lo, 32), (4, hi, 32), (batch, hi, 32)), "key_padding_mask": ((1, lo), (4, hi), (batch, hi))}


def test_plan_config_from_the_engines_profiles_round_trips(models, tmp_path) -> None:  # type: ignore[no-untyped-def]
    """Three length buckets, the last one built for smaller batches: max_batch_size is what every profile holds."""
    engine = _engine_with_profiles(tmp_path, [_bucket(1, 32, 16), _bucket(33, 64, 16), _bucket(65, 128, 8)])
    repo = write_triton_repo(tmp_path / "repo", "attn", models["dynamic"], engine)
    text = (repo / "attn_trt" / "config.pbtxt").read_text()
    cfg = _parse(repo / "attn_trt" / "config.pbtxt")
    assert text_format.MessageToString(cfg) == text  # tritonclient's parser reads back exactly what was written
    assert cfg.max_batch_size == 8 and list(cfg.instance_group[0].profile) == ["0", "1", "2"]
    assert {e.name: list(e.dims) for e in cfg.input} == {"x": [-1, 32], "key_padding_mask": [-1]}
    with pytest.raises(ConfigError, match=r"max_batch_size 16 exceeds the engine's 8 \(the largest batch its optimization profiles hold\)"):
        write_triton_repo(tmp_path / "repo2", "attn", models["dynamic"], engine, max_batch_size=16)


def test_one_profile_with_a_static_seq_fixes_that_dim(models, tmp_path) -> None:  # type: ignore[no-untyped-def]
    engine = _engine_with_profiles(tmp_path, [{"x": ((1, 64, 32), (4, 64, 32), (4, 64, 32)), "key_padding_mask": ((1, 64), (4, 64), (4, 64))}])
    cfg = _parse(write_triton_repo(tmp_path / "repo", "attn", models["dynamic"], engine) / "attn_trt" / "config.pbtxt")
    assert cfg.max_batch_size == 4 and list(cfg.instance_group[0].profile) == []
    assert {e.name: list(e.dims) for e in cfg.input} == {"x": [64, 32], "key_padding_mask": [64]}


def test_hand_config_checked_against_the_engine(models, tmp_path) -> None:  # type: ignore[no-untyped-def]
    engine = _engine_with_profiles(tmp_path, [_bucket(1, 32, 16), _bucket(33, 64, 16)])
    hand = tmp_path / "hand.pbtxt"
    body = 'input [{ name: "x" data_type: TYPE_FP32 dims: [-1, 32] }]\ninstance_group [{ kind: KIND_GPU count: 2 }]\n'
    hand.write_text(f"max_batch_size: 32\n{body}")
    with pytest.raises(ConfigError, match=r"^--triton-config: max_batch_size 32 exceeds the engine's 16 .*--max-shape$") as err:
        write_triton_repo(tmp_path / "repo", "attn", models["dynamic"], engine, hand_config=hand)
    assert "\n" not in str(err.value) and not (tmp_path / "repo").exists()  # refused before anything is written
    hand.write_text(f"max_batch_size: 8\n{body.replace('[-1, 32]', '[-1, 16]')}")
    with pytest.raises(ConfigError, match=r"input 'x' dims \[-1, 16\] differ from the engine's \[-1, 32\]"):
        write_triton_repo(tmp_path / "repo", "attn", models["dynamic"], engine, hand_config=hand)
    hand.write_text(f"max_batch_size: 8\n{body}")
    cfg = _parse(write_triton_repo(tmp_path / "repo", "attn", models["dynamic"], engine, hand_config=hand) / "attn_trt" / "config.pbtxt")
    assert (cfg.name, cfg.platform, cfg.max_batch_size, cfg.instance_group[0].count) == ("attn_trt", "tensorrt_plan", 8, 2)
    hand.write_text("max_batch_size: [")
    with pytest.raises(ConfigError, match="is not a Triton model config"):
        write_triton_repo(tmp_path / "repo", "attn", models["dynamic"], engine, hand_config=hand)
