"""The shape of an encoder as data: sizes, activation, positions, pooling and task head (light: no torch).

``EncoderConfig``, ``PoolingConfig`` and ``HeadConfig`` are what a checkpoint's config.json
and sentence-transformers files say about the model, validated on construction. They live
apart from the modules that build it (``layers.encoder``, ``layers.pooling``,
``layers.heads``, which import them from here) because flag validation reads a checkpoint's
config.json before torch is imported: a bad ``--layers`` or ``--seq-len`` is refused in well
under a second.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field

from attn_export.errors import ConfigError
from attn_export.vocab.choices import POOLING_MODES

__all__ = [
    "ACTIVATIONS",
    "CONV_ACTIVATIONS",
    "DISENTANGLED_TERMS",
    "HEAD_ACTIVATIONS",
    "HEAD_POOLINGS",
    "JUDGED_OUTPUT",
    "LAYER_KINDS",
    "POSITION_STYLES",
    "TASKS",
    "DisentangledConfig",
    "EncoderConfig",
    "HeadConfig",
    "PoolingConfig",
    "parse_layers",
]

log = logging.getLogger(__name__)

# Hugging Face ``hidden_act`` names (transformers' ACT2CLS) this model reproduces exactly:
# "gelu" is the exact erf form; "gelu_new" and "gelu_pytorch_tanh" are the tanh approximation,
# exported as such (one ONNX Gelu with approximate="tanh" from opset 20); "swish" is SiLU.
ACTIVATIONS: tuple[str, ...] = ("gelu", "gelu_new", "gelu_pytorch_tanh", "relu", "silu", "swish")
# "none": no absolute position table; positions enter through relative attention only (DeBERTa-v3's position_biased_input false);
# "rotary": no position table; q and k are rotated by their positions in every layer (layers.rotary: ModernBERT)
POSITION_STYLES: tuple[str, ...] = ("absolute", "padded", "none", "rotary")
# "post-norm": BERT's LN(x + Attn(x)), LN(h + FFN(h)) (layers.transformer); "pre-norm-glu": x + Attn(LN(x)),
# h + GeGLU(LN(h)), a final LayerNorm after the last layer (layers.prenorm: ModernBERT)
LAYER_KINDS: tuple[str, ...] = ("post-norm", "pre-norm-glu")
# The activation between a sequence head's dense layer and its output (layers.heads builds each); a family
# (``checkpoint/families/<name>.py``) says which its ``...ForSequenceClassification`` uses. Token heads are linear.
HEAD_ACTIVATIONS: tuple[str, ...] = ("tanh", "gelu", "relu")
# DeBERTa-v2's ConvLayer ``conv_act`` values reproduced (layers.token_conv)
CONV_ACTIVATIONS: tuple[str, ...] = ("tanh", "gelu", "relu")
TASKS: tuple[str, ...] = ("sequence", "token")
# What a sequence head reads: "cls" the first slot (hidden[:, 0], as every ...ForSequenceClassification), "mean" the
# mean over real tokens (ModernBERT's classifier_pooling "mean")
HEAD_POOLINGS: tuple[str, ...] = ("cls", "mean")
# What a model's users read, so the one output a checkpoint is judged on (None: no head). A bare encoder's users
# read its sentence embedding (cosine, nearest neighbours); a head's read its logits (label agreement and logit
# cosine, per real token for a token head), never the mean-pooled embedding its body also exports.
JUDGED_OUTPUT: dict[str | None, str] = {None: "sentence_embedding", "sequence": "logits", "token": "logits"}


@dataclass(frozen=True)
class PoolingConfig:
    """Which pooling the model ships, whether it L2-normalises, and where that was read from.

    ``source`` is what the report names: ``"1_Pooling/config.json"``, ``"--pooling"`` or
    ``"default mean"`` (a plain Hugging Face folder ships no pooling).
    """

    modes: tuple[str, ...] = ("mean",)
    normalize: bool = True
    source: str = "default mean"

    def __post_init__(self) -> None:
        if not self.modes:
            raise ConfigError(f"expected at least one pooling mode of {', '.join(POOLING_MODES)}, got none")
        bad = [m for m in self.modes if m not in POOLING_MODES]
        if bad:
            raise ConfigError(f"expected pooling modes in {', '.join(POOLING_MODES)}, got {bad[0]!r}")

    @property
    def name(self) -> str:
        """``"mean+normalize"``, ``"cls"``, ``"cls+mean+normalize"``: what the report prints."""
        return "+".join(self.modes) + ("+normalize" if self.normalize else "")

    def to_dict(self) -> dict[str, object]:
        return {"modes": list(self.modes), "normalize": self.normalize, "source": self.source, "name": self.name}


@dataclass(frozen=True)
class HeadConfig:
    """``task``: ``"sequence"`` (logits (B, L)) or ``"token"`` (logits (B, S, L)); ``style``: whose head (the
    family's name, ``"linear"`` for a token head), for the report; ``activation``: a sequence head's, in
    ``HEAD_ACTIVATIONS`` (None for a token head, which is one Linear).

    ``norm``: a LayerNorm after the activation, and on a token head dense -> activation -> norm before
    the output Linear too (ModernBERT's ``ModernBertPredictionHead``); ``pooling``: what a sequence head
    reads (``HEAD_POOLINGS``); ``dense_bias``: whether the dense layer has a bias."""

    task: str
    style: str
    num_labels: int
    activation: str | None = None
    pooling: str = "cls"
    norm: bool = False
    dense_bias: bool = True

    def __post_init__(self) -> None:
        if self.task not in TASKS:
            raise ConfigError(f"expected a head task in {', '.join(TASKS)}, got {self.task!r}")
        if not isinstance(self.style, str) or not self.style:
            raise ConfigError(f"expected a head style (whose head it is), got {self.style!r}")
        if self.task == "token" and self.activation is not None and not self.norm:
            raise ConfigError(f"expected no activation for a token head (one Linear), got {self.activation!r}")
        if (self.task == "sequence" or self.norm) and self.activation not in HEAD_ACTIVATIONS:
            raise ConfigError(f"expected a sequence head activation in {', '.join(HEAD_ACTIVATIONS)}, got {self.activation!r}")
        if self.pooling not in HEAD_POOLINGS:
            raise ConfigError(f"expected a head pooling in {', '.join(HEAD_POOLINGS)}, got {self.pooling!r}")
        if not isinstance(self.num_labels, int) or self.num_labels < 1:
            raise ConfigError(f"expected num_labels >= 1, got {self.num_labels!r}")

    def to_dict(self) -> dict[str, object]:
        out: dict[str, object] = {"task": self.task, "style": self.style, "num_labels": self.num_labels, "activation": self.activation}
        if self.norm or self.pooling != "cls" or not self.dense_bias:  # only where a family's head has them (ModernBERT)
            out.update(pooling=self.pooling, norm=self.norm, dense_bias=self.dense_bias)
        return out


# DeBERTa-v2's relative attention terms (``pos_att_type``): content->position and position->content (layers.disentangled)
DISENTANGLED_TERMS: tuple[str, ...] = ("c2p", "p2c")


@dataclass(frozen=True)
class DisentangledConfig:
    """DeBERTa-v2's disentangled attention as data (``layers.disentangled``; transformers'
    ``models/deberta_v2/modeling_deberta_v2.py``).

    ``relative``: the encoder has relative position embeddings (``relative_attention``), 2 * ``span``
    rows; ``span`` is ``position_buckets`` when > 0, else ``max_relative_positions``; ``buckets`` > 0
    log-buckets distances beyond ``buckets // 2`` up to ``max_relative_positions``; ``pos_att_type``
    the terms, which also set the content score's scale 1/sqrt(head_dim * (1 + len(pos_att_type)))
    even without relative embeddings (``DisentangledSelfAttention.forward``); ``norm``: the relative
    embeddings go through a LayerNorm (``norm_rel_ebd: layer_norm``).
    """

    relative: bool = True
    span: int = 256
    buckets: int = 256
    max_relative_positions: int = 512
    pos_att_type: tuple[str, ...] = DISENTANGLED_TERMS
    norm: bool = True

    def __post_init__(self) -> None:
        bad = [t for t in self.pos_att_type if t not in DISENTANGLED_TERMS]
        if bad:
            raise ConfigError(f"expected pos_att_type terms in {', '.join(DISENTANGLED_TERMS)}, got {bad[0]!r}")
        if not isinstance(self.span, int) or self.span < 1:
            raise ConfigError(f"expected a relative attention span >= 1 (position_buckets or max_relative_positions), got {self.span!r}")
        if self.buckets > 0 and not self.max_relative_positions - 1 > self.buckets // 2:
            raise ConfigError(
                f"expected max_relative_positions - 1 > position_buckets // 2 for log buckets, got {self.max_relative_positions} and {self.buckets}; fix config.json"
            )

    @property
    def terms(self) -> tuple[str, ...]:
        """The score terms computed: none without relative embeddings (whatever ``pos_att_type`` says)."""
        return tuple(t for t in DISENTANGLED_TERMS if t in self.pos_att_type) if self.relative else ()

    @property
    def scale_factor(self) -> int:
        """transformers' ``scale_factor``: 1 + one per ``pos_att_type`` term, counted even without relative embeddings."""
        return 1 + sum(t in self.pos_att_type for t in DISENTANGLED_TERMS)


@dataclass(frozen=True)
class EncoderConfig:
    """The shape of a BERT-family encoder (the fields of a Hugging Face ``config.json``, per family).

    ``type_vocab_size`` 0 means no token-type embedding (DistilBERT); ``embedding_size`` set means
    embedding tables that wide and a Linear projecting them to ``hidden_size`` (ELECTRA, ALBERT),
    None means tables ``hidden_size`` wide and no projection; ``shared_layers`` means one layer's
    weights run at every depth (ALBERT); ``relative_attention_buckets`` > 0 means a relative position
    bias added to every layer's scores (MPNet); ``family`` is the checkpoint's ``model_type``.

    Pre-norm rotary encoders (ModernBERT) set ``layer_kind`` ``"pre-norm-glu"`` and ``positions``
    ``"rotary"``: ``rope_theta`` is the rotary base of global layers, ``local_rope_theta`` that of
    the ``local_layers``, which attend within ``|i - j| <= local_attention // 2`` (transformers'
    ``sliding_window``); ``attention_bias`` / ``mlp_bias`` / ``norm_bias`` say which Linears and
    LayerNorms have a bias (all do in the post-norm families).
    """

    vocab_size: int = 30522
    hidden_size: int = 384
    num_attention_heads: int = 12
    num_hidden_layers: int = 6
    intermediate_size: int = 1536
    max_position_embeddings: int = 512
    type_vocab_size: int = 2
    layer_norm_eps: float = 1e-12
    hidden_act: str = "gelu"
    pad_token_id: int = 0
    family: str = "bert"
    positions: str = "absolute"
    embedding_size: int | None = None
    shared_layers: bool = False
    relative_attention_buckets: int = 0  # 0: no relative position bias; MPNet: 32 (layers.position_bias)
    relative_attention_max_distance: int = 128
    # DeBERTa-v2: disentangled attention (layers.disentangled), embeddings projected then normed (embed_proj has no
    # bias), and a token convolution after the first layer (layers.token_conv; 0 = none)
    disentangled: DisentangledConfig | None = None
    norm_after_projection: bool = False
    projection_bias: bool = True
    conv_kernel_size: int = 0
    conv_groups: int = 1
    conv_act: str = "tanh"
    pooling: PoolingConfig = field(default_factory=PoolingConfig)
    head: HeadConfig | None = None
    # pre-norm rotary encoders (ModernBERT: layers.prenorm, layers.rotary); the defaults are the post-norm families'
    layer_kind: str = "post-norm"  # LAYER_KINDS
    rope_theta: float = 0.0  # > 0 with positions "rotary": the rotary base of global layers
    local_rope_theta: float = 0.0  # the rotary base of local layers
    local_attention: int = 0  # the local layers' total window: they attend within |i - j| <= local_attention // 2
    local_layers: tuple[int, ...] = ()  # which layers are local (windowed); the others are global
    attention_bias: bool = True
    mlp_bias: bool = True
    norm_bias: bool = True

    def __post_init__(self) -> None:
        sizes = {
            "vocab_size": self.vocab_size,
            "hidden_size": self.hidden_size,
            "num_attention_heads": self.num_attention_heads,
            "num_hidden_layers": self.num_hidden_layers,
            "intermediate_size": self.intermediate_size,
            "max_position_embeddings": self.max_position_embeddings,
            "embedding_size": self.embedding_size if self.embedding_size is not None else 1,
        }
        for name, value in sizes.items():
            if not isinstance(value, int) or value < 1:
                raise ConfigError(f"expected {name} to be a positive integer, got {value!r}")
        if not isinstance(self.relative_attention_buckets, int) or self.relative_attention_buckets < 0 or self.relative_attention_buckets % 4:
            raise ConfigError(f"expected relative_attention_buckets a multiple of 4 (0 = none), got {self.relative_attention_buckets!r}")
        if self.relative_attention_buckets and self.relative_attention_max_distance <= self.relative_attention_buckets // 4:
            raise ConfigError(f"expected relative_attention_max_distance > {self.relative_attention_buckets // 4}, got {self.relative_attention_max_distance!r}")
        if not isinstance(self.type_vocab_size, int) or self.type_vocab_size < 0:
            raise ConfigError(f"expected type_vocab_size to be a non-negative integer (0 = no token types), got {self.type_vocab_size!r}")
        if self.hidden_size % self.num_attention_heads:
            raise ConfigError(
                f"expected hidden_size divisible by num_attention_heads, got {self.hidden_size} and {self.num_attention_heads}; fix the encoder config"
            )
        if self.hidden_act not in ACTIVATIONS:
            raise ConfigError(f"expected hidden_act in {', '.join(ACTIVATIONS)}, got {self.hidden_act!r}")
        if not 0.0 < self.layer_norm_eps < 1.0:
            raise ConfigError(f"expected 0 < layer_norm_eps < 1, got {self.layer_norm_eps}")
        if self.positions not in POSITION_STYLES:
            raise ConfigError(f"expected positions in {', '.join(POSITION_STYLES)}, got {self.positions!r}")
        if self.conv_kernel_size and (self.conv_kernel_size < 0 or self.conv_kernel_size % 2 == 0 or self.hidden_size % self.conv_groups or self.conv_act not in CONV_ACTIVATIONS):
            raise ConfigError(
                f"expected an odd conv_kernel_size (0 = none), conv_groups dividing hidden_size and conv_act in {', '.join(CONV_ACTIVATIONS)}, "
                f"got {self.conv_kernel_size}, {self.conv_groups}, {self.conv_act!r}"
            )
        self._check_rotary_layers()
        if self.max_tokens < 1:
            raise ConfigError(
                f"expected max_position_embeddings > pad_token_id + 1 for {self.positions} positions, got {self.max_position_embeddings} and pad {self.pad_token_id}"
            )

    def _check_rotary_layers(self) -> None:
        if self.layer_kind not in LAYER_KINDS:
            raise ConfigError(f"expected layer_kind in {', '.join(LAYER_KINDS)}, got {self.layer_kind!r}")
        if (self.positions == "rotary") != (self.rope_theta > 0):
            raise ConfigError(f"expected rope_theta > 0 exactly with rotary positions, got positions {self.positions!r} and rope_theta {self.rope_theta!r}")
        if self.local_layers and not (self.local_rope_theta > 0 or self.positions != "rotary"):
            raise ConfigError(f"expected local_rope_theta > 0 for local layers with rotary positions, got {self.local_rope_theta!r}")
        if self.local_layers and self.local_attention < 2:
            raise ConfigError(f"expected local_attention >= 2 (a window of |i - j| <= local_attention // 2) with local layers, got {self.local_attention!r}")
        bad = [i for i in self.local_layers if not 0 <= i < self.num_hidden_layers]
        if bad:
            raise ConfigError(f"expected local layer indices in 0..{self.num_hidden_layers - 1}, got {bad[0]}")

    def window_of(self, index: int) -> int | None:
        """Layer ``index``'s local window w (it attends within |i - j| <= w), or None for a global layer."""
        return self.local_attention // 2 if index in self.local_layers else None

    @property
    def score_bias(self) -> bool:
        """Every layer adds a bias to its attention scores (MPNet's relative positions, DeBERTa's disentangled terms): no long-seq form."""
        return self.relative_attention_buckets > 0 or bool(self.disentangled and self.disentangled.terms)

    @property
    def head_dim(self) -> int:
        return self.hidden_size // self.num_attention_heads

    @property
    def embedding_dim(self) -> int:
        """Width of the embedding tables (ELECTRA-small, ALBERT: 128, projected to ``hidden_size``)."""
        return self.embedding_size or self.hidden_size

    @property
    def max_tokens(self) -> int:
        """The longest input the position table covers: RoBERTa-style positions start at pad + 1 (514 -> 512)."""
        offset = self.pad_token_id + 1 if self.positions == "padded" else 0
        return self.max_position_embeddings - offset


def parse_layers(layers: str | int | None, num_layers: int) -> int | None:
    """``"all"``/None -> None (the whole encoder); ``"N"``/N -> N, checked against the depth."""
    if layers is None or (isinstance(layers, str) and layers.strip().lower() == "all"):
        return None
    try:
        index = int(layers)
    except (TypeError, ValueError):
        raise ConfigError(f"expected --layers all or a layer index 0..{num_layers - 1}, got {layers!r}") from None
    if not 0 <= index < num_layers:
        raise ConfigError(f"expected --layers all or a layer index 0..{num_layers - 1}, got {index}")
    return index
