"""MPNet (``model_type: mpnet``): BERT's post-norm layers plus a relative position bias shared by every layer.

transformers' ``models/mpnet/modeling_mpnet.py`` (what all-mpnet-base-v2 is):

- embeddings: word + position (no token types), LayerNorm; positions are RoBERTa's
  ``padding_idx + cumsum(ids != pad)`` with ``padding_idx`` hard-coded to 1 in
  ``MPNetEmbeddings`` (whatever config.json's ``pad_token_id`` says), so 514 rows hold 512 tokens;
- ``encoder.relative_attention_bias`` (buckets x heads): ``MPNetEncoder.compute_position_bias``
  buckets ``j - i`` over ``arange(S)`` bidirectionally (32 buckets, max distance 128, both
  hard-coded in the call) and every layer adds that bias to its scaled scores before the padding
  mask. The general mechanism is ``layers/position_bias.py`` (``EncoderConfig.relative_attention_buckets``);
  a table of another size than the 32 buckets the code computes is refused by name;
- layers: ``attention.attn.{q,k,v,o}``, ``attention.LayerNorm``, then BERT's
  ``intermediate.dense`` / ``output.dense`` / ``output.LayerNorm``.

Task models save the encoder under ``mpnet.``; ``MPNetForSequenceClassification``'s head is
RoBERTa's (``classifier.dense`` -> tanh -> ``classifier.out_proj`` on ``<s>``). The bare
encoder's pooler and ``MPNetForMaskedLM``'s ``lm_head`` are dropped, as ``AutoModel`` drops them.
"""

from __future__ import annotations

import logging

from attn_export.checkpoint.families.base import ConfigKeys, Family, Refusal
from attn_export.checkpoint.families.bert import BERT_LAYER_KEY

__all__ = ["FAMILY"]

log = logging.getLogger(__name__)

_KEYS = ConfigKeys(
    names={
        **{f: f for f in ("vocab_size", "hidden_size", "num_attention_heads", "num_hidden_layers", "intermediate_size",
                          "max_position_embeddings", "layer_norm_eps", "hidden_act")},
        "relative_attention_buckets": "relative_attention_num_buckets",
    },  # fmt: skip
    defaults={"max_position_embeddings": 512, "layer_norm_eps": 1e-12, "hidden_act": "gelu", "relative_attention_buckets": 32},  # MPNetConfig's
    # MPNetEmbeddings hard-codes padding_idx 1 and has no token types; compute_position_bias hard-codes max_distance 128
    fixed={"pad_token_id": 1, "type_vocab_size": 0, "relative_attention_max_distance": 128},
)
_LAYER_PARTS = {
    "attention.attn.q": "self_attn.w_q",
    "attention.attn.k": "self_attn.w_k",
    "attention.attn.v": "self_attn.w_v",
    "attention.attn.o": "self_attn.w_o",
    "attention.LayerNorm": "norm1",
    "intermediate.dense": "ffn_in",
    "output.dense": "ffn_out",
    "output.LayerNorm": "norm2",
}

FAMILY = Family(
    name="mpnet",
    model_types=("mpnet",),
    prefix="mpnet.",
    config_keys=_KEYS,
    refusals=(
        Refusal("relative_attention_num_buckets", 32, "with a relative attention table other than the 32 buckets MPNetEncoder computes"),
        Refusal("is_decoder", False, "as a causal decoder (these layers are a bidirectional encoder)"),
    ),
    positions="padded",
    embedding_parts={
        "embeddings.word_embeddings": "embeddings.word_embeddings",
        "embeddings.position_embeddings": "embeddings.position_embeddings",
        "embeddings.LayerNorm": "embeddings.norm",
    },
    layer_key=BERT_LAYER_KEY,
    layer_parts=_LAYER_PARTS,
    extra_parts={"encoder.relative_attention_bias": "position_bias.relative_attention_bias"},
    sequence_activation="tanh",
    sequence_head={"classifier.dense": "head.dense", "classifier.out_proj": "head.out"},
    dropped=("pooler.", "lm_head."),  # MPNetModel's pooler (unused by last_hidden_state); MPNetForMaskedLM's head
)
