"""DeBERTa-v2 and v3 (``model_type: deberta-v2``): post-norm layers with disentangled attention.

transformers' ``models/deberta_v2/modeling_deberta_v2.py`` (what deberta-v3-base/large/xsmall,
mDeBERTa-v3 and deberta-v2-xlarge are):

- embeddings (``DebertaV2Embeddings``): word [+ absolute position when ``position_biased_input``;
  v3: false] [+ token type when ``type_vocab_size`` > 0; v3: 0], then ``embed_proj`` (no bias)
  when ``embedding_size`` != ``hidden_size``, then LayerNorm, then times the mask;
- attention (``DisentangledSelfAttention``): ``layers/disentangled.py``: content scores plus the
  content->position / position->content terms (``pos_att_type``) over log-bucketed relative
  positions (``position_buckets``, ``max_relative_positions``), the shared table
  ``encoder.rel_embeddings`` (LayerNorm'd with ``norm_rel_ebd: layer_norm``) projected by each
  layer's own query/key projections (``share_att_key``), all scaled by 1/sqrt(head_dim * scale_factor);
- ``encoder.conv`` (``ConvLayer``, ``conv_kernel_size`` > 0: v2-xlarge) after the first layer:
  ``layers/token_conv.py``;
- ``DebertaV2ForSequenceClassification``: ``ContextPooler`` (``pooler.dense`` -> ``pooler_hidden_act``
  on token 0) -> ``classifier``; ``DebertaV2ForTokenClassification``: ``classifier`` on every token.

Refused by name: unshared position projections (``share_att_key`` false: ``pos_key_proj`` /
``pos_query_proj``, only in the earliest v2 configs: not reproduced), relative terms other
than c2p / p2c (v1's ``p2p``), a pooler width or activation other than the one reproduced, and
an ``attention_head_size`` other than hidden_size / heads.

The transformers padding mask is (B, 1, S, S) with padded *query* rows fully masked (their
softmax is uniform over every key); those rows are padding outputs, which no real token reads
(keys at padding are masked, and the convolution reads the mask-zeroed embeddings), so the
key-padding mask these layers use gives the same values on real tokens.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Mapping
from dataclasses import dataclass, replace
from typing import Any

from attn_export.checkpoint.families.base import CONFIG_FIX, ConfigKeys, Family, Refusal
from attn_export.errors import CheckpointError, ConfigError
from attn_export.layers.encoder_config import CONV_ACTIVATIONS, DISENTANGLED_TERMS, DisentangledConfig, EncoderConfig

__all__ = ["FAMILY", "DebertaV2Family"]

log = logging.getLogger(__name__)

_KEYS = ConfigKeys(
    names={f: f for f in ("vocab_size", "hidden_size", "num_attention_heads", "num_hidden_layers", "intermediate_size",
                          "max_position_embeddings", "layer_norm_eps", "hidden_act", "pad_token_id")},  # fmt: skip
    defaults={"max_position_embeddings": 512, "layer_norm_eps": 1e-7, "hidden_act": "gelu", "pad_token_id": 0},  # DebertaV2Config's
)
# config.json key -> (type, transformers' default: DebertaV2Config's, or the getattr default in the modeling code);
# "hidden_size" as a default means "the config's hidden_size"
_DEBERTA_KEYS: dict[str, tuple[type | tuple[type, ...], Any]] = {
    "type_vocab_size": (int, 0),
    "embedding_size": (int, "hidden_size"),
    "position_biased_input": (bool, True),
    "relative_attention": (bool, False),
    "max_relative_positions": (int, -1),
    "position_buckets": (int, -1),
    "pos_att_type": ((str, list, type(None)), None),
    "norm_rel_ebd": (str, "none"),
    "share_att_key": (bool, False),
    "conv_kernel_size": (int, 0),
    "conv_groups": (int, 1),
    "conv_act": (str, "tanh"),
    "pooler_hidden_size": (int, "hidden_size"),
    "attention_head_size": (int, "head_dim"),
}
_LAYER_PARTS = {
    "attention.self.query_proj": "self_attn.w_q",
    "attention.self.key_proj": "self_attn.w_k",
    "attention.self.value_proj": "self_attn.w_v",
    "attention.output.dense": "self_attn.w_o",
    "attention.output.LayerNorm": "norm1",
    "intermediate.dense": "ffn_in",
    "output.dense": "ffn_out",
    "output.LayerNorm": "norm2",
}


def _value(config: Mapping[str, Any], key: str, hidden: int, head_dim: int, path: str) -> Any:
    kind, default = _DEBERTA_KEYS[key]
    value = config.get(key, {"hidden_size": hidden, "head_dim": head_dim}.get(default, default) if isinstance(default, str) else default)
    if not isinstance(value, kind) or (kind is int and isinstance(value, bool)):
        names = kind.__name__ if isinstance(kind, type) else " or ".join(k.__name__ for k in kind)
        raise CheckpointError(f"{path}: {key}: expected {names}, got {value!r}; {CONFIG_FIX}")
    return value


def _refuse(path: str, key: str, value: Any, why: str) -> CheckpointError:
    return CheckpointError(f"{path}: {key} {value!r} (deberta-v2 {why}) is not supported; fix config.json or use a checkpoint without it")


@dataclass(frozen=True)
class DebertaV2Family(Family):
    """``Family`` plus the DeBERTa-v2 keys no other family has (read and refused in ``read_config``)."""

    @property
    def own_keys(self) -> tuple[str, ...]:
        """The config.json keys read here rather than through ``config_keys`` (``type_vocab_size`` 0 is valid here)."""
        return tuple(_DEBERTA_KEYS)

    def read_config(self, config: Mapping[str, Any], path: str) -> EncoderConfig:
        base = super().read_config(config, path)
        h, head_dim = base.hidden_size, base.head_dim
        v = {key: _value(config, key, h, head_dim, path) for key in _DEBERTA_KEYS}
        raw_terms = v["pos_att_type"]
        terms = [t.strip() for t in raw_terms.lower().split("|")] if isinstance(raw_terms, str) else list(raw_terms or [])
        bad = [t for t in terms if t not in DISENTANGLED_TERMS]
        if bad:
            raise _refuse(path, "pos_att_type", raw_terms, f"with a relative attention term other than {', '.join(DISENTANGLED_TERMS)}")
        if v["relative_attention"] and terms and not v["share_att_key"]:
            raise _refuse(path, "share_att_key", v["share_att_key"], "with separate position projections pos_key_proj/pos_query_proj, "
                          "which only the earliest v2 configs use")  # fmt: skip
        if v["attention_head_size"] != head_dim:
            raise _refuse(path, "attention_head_size", v["attention_head_size"], f"with a head size other than hidden_size / heads = {head_dim}")
        if v["pooler_hidden_size"] != h:
            raise _refuse(path, "pooler_hidden_size", v["pooler_hidden_size"], f"with a pooler width other than hidden_size {h}")
        if v["conv_kernel_size"] and (v["conv_act"] not in CONV_ACTIVATIONS or v["conv_kernel_size"] % 2 == 0 or v["conv_kernel_size"] < 0):
            raise _refuse(path, "conv_kernel_size/conv_act", (v["conv_kernel_size"], v["conv_act"]),
                          f"with a convolution other than an odd kernel and {', '.join(CONV_ACTIVATIONS)}")  # fmt: skip
        max_rel = v["max_relative_positions"] if v["max_relative_positions"] >= 1 else base.max_position_embeddings
        buckets = v["position_buckets"]
        try:
            return replace(
                base,
                type_vocab_size=v["type_vocab_size"],
                positions="absolute" if v["position_biased_input"] else "none",
                embedding_size=v["embedding_size"] if v["embedding_size"] != h else None,
                norm_after_projection=True,
                projection_bias=False,
                disentangled=DisentangledConfig(
                    relative=v["relative_attention"], span=buckets if buckets > 0 else max_rel, buckets=buckets, max_relative_positions=max_rel,
                    pos_att_type=tuple(terms), norm="layer_norm" in [x.strip() for x in v["norm_rel_ebd"].lower().split("|")],
                ),  # fmt: skip
                conv_kernel_size=v["conv_kernel_size"],
                conv_groups=v["conv_groups"],
                conv_act=v["conv_act"],
            )
        except ConfigError as err:  # EncoderConfig's / DisentangledConfig's own checks
            raise CheckpointError(f"{path}: {err}") from err


FAMILY = DebertaV2Family(
    name="deberta-v2",
    model_types=("deberta-v2",),
    prefix="deberta.",
    config_keys=_KEYS,
    refusals=(Refusal("pooler_hidden_act", "gelu", "with a ContextPooler activation other than GELU (erf)"),),
    embedding_parts={
        "embeddings.word_embeddings": "embeddings.word_embeddings",
        "embeddings.position_embeddings": "embeddings.position_embeddings",
        "embeddings.token_type_embeddings": "embeddings.token_type_embeddings",
        "embeddings.embed_proj": "embeddings.project",
        "embeddings.LayerNorm": "embeddings.norm",
    },
    layer_key=re.compile(r"^encoder\.layer\.(\d+)\.(.+)$"),
    layer_parts=_LAYER_PARTS,
    extra_parts={
        "encoder.rel_embeddings": "relative.embeddings",
        "encoder.LayerNorm": "relative.norm",
        "encoder.conv.conv": "conv.conv",
        "encoder.conv.LayerNorm": "conv.norm",
    },
    sequence_activation="gelu",
    sequence_head={"pooler.dense": "head.dense", "classifier": "head.out"},
    dropped=("lm_predictions.", "cls.", "lm_head.", "mask_predictions."),  # DebertaV2ForMaskedLM's heads (legacy and not)
    ignore_unexpected=("position_embeddings",),  # DebertaV2PreTrainedModel's: v3 checkpoints hold a table position_biased_input false leaves unused
)
