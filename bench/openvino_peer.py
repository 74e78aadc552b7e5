"""The OpenVINO peers: a checkpoint's encoder in OpenVINO fp32, and in int8 by NNCF post-training quantization.

What a user following OpenVINO's own BERT tutorial ("Quantize NLP models with Post-Training
Quantization in NNCF", openvino_notebooks ``language-quantize-bert``) does, applied to a sentence
encoder:

1. ``ov.convert_model`` of the transformers ``AutoModel`` of the checkpoint folder (the encoder
   sentence-transformers wraps; ``last_hidden_state`` out, pooled and normalised by the caller as
   sentence-transformers does), with an ``example_input`` and the inputs declared int64 with a
   dynamic batch and sequence (the tutorial fixes batch 1; a service batches);
2. ``nncf.quantize(model, nncf.Dataset(items), model_type=nncf.ModelType.TRANSFORMER,
   subset_size=len(items))``: static int8 (weights and activations), the default preset, ranges
   from the calibration items; the transformer model type is what the tutorial sets for BERT
   (it keeps the operations NNCF knows lose accuracy in transformers, e.g. the softmax inputs and
   LayerNorm, in float, and runs SmoothQuant on the MatMuls). ``subset_size`` is the number of
   items, so every calibration text is used (the default, 300, would drop some);
3. compiled for ``CPU`` with ``PERFORMANCE_HINT=LATENCY`` (one stream: the setting for a request at a
   time, which is what the side-by-side timing issues) and ``INFERENCE_NUM_THREADS=--threads``;
   nothing else is set (the inference precision is OpenVINO's default for this CPU, read back and
   recorded: bf16 where the CPU has it natively, else f32).

Calibration items: the texts ``attn-export --checkpoint`` calibrates on (the corpus' train role, as
the pipeline's subject tokenizes them: ``subject.data.tokens["train"]``), one text per item, unpadded, as
the tutorial's dataset yields one sentence pair per item. Never the test split.

Why not optimum-intel's ``OVQuantizer`` or sentence-transformers' ``export_static_quantized_openvino_model``
(which calls it): both are NNCF underneath with the same ``nncf.quantize``, but pin transformers versions
and calibrate on a Hub dataset by default (glue/sst2), which this machine cannot reach; the direct NNCF
call is the documented base API, and it takes our calibration texts as they are.

Needs ``openvino`` and ``nncf``: run the bench from a virtual environment that has them beside the project's
packages (``python -m venv --system-site-packages V && V/bin/pip install openvino nncf``; they add no
torch, onnxruntime or transformers of their own). The IR files are built once into ``cache``.
"""

from __future__ import annotations

import collections
import hashlib
import inspect
import json
from pathlib import Path
from typing import Any

import numpy as np

__all__ = ["OpenVinoRunner", "build_openvino", "kernel_summary"]

OV_FP32, OV_INT8 = "OpenVINO fp32", "OpenVINO + NNCF int8 (ModelType.TRANSFORMER)"


def calibration_items(train: Any) -> list[dict[str, np.ndarray]]:
    """One feed per calibration text, unpadded (``train``: a ``TokenBatch``, padded to one length)."""
    items = []
    for i in range(len(train)):
        n = int(train.attention_mask[i].sum())
        item = {"input_ids": train.input_ids[i : i + 1, :n], "attention_mask": train.attention_mask[i : i + 1, :n]}
        item["token_type_ids"] = np.zeros_like(item["input_ids"])
        items.append(item)
    return items


def _convert(folder: Path) -> tuple[Any, list[str]]:
    """``ov.convert_model`` of transformers' ``AutoModel`` with dynamic (batch, sequence) int64 inputs."""
    import openvino as ov
    import torch
    import transformers

    model = transformers.AutoModel.from_pretrained(str(folder), local_files_only=True).eval()
    names = [
        n for n in ("input_ids", "attention_mask", "token_type_ids") if n in inspect.signature(model.forward).parameters
    ]
    example = {n: torch.ones(1, 16, dtype=torch.int64) for n in names}
    with torch.no_grad():
        converted = ov.convert_model(
            model, example_input=example, input=[(n, ov.PartialShape([-1, -1]), ov.Type.i64) for n in names]
        )
    return converted, names


def build_openvino(folder: Path, train: Any, cache: Path, say: Any) -> tuple[Path, Path, dict[str, Any]]:
    """fp32 and NNCF int8 IR of ``folder``'s encoder, built once into ``cache`` per (model, calibration, versions)."""
    import nncf
    import openvino as ov

    items = calibration_items(train)
    calib_hash = hashlib.sha256(b"".join(i["input_ids"].tobytes() for i in items)).hexdigest()[:12]
    facts = {"model": str(folder), "size": (folder / "model.safetensors").stat().st_size, "calib": calib_hash,
             "versions": [ov.__version__, nncf.__version__]}  # fmt: skip
    key = hashlib.sha256(json.dumps(facts).encode()).hexdigest()[:12]
    root = cache / f"openvino-{key}"
    fp32, int8 = root / "fp32.xml", root / "nncf_int8.xml"
    call = f"nncf.quantize(model, nncf.Dataset(items), model_type=nncf.ModelType.TRANSFORMER, subset_size={len(items)})"
    record = {"openvino": ov.__version__, "nncf": nncf.__version__, "cache": str(root), "calibration_texts": len(items),
              "calibration_sha256_12": calib_hash, "call": call}  # fmt: skip
    if fp32.is_file() and int8.is_file():
        return fp32, int8, record
    root.mkdir(parents=True, exist_ok=True)
    say(f"building OpenVINO fp32 IR (ov.convert_model of transformers AutoModel) into {root}")
    model, names = _convert(folder)
    ov.save_model(model, str(root / "partial_fp32.xml"))
    say(f"building OpenVINO + NNCF int8: nncf.quantize(ModelType.TRANSFORMER) on {len(items)} calibration texts")
    data = nncf.Dataset([{n: item[n] for n in names} for item in items])
    quantized = nncf.quantize(model, data, model_type=nncf.ModelType.TRANSFORMER, subset_size=len(items))
    ov.save_model(quantized, str(root / "partial_int8.xml"))
    for tmp, final in ((root / "partial_fp32.xml", fp32), (root / "partial_int8.xml", int8)):
        tmp.with_suffix(".bin").rename(final.with_suffix(".bin"))
        tmp.rename(final)
    return fp32, int8, record


class OpenVinoRunner:
    """An OpenVINO IR compiled for CPU with the latency hint and ``threads`` inference threads (the runner contract:
    activate / infer / deactivate, ``input_names``); ``last_hidden_state`` out, as output 0 of the encoder. ``f32``:
    also ``INFERENCE_PRECISION_HINT=f32``, to tell the accuracy OpenVINO's default bf16 costs from what int8 costs."""

    def __init__(self, path: Path, threads: int, name: str, f32: bool = False) -> None:
        self.path, self.threads, self.name, self.f32 = path, threads, name, f32
        self.compiled: Any = None
        self.request: Any = None

    def activate(self) -> None:
        if self.compiled is None:
            import openvino as ov

            config: dict[str, Any] = {"PERFORMANCE_HINT": "LATENCY", "INFERENCE_NUM_THREADS": self.threads}
            if self.f32:  # the operations NNCF left in float run f32, not this CPU's default (bf16 where native)
                config["INFERENCE_PRECISION_HINT"] = "f32"
            self.compiled = ov.Core().compile_model(str(self.path), "CPU", config)
            self.request = self.compiled.create_infer_request()

    def deactivate(self) -> None:
        self.compiled = self.request = None

    @property
    def input_names(self) -> list[str]:
        self.activate()
        return [i.get_any_name() for i in self.compiled.inputs]

    def infer(self, feed: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        self.activate()
        self.request.infer({n: np.ascontiguousarray(feed[n], dtype=np.int64) for n in self.input_names})
        return {"last_hidden_state": self.request.get_output_tensor(0).data.copy()}

    def properties(self) -> dict[str, str]:
        """What the compiled model runs with, read back from OpenVINO."""
        self.activate()
        keys = (
            "PERFORMANCE_HINT",
            "INFERENCE_NUM_THREADS",
            "NUM_STREAMS",
            "INFERENCE_PRECISION_HINT",
            "ENABLE_CPU_PINNING",
            "EXECUTION_MODE_HINT",
        )
        out = {}
        for k in keys:
            try:
                out[k] = str(self.compiled.get_property(k))
            except RuntimeError as err:  # a key this OpenVINO version does not report
                out[k] = f"unreported ({str(err).splitlines()[0][:60]})"
        return out


def kernel_summary(runner: OpenVinoRunner) -> dict[str, int]:
    """The CPU plugin's kernels (``primitiveType``, e.g. ``brgemm_avx512_I8``, ``brgemm_avx512_amx``) and runtime
    precisions of the executed graph's GEMM nodes (FullyConnected, MatMul, and the attention ``Subgraph`` that
    OpenVINO's snippets fuse), counted: the instruction set OpenVINO's int8 runs on, read after a call (dynamic
    shapes pick their kernels then)."""
    runner.activate()
    counts: collections.Counter[str] = collections.Counter()
    for op in runner.compiled.get_runtime_model().get_ordered_ops():
        rt = op.get_rt_info()
        layer = str(rt["layerType"].astype(str)) if "layerType" in rt else op.get_type_name()
        if layer in ("FullyConnected", "MatMul", "Subgraph", "ScaledAttn", "MHA"):
            prim = str(rt["primitiveType"].astype(str)) if "primitiveType" in rt else "?"
            prec = str(rt["runtimePrecision"].astype(str)) if "runtimePrecision" in rt else "?"
            counts[f"{layer} {prim} {prec}"] += 1
    return dict(counts)
