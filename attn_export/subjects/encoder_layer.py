"""Layer N of a pretrained checkpoint as the subject, judged in context (``--checkpoint DIR --layers N``).

The subject module is ``MaskedLayer(layer N)``, with the reference layers' signature
``(x, key_padding_mask) -> y``; its data are the hidden states that layer really sees on the
corpus texts. An artifact of the layer is still judged by what it does to the sentence
embeddings: the eager encoder runs with layer N replaced by the artifact
(``checkpoint.evaluate.SplicedEncoder``), and the layer's own output error is reported beside.
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

import numpy as np
from torch import nn

from attn_export.runtime.base import Feed, Runner
from attn_export.subjects.base import Judgement, ModuleSlot, Split, rel_l2
from attn_export.subjects.encoder import FEED_BATCH, EncoderSubject

__all__ = ["EncoderLayerSubject"]

log = logging.getLogger(__name__)


class EncoderLayerSubject(EncoderSubject):
    """``--checkpoint DIR|minilm --layers N``: layer N on its real inputs, judged spliced into the encoder."""

    kind = "encoder-layer"
    deploy_name = "encoder_layer"

    def __init__(self, cfg: Any) -> None:
        from attn_export.layers.encoder import parse_layers

        super().__init__(cfg)
        self.index: int = parse_layers(cfg.resolved_layers, len(self.encoder.layers))  # type: ignore[assignment]
        self._layer = self.encoder.subject(self.index)
        self._layer_acts: dict[str, Any] = {}
        self._quick_refs: dict[str, np.ndarray] = {}

    @property
    def name(self) -> str:
        return f"layer{self.index}"

    @property
    def select_error_name(self) -> str:
        return "relative L2 of the layer output"

    @property
    def module(self) -> nn.Module:
        return self._layer

    @property
    def input_names(self) -> list[str]:
        return ["x", "key_padding_mask"]

    @property
    def output_names(self) -> list[str]:
        return ["y"]

    # -- data ---------------------------------------------------------------------------
    def _acts(self, split: str) -> Any:
        from attn_export.checkpoint.text import all_layer_inputs

        if split not in self._layer_acts:
            self._layer_acts[split] = all_layer_inputs(self.encoder, self.tokens[split], layers=[self.index])[self.index]
        return self._layer_acts[split]

    def feeds(self, split: Split) -> list[Feed]:
        if split not in self._feeds:
            acts = self._acts(split)
            self._feeds[split] = [{"x": acts.x[i : i + FEED_BATCH], "key_padding_mask": acts.key_padding_mask[i : i + FEED_BATCH]}
                                  for i in range(0, len(acts), FEED_BATCH)]  # fmt: skip
        return self._feeds[split]

    def map_inputs(self) -> Any:
        """Layer N's heads: the exported layer takes the hidden states that enter it (the eager encoder's, fidelity-checked)."""
        from attn_export.checkpoint.attention_maps import MapInputs
        from attn_export.checkpoint.text import TokenBatch, all_layer_inputs

        whole = super().map_inputs()
        t = whole.tokens
        acts = all_layer_inputs(self.encoder, TokenBatch(t["input_ids"], t["attention_mask"], [], t.get("token_type_ids")), layers=[self.index])[self.index]
        feed = {"x": acts.x, "key_padding_mask": acts.key_padding_mask}
        return MapInputs(t, feed, layer=self.index, softmax_index=0, softmax_count=1, text=whole.text)

    def latency_feed(self) -> Feed:
        from attn_export.checkpoint.text import all_layer_inputs

        acts = all_layer_inputs(self.encoder, self._latency_tokens, layers=[self.index])[self.index]
        return {"x": acts.x, "key_padding_mask": acts.key_padding_mask}

    def calibration(self) -> Any:
        return self._acts("train")

    # -- building -----------------------------------------------------------------------
    def export(self, module: nn.Module, path: Path, spec: Any) -> Any:
        from attn_export.checkpoint.export import encoder_export_spec
        from attn_export.export import export_onnx

        return export_onnx(module, path, encoder_export_spec(spec))  # type: ignore[arg-type]

    def module_slots(self, student: nn.Module) -> list[ModuleSlot]:
        """Layer N as one slot, on the hidden states it really sees; its pretrained weights stay."""
        return [ModuleSlot(student, self._layer, self._acts, frozen=True)]

    def end_to_end(self, student: nn.Module, settings: Any) -> Any:
        """None: the one slot is the whole subject (the encoder's end-to-end stage trains the whole encoder)."""
        return None

    # -- judging ------------------------------------------------------------------------
    def tensor_tolerance(self, tolerance_key: str) -> Any:
        """The layer output's bar (the bundle compares ``y``): the tensor tolerance of the key."""
        from attn_export.validate.tolerances import tolerance_for, with_overrides

        return with_overrides(tolerance_for(tolerance_key), "y", self.cfg.tolerance_overrides)

    def encoder_runner(self, candidate: Runner) -> Runner:
        """The eager encoder with layer N replaced by ``candidate``: the layer artifact in context."""
        from attn_export.checkpoint.evaluate import RunnerLayer, SplicedEncoder
        from attn_export.runtime import EagerRunner

        spliced = SplicedEncoder(self.encoder, self.index, RunnerLayer(candidate)).eval()
        return EagerRunner(spliced, list(spliced.input_names), list(self.encoder.output_names))

    def select_error(self, candidate: Runner, limit: int) -> float:
        """The layer output's relative L2 on the real inputs of the first ``limit`` select texts (its own error, without the splice)."""
        take, seen = [], 0
        for f in self.feeds("select"):
            if seen >= limit:
                break
            take.append(f)
            seen += len(f["x"])
        key = f"select:{len(take)}"
        if key not in self._quick_refs:
            eager = self.eager_runner()
            self._quick_refs[key] = np.concatenate([eager.infer(f)["y"].ravel() for f in take])
        got = np.concatenate([np.asarray(candidate.infer(f)["y"], dtype=np.float32).ravel() for f in take])
        return rel_l2(self._quick_refs[key], got)

    def judge(self, candidate: Runner, split: Split, tolerance_key: str, batch: int | None = None) -> Judgement:
        from attn_export.validate.metrics import accuracy

        judgement = super().judge(candidate, split, tolerance_key, batch)
        eager, feeds = self.eager_runner(), self.feeds(split)  # the layer's own output on its real inputs, beside
        ref_y = np.concatenate([eager.infer(f)["y"].ravel() for f in feeds])
        got_y = np.concatenate([np.asarray(candidate.infer(f)["y"], dtype=np.float32).ravel() for f in feeds])
        judgement.details["layer_accuracy"] = accuracy(ref_y, got_y).__dict__
        return judgement
