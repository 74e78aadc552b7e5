"""A reference layer as the pipeline's subject: seeded weights, activation data, tensor accuracy.

Data roles (``subjects.base``): with calibration data (any compression), every 5th sequence
of the calibration split is held out as ``select`` (distillation early stopping, int8 route
selection) and the rest is ``train``; the file's validation split is ``report`` and is never
used for a decision. Without compression, ``report`` and ``select`` are random inputs drawn
from ``seed + 1`` and ``seed + 3``. Latency is timed on random inputs of the run's shape.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np
from torch import nn

from attn_export.errors import ConfigError
from attn_export.runtime.base import Feed, Runner
from attn_export.subjects.base import BaseSubject, Judgement, ModuleSlot, Split, concat_output, rel_l2

__all__ = ["HOLDOUT_EVERY", "LayerSubject", "random_feeds", "split_feeds"]

log = logging.getLogger(__name__)

HOLDOUT_EVERY = 5  # every 5th calibration sequence decides (early stopping, selection), the rest fits


def random_feeds(mask: str, batch: int, seq: int, d_model: int, seed: int, count: int) -> list[Feed]:
    """Inputs at the run's shapes (not the export example's), padded tails included."""
    rng = np.random.default_rng(seed)
    feeds: list[Feed] = []
    for _ in range(count):
        feed: dict[str, np.ndarray] = {"x": rng.standard_normal((batch, seq, d_model)).astype(np.float32)}
        if mask == "padding":
            lengths = rng.integers(max(1, seq // 2), seq + 1, size=batch)
            feed["key_padding_mask"] = (np.arange(seq)[None, :] < lengths[:, None]).astype(np.int32)
        feeds.append(feed)
    return feeds


def split_feeds(mask: str, x: np.ndarray, key_padding_mask: np.ndarray | None, batch: int) -> list[Feed]:
    """Cut activations (N, L, D) into feeds of ``batch`` sequences."""
    feeds: list[Feed] = []
    for start in range(0, len(x), batch):
        feed: dict[str, np.ndarray] = {"x": np.ascontiguousarray(x[start : start + batch], dtype=np.float32)}
        if mask == "padding":
            kpm = key_padding_mask[start : start + batch] if key_padding_mask is not None else np.ones(feed["x"].shape[:2])
            feed["key_padding_mask"] = np.ascontiguousarray(kpm, dtype=np.int32)
        feeds.append(feed)
    return feeds


class LayerSubject(BaseSubject):
    """``--layer`` (transformer, mha, self-attention, block-sparse, linear) at ``--d-model``/``--heads``."""

    kind = "layer"
    deploy_name = "attn"
    select_error_name = "relative L2 of the output"

    def __init__(self, cfg: Any) -> None:
        from attn_export.layers import MaskedLayer, build_layer

        self.cfg = cfg
        self._layer = MaskedLayer(
            build_layer(cfg.resolved_layer, cfg.resolved_d_model, cfg.resolved_heads, mask=cfg.resolved_mask, seed=cfg.seed),
            cfg.resolved_mask,
        )
        if cfg.attention_impl != "math":
            from attn_export.layers.projections import set_attention_impl_

            set_attention_impl_(self._layer, cfg.attention_impl)
        self.data = None
        if cfg.compresses:
            from attn_export.compress import default_calibration_path, load_calibration

            path = cfg.calib or default_calibration_path(cfg.resolved_d_model)
            self.data = load_calibration(path, cfg.resolved_d_model)
        self._splits = self._make_splits()
        self._refs: dict[str, list[dict[str, np.ndarray]]] = {}

    def _make_splits(self) -> dict[str, Any]:
        from attn_export.compress.calib.data import ActivationSet

        if self.data is None:
            return {}
        calib = self.data.calib
        holdout = np.arange(len(calib)) % HOLDOUT_EVERY == HOLDOUT_EVERY - 1
        if holdout.sum() == 0 or (~holdout).sum() == 0:
            raise ConfigError(f"expected >= {HOLDOUT_EVERY} calibration sequences (every {HOLDOUT_EVERY}th decides early stopping and selection), got {len(calib)}")
        kpm = calib.key_padding_mask
        return {
            "train": ActivationSet(calib.x[~holdout], None if kpm is None else kpm[~holdout]),
            "select": ActivationSet(calib.x[holdout], None if kpm is None else kpm[holdout]),
            "report": self.data.val,
        }

    # -- identity -----------------------------------------------------------------------
    @property
    def name(self) -> str:
        return self.cfg.resolved_layer

    def model_info(self) -> dict[str, Any]:
        c = self.cfg
        info = {"layer": c.resolved_layer, "d_model": c.resolved_d_model, "heads": c.resolved_heads, "params": self.params(), "mask": c.resolved_mask,
                "subject": "layer"}  # fmt: skip
        for attr in ("window", "block_size"):  # what the report's renderer rebuilds the layer with
            for mod in self._layer.modules():
                value = getattr(mod, attr, None)
                if isinstance(value, int):
                    info[attr] = value
                    break
        return info

    def report_attention(self, report: Mapping[str, Any], report_dir: Path) -> Any:
        """The renderer rebuilds the reference layer from report.json (``validate.attention_report``)."""
        return "auto"

    def inputs_info(self) -> dict[str, Any]:
        c = self.cfg
        info: dict[str, Any] = {"batch": c.batch, "seq_len": c.seq_len, "seed": c.seed}
        if self.data is not None:
            s = self._splits
            info["accuracy_data"] = f"validation split of {self.data.source} ({len(s['report'])} sequences, never used for a decision)"
            info["selection_data"] = f"every {HOLDOUT_EVERY}th calibration sequence ({len(s['select'])}): early stopping and route selection"
            info["training_data"] = f"the other calibration sequences ({len(s['train'])}): int8 ranges, low-rank, distillation"
        else:
            info["accuracy_data"] = "random normal"
        info["latency_data"] = f"random normal [{c.batch}, {c.seq_len}, {c.resolved_d_model}]"
        return info

    # -- the eager reference ------------------------------------------------------------
    @property
    def module(self) -> nn.Module:
        return self._layer

    @property
    def input_names(self) -> list[str]:
        return list(self._layer.input_names)

    @property
    def output_names(self) -> list[str]:
        return ["y"]

    # -- data ---------------------------------------------------------------------------
    def feeds(self, split: Split) -> list[Feed]:
        c = self.cfg
        mask = c.resolved_mask
        if self.data is None:
            if split == "train":
                raise ConfigError("this run has no calibration data; add --low-rank or --quantize int8 (they load it)")
            seed = c.seed + (1 if split == "report" else 3)
            return random_feeds(mask, c.batch, c.seq_len, c.resolved_d_model, seed, c.validation_batches if split == "report" else 1)
        acts = self._splits[split]
        return split_feeds(mask, acts.x, acts.key_padding_mask, c.batch)

    def latency_feed(self) -> Feed:
        c = self.cfg
        return random_feeds(c.resolved_mask, c.batch, c.seq_len, c.resolved_d_model, c.seed + 2, 1)[0]

    def calibration(self) -> Any:
        if self.data is None:
            raise ConfigError("this run has no calibration data; add --quantize int8 (it loads the shipped set or --calib)")
        return self._splits["train"]

    def describe_data(self) -> str:
        return self.data.describe() if self.data is not None else "random inputs"

    # -- building -----------------------------------------------------------------------
    def export(self, module: nn.Module, path: Path, spec: Any) -> Any:
        from attn_export.export import export_onnx

        return export_onnx(module, path, spec)  # type: ignore[arg-type]

    def module_slots(self, student: nn.Module) -> list[ModuleSlot]:
        """The whole layer: a seeded reference layer has no pretrained weights to keep, so a training transform trains all of it."""
        return [ModuleSlot(student, self._layer, self._activations)]

    def _activations(self, split: Split) -> Any:
        if self.data is None:
            raise ConfigError("this run has no calibration data; add --low-rank or --quantize int8 (they load it)")
        return self._splits[split]

    def training_defaults(self) -> dict[str, Any]:
        return {"seed": self.cfg.seed, "progress": False}

    # -- judging ------------------------------------------------------------------------
    def _references(self, split: Split) -> list[dict[str, np.ndarray]]:
        if split not in self._refs:
            eager = self.eager_runner()
            self._refs[split] = [eager.infer(f) for f in self.feeds(split)]
        return self._refs[split]

    def select_error(self, candidate: Runner, limit: int) -> float:
        feeds, refs, n, seen = self.feeds("select"), self._references("select"), 0, 0
        while n < len(feeds) and seen < limit:
            seen += len(feeds[n]["x"])
            n += 1
        outs = [candidate.infer(f) for f in feeds[:n]]
        return rel_l2(concat_output(refs[:n], "y"), concat_output(outs, "y"))

    def tensor_tolerance(self, tolerance_key: str) -> Any:
        from attn_export.validate.tolerances import tolerance_for, with_overrides

        return with_overrides(tolerance_for(tolerance_key), "y", self.cfg.tolerance_overrides)

    def judge(self, candidate: Runner, split: Split, tolerance_key: str, batch: int | None = None) -> Judgement:
        """``batch`` is the encoder's (texts per judged batch); a layer's sequences come in the batches its data has."""
        from attn_export.validate.compare import compare_outputs
        from attn_export.validate.error_histogram import error_histogram
        from attn_export.validate.metrics import accuracy

        feeds, refs = self.feeds(split), self._references(split)
        outs = [candidate.infer(f) for f in feeds]
        ref_all, out_all = concat_output(refs, "y"), concat_output(outs, "y")
        tol = self.tensor_tolerance(tolerance_key)
        verdict = compare_outputs({"y": ref_all}, {"y": out_all}, tol)
        acc = accuracy(ref_all, out_all)
        return Judgement(accuracy=acc, passed=bool(verdict), tolerance=tol.to_dict(), score=float(acc.cosine), violations=tol.violations(acc),
                         details={"error_histogram": error_histogram(ref_all, out_all), "worst": str(verdict)})  # fmt: skip
