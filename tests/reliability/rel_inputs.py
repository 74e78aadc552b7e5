"""Bad inputs, built on disk: calibration files, checkpoints, reports, baselines and ONNX graphs.

Each builder writes into a folder and returns the path to pass on the command line. They are
written independently of the readers they attack (plain json, numpy, onnx.helper, safetensors).
"""

from __future__ import annotations

import json
import pickle
import struct
from pathlib import Path

import numpy as np

# -- calibration files --------------------------------------------------------------------------------


def calib_arrays(d: int = 32, n_calib: int = 8, n_val: int = 4, seq: int = 8, seed: int = 0) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((n_calib + n_val, seq, d)).astype(np.float32)
    kpm = np.ones((n_calib + n_val, seq), np.int32)
    return {"calib_x": x[:n_calib], "calib_key_padding_mask": kpm[:n_calib], "val_x": x[n_calib:], "val_key_padding_mask": kpm[n_calib:]}


def npz(path: Path, **arrays: np.ndarray) -> Path:
    np.savez(path, **arrays)
    return path


def random_bytes(path: Path, n: int = 4096, seed: int = 0) -> Path:
    path.write_bytes(np.random.default_rng(seed).integers(0, 256, n, dtype=np.uint8).tobytes())
    return path


def real_pickle(path: Path) -> Path:
    path.write_bytes(pickle.dumps({"calib_x": [1.0, 2.0]}, protocol=4))
    return path


def forged_npy(path: Path, shape: tuple[int, ...] = (10**6, 10**6, 32)) -> Path:
    """A .npy header declaring a 128 TB array, followed by 64 bytes."""
    header = f"{{'descr': '<f4', 'fortran_order': False, 'shape': {shape}, }}"
    header += " " * (118 - len(header)) + "\n"
    path.write_bytes(b"\x93NUMPY\x01\x00" + struct.pack("<H", len(header)) + header.encode() + b"\0" * 64)
    return path


# -- checkpoints ----------------------------------------------------------------------------------------
TINY_CONFIG = {"model_type": "bert", "vocab_size": 64, "hidden_size": 16, "num_attention_heads": 2, "num_hidden_layers": 2,
               "intermediate_size": 32, "max_position_embeddings": 512, "type_vocab_size": 2, "layer_norm_eps": 1e-12, "hidden_act": "gelu"}  # fmt: skip


def hf_tensors(config: dict | None = None, seed: int = 0) -> dict[str, np.ndarray]:
    """Random weights under Hugging Face BertModel names for ``config`` (not via the loader's mapping)."""
    c = {**TINY_CONFIG, **(config or {})}
    h, i, rng = c["hidden_size"], c["intermediate_size"], np.random.default_rng(seed)

    def w(*shape: int) -> np.ndarray:
        return (0.02 * rng.standard_normal(shape)).astype(np.float32)

    t = {"embeddings.word_embeddings.weight": w(c["vocab_size"], h), "embeddings.position_embeddings.weight": w(c["max_position_embeddings"], h),
         "embeddings.token_type_embeddings.weight": w(c["type_vocab_size"], h),
         "embeddings.LayerNorm.weight": np.ones(h, np.float32), "embeddings.LayerNorm.bias": np.zeros(h, np.float32)}  # fmt: skip
    for n in range(c["num_hidden_layers"]):
        p = f"encoder.layer.{n}."
        for name, (o, k) in {"attention.self.query": (h, h), "attention.self.key": (h, h), "attention.self.value": (h, h),
                             "attention.output.dense": (h, h), "intermediate.dense": (i, h), "output.dense": (h, i)}.items():  # fmt: skip
            t[p + name + ".weight"], t[p + name + ".bias"] = w(o, k), np.zeros(o, np.float32)
        for ln in ("attention.output.LayerNorm", "output.LayerNorm"):
            t[p + ln + ".weight"], t[p + ln + ".bias"] = np.ones(h, np.float32), np.zeros(h, np.float32)
    return t


def checkpoint(folder: Path, config: object = None, weights: bool = True, index: object = None) -> Path:
    """config.json (``config`` overrides TINY_CONFIG; a non-dict is written as is), model.safetensors,
    and optionally a model.safetensors.index.json (then the weights go to ``shard.safetensors``)."""
    from safetensors.numpy import save_file

    folder.mkdir(parents=True, exist_ok=True)
    cfg = {**TINY_CONFIG, **(config or {})} if isinstance(config, dict) or config is None else config
    (folder / "config.json").write_text(json.dumps(cfg) if not isinstance(cfg, str) else cfg, encoding="utf-8")
    if weights:
        tensors = hf_tensors()
        if index is None:
            save_file(tensors, str(folder / "model.safetensors"))
        else:
            save_file(tensors, str(folder / "shard.safetensors"))
            (folder / "model.safetensors.index.json").write_text(json.dumps(index) if not isinstance(index, str) else index, encoding="utf-8")
    return folder


def index_for(shard: str) -> dict:
    return {"metadata": {}, "weight_map": {k: shard for k in hf_tensors()}}


def huge_header_safetensors(path: Path) -> Path:
    """A safetensors file whose header claims to be 2^60 bytes long."""
    path.write_bytes(struct.pack("<Q", 2**60) + b"{}")
    return path


# -- ONNX graphs ----------------------------------------------------------------------------------------


def _save(model: object, path: Path) -> Path:
    import onnx

    onnx.save(model, str(path))  # type: ignore[arg-type]
    return path


def onnx_valid(path: Path) -> Path:
    from onnx import TensorProto, helper

    node = helper.make_node("Relu", ["x"], ["y"])
    g = helper.make_graph([node], "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["B", 4])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["B", 4])])  # fmt: skip
    return _save(helper.make_model(g, opset_imports=[helper.make_opsetid("", 18)], ir_version=9), path)


def onnx_zero_nodes(path: Path) -> Path:
    from onnx import TensorProto, helper

    g = helper.make_graph([], "empty", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 4])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 4])])  # fmt: skip
    return _save(helper.make_model(g, opset_imports=[helper.make_opsetid("", 18)], ir_version=9), path)


def onnx_initializer_without_data(path: Path) -> Path:
    """A 2^20 x 2^20 x 8 float initializer with no data at all."""
    from onnx import TensorProto, helper

    w = TensorProto(name="w", data_type=TensorProto.FLOAT, dims=[2**20, 2**20, 8])
    node = helper.make_node("Add", ["x", "w"], ["y"])
    g = helper.make_graph([node], "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 1, 8])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)], [w])  # fmt: skip
    return _save(helper.make_model(g, opset_imports=[helper.make_opsetid("", 18)], ir_version=9), path)


def onnx_negative_dims(path: Path) -> Path:
    from onnx import TensorProto, helper

    node = helper.make_node("Relu", ["x"], ["y"])
    g = helper.make_graph([node], "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [-5, 4])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, [-5, 4])])  # fmt: skip
    return _save(helper.make_model(g, opset_imports=[helper.make_opsetid("", 18)], ir_version=9), path)


def onnx_reshape_2_80(path: Path) -> Path:
    from onnx import TensorProto, helper

    shape = helper.make_tensor("shape", TensorProto.INT64, [2], [2**40, 2**40])
    node = helper.make_node("Reshape", ["x", "shape"], ["y"])
    g = helper.make_graph([node], "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [4])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)], [shape])  # fmt: skip
    return _save(helper.make_model(g, opset_imports=[helper.make_opsetid("", 18)], ir_version=9), path)


def onnx_external_escape(folder: Path) -> Path:
    """An initializer whose external data points at ../../etc/passwd."""
    import numpy as np
    from onnx import TensorProto, helper, numpy_helper

    folder.mkdir(parents=True, exist_ok=True)
    t = numpy_helper.from_array(np.zeros((4,), np.float32), "w")
    t.ClearField("raw_data")
    t.data_location = TensorProto.EXTERNAL
    for k, v in (("location", "../../etc/passwd"), ("offset", "0"), ("length", "16")):
        e = t.external_data.add()
        e.key, e.value = k, v
    node = helper.make_node("Add", ["x", "w"], ["y"])
    g = helper.make_graph([node], "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [4])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, [4])], [t])  # fmt: skip
    return _save(helper.make_model(g, opset_imports=[helper.make_opsetid("", 18)], ir_version=9), folder / "m.onnx")


def truncated(src: Path, dst: Path, keep: float = 0.5) -> Path:
    data = src.read_bytes()
    dst.write_bytes(data[: int(len(data) * keep)])
    return dst


def make_file(path: Path, text: str = "not a folder\n") -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    return path


def make_dir(path: Path) -> Path:
    path.mkdir(parents=True, exist_ok=True)
    return path


