"""FLOPs of one attention layer, counted from its shapes (1 multiply-add = 2 FLOPs).

Only matrix products are counted: the projections, the attention scores Q K^T, the
probability-weighted sum P V, and the FFN. Softmax, LayerNorm, bias and activations are
O(B L D) or O(B H L^2) elementwise work that no GEMM ceiling describes, so efficiency
(FLOP rate / GEMM ceiling) stays an honest "fraction of peak matmul throughput".

Per layer, with B = batch, L = sequence length, D = d_model, F = FFN width:

    Q, K, V projections   3 * 2 B L D D
    scores  Q K^T           2 B L L D      (H heads x Dh = D)
    P V                     2 B L L D
    output projection       2 B L D D
    FFN                     2 * 2 B L D F

A low-rank Linear of rank r costs 2 B L r (in + out) instead of 2 B L in out.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import asdict, dataclass

from torch import nn

from attn_export.errors import ConfigError

__all__ = ["PROJECTIONS", "FlopCount", "attention_flops", "count_flops", "count_module_flops"]

PROJECTIONS: tuple[str, ...] = ("w_q", "w_k", "w_v", "w_o", "ffn_in", "ffn_out")


@dataclass(frozen=True)
class FlopCount:
    """FLOPs per forward pass, split into the parts that scale differently with L."""

    projections: int  # Q, K, V, O
    attention: int  # Q K^T and P V: grows with L^2
    ffn: int

    @property
    def total(self) -> int:
        return self.projections + self.attention + self.ffn

    def to_dict(self) -> dict[str, int]:
        return {**asdict(self), "total": self.total}


def _linear(tokens: int, n_in: int, n_out: int, rank: int | None) -> int:
    return 2 * tokens * (n_in * n_out if rank is None else rank * (n_in + n_out))


def count_flops(
    d_model: int,
    heads: int,
    seq: int,
    batch: int,
    ffn_mult: int = 4,
    d_ffn: int | None = None,
    ranks: Mapping[str, int] | None = None,
    ffn: bool = True,
) -> FlopCount:
    """FLOPs of a TransformerLayer (``ffn=False``: an attention-only layer) from its shapes.

    ``ranks`` maps a projection name in ``PROJECTIONS`` to the rank of its low-rank factors.
    """
    if min(d_model, heads, seq, batch) < 1 or d_model % heads:
        raise ConfigError(f"expected positive shapes with heads dividing d_model, got d_model={d_model}, heads={heads}, seq={seq}, batch={batch}")
    ranks = dict(ranks or {})
    unknown = sorted(set(ranks) - set(PROJECTIONS))
    if unknown:
        raise ConfigError(f"expected ranks keyed by {', '.join(PROJECTIONS)}, got {unknown}")
    t, d = batch * seq, d_model
    f = d_ffn or ffn_mult * d_model
    proj = sum(_linear(t, d, d, ranks.get(n)) for n in ("w_q", "w_k", "w_v", "w_o"))
    attn = 2 * batch * seq * seq * d + 2 * batch * seq * seq * d  # scores + P V, summed over heads
    mlp = _linear(t, d, f, ranks.get("ffn_in")) + _linear(t, f, d, ranks.get("ffn_out")) if ffn else 0
    return FlopCount(projections=proj, attention=attn, ffn=mlp)


def count_module_flops(model: nn.Module, seq: int, batch: int) -> FlopCount:
    """FLOPs of any model built from the reference layers, read off its modules.

    Every ``nn.Linear`` leaf costs 2 * tokens * in * out (so low-rank factors, fused QKV and
    quantized Linears are all counted as they run); each attention block adds its Q K^T and
    P V products. Linears under ``ffn_in``/``ffn_out`` are reported as FFN.
    """
    t = batch * seq
    proj = mlp = attn = 0
    for name, mod in model.named_modules():
        if isinstance(mod, nn.Linear):
            flops = 2 * t * mod.in_features * mod.out_features
            if "ffn_in" in name or "ffn_out" in name:
                mlp += flops
            else:
                proj += flops
        elif hasattr(mod, "attention_form") and hasattr(mod, "heads") and hasattr(mod, "d_model"):
            attn += attention_flops(mod, seq, batch)
    return FlopCount(projections=proj, attention=attn, ffn=mlp)


def attention_flops(block: nn.Module, seq: int, batch: int) -> int:
    """The Q K^T and P V products one attention block runs, for its kind of attention.

    Dense softmax attention: ``2 * 2BL^2D``. Block-sparse: the same within each block of
    ``block_size`` tokens, over the sequence padded to whole blocks (``2 * 2B Lp bs D``).
    Linear (kernelised) attention never forms L x L: ``phi(K)^T V`` and ``phi(Q) (KV)`` are
    ``2 * 2BLD Dh`` (causal: the running ``phi(k) v^T`` outer products and the per-position
    product, the same count). Counting L^2 for these two over-counted their FLOPs, by the
    factor ``L / block_size`` or ``L / Dh``, and with it their efficiency.
    """
    from attn_export.layers.block_sparse import BlockSparseAttention
    from attn_export.layers.linear_attention import LinearAttention

    d = int(block.d_model)
    if isinstance(block, BlockSparseAttention):
        bs = int(block.block_size)
        padded = -(-seq // bs) * bs
        return 4 * batch * padded * bs * d
    if isinstance(block, LinearAttention):
        return 4 * batch * seq * d * (d // int(block.heads))
    return 4 * batch * seq * seq * d
