"""Low-rank factorization of projection and FFN Linears: ``low_rank_(model, LowRankConfig())``.

A Linear W (m x n) becomes ``up @ down`` with r*(m+n) parameters instead of m*n. Plain
truncated SVD keeps W's largest singular values, which is optimal for isotropic inputs;
hidden states are far from isotropic, so the default ``method="activation"`` (SVD-LLM /
ASVD) minimises the error on the calibration activations X instead. With the second
moment X^T X / N + damping = C C^T (Cholesky), ||(W - W') X^T|| = ||(W - W') C||: truncate
the SVD of W C, then un-whiten the ``down`` factor with C^{-1}.
"""

from __future__ import annotations

import logging
from dataclasses import asdict, dataclass, field
from typing import Any

import torch
from torch import nn

from attn_export.compress.layer_forward import device_of, eval_mode, forward_layer
from attn_export.errors import ConfigError
from attn_export.layers.projections import AttentionProjections
from attn_export.layers.transformer import TransformerLayer
from attn_export.vocab.choices import LOW_RANK_METHODS  # the one list of methods --low-rank-method's choices

__all__ = [
    "LOW_RANK_TARGETS",
    "LayerwiseLowRankSummary",
    "LowRankConfig",
    "LowRankLinear",
    "LowRankSummary",
    "factorization_is_profitable",
    "linear_flops",
    "low_rank_",
]

log = logging.getLogger(__name__)

LOW_RANK_TARGETS: dict[str, tuple[str, ...]] = {
    "q": ("w_q",), "k": ("w_k",), "v": ("w_v",), "o": ("w_o",), "ffn": ("ffn_in", "ffn_out"),
}  # fmt: skip
_Site = tuple[nn.Module, str, str]  # (parent module, attribute name, target)


def factorization_is_profitable(m: int, n: int, r: int) -> bool:
    """True when rank-r factors of an m x n weight have fewer parameters and FLOPs than it.

    Fewer FLOPs is not always less time: two thin GEMMs can run slower than one square
    one, so the pipeline still times the exported model against the dense one.
    """
    return r * (m + n) < m * n


def linear_flops(m: int, n: int, r: int | None = None) -> int:
    """FLOPs per token of an m x n Linear (2mn), or of its rank-r factors (2r(m+n))."""
    return 2 * m * n if r is None else 2 * r * (m + n)


@dataclass(frozen=True)
class LowRankConfig:
    """Which Linears to factorize and how to pick each rank.

    The first criterion set wins: ``rank`` (an int, or a dict keyed by module name such as
    ``"layer.self_attn.w_q"``, by attribute ``"w_q"`` or by target ``"q"``), ``energy``
    (fraction of the (whitened) squared singular values kept), ``param_budget`` (weight
    parameters of all targeted Linears together, spent greedily where they keep the most
    energy), else ``rank_ratio`` (fraction of each weight's parameters kept; biases stay).
    """

    rank_ratio: float | None = 0.5
    rank: int | dict[str, int] | None = None
    energy: float | None = None
    param_budget: int | None = None
    targets: tuple[str, ...] = ("q", "k", "v", "o")
    method: str = "activation"
    force: bool = False
    damping: float = 1e-2  # times the mean of the second moment's diagonal

    def __post_init__(self) -> None:
        targets = self.targets.split(",") if isinstance(self.targets, str) else self.targets
        object.__setattr__(self, "targets", tuple(t.strip() for t in targets))
        if not self.targets or len(set(self.targets)) != len(self.targets) or set(self.targets) - set(LOW_RANK_TARGETS):
            choices = ", ".join(LOW_RANK_TARGETS)
            raise ConfigError(f"expected distinct targets from {choices}, got {list(self.targets)}; use e.g. q,k,v,o")
        if self.method not in LOW_RANK_METHODS:
            raise ConfigError(f"expected method in {', '.join(LOW_RANK_METHODS)}, got {self.method!r}; use 'activation'")
        if self.criterion == "rank_ratio" and self.rank_ratio is None:
            raise ConfigError("expected one of rank_ratio, rank, energy or param_budget, got none; use rank_ratio=0.5")
        if self.rank_ratio is not None and not (0.0 < self.rank_ratio < 1.0 or self.force and self.rank_ratio > 0):
            raise ConfigError(
                f"expected 0 < rank_ratio < 1, got {self.rank_ratio}; a ratio >= 1 saves nothing (force=True to factorize anyway)"
            )
        ranks = self.rank.values() if isinstance(self.rank, dict) else [] if self.rank is None else [self.rank]
        if any(isinstance(r, bool) or not isinstance(r, int) or r < 1 for r in ranks):
            raise ConfigError(f"expected rank as a positive int or a dict of positive ints, got {self.rank!r}; use e.g. 64")
        if self.energy is not None and not 0.0 < self.energy <= 1.0:
            raise ConfigError(f"expected 0 < energy <= 1, got {self.energy}; use e.g. energy=0.9")
        if self.param_budget is not None and self.param_budget < 1:
            raise ConfigError(f"expected a positive param_budget, got {self.param_budget}")
        if not self.damping >= 0.0:
            raise ConfigError(f"expected damping >= 0, got {self.damping}; use 1e-2")

    @property
    def criterion(self) -> str:
        return next((c for c in ("rank", "energy", "param_budget") if getattr(self, c) is not None), "rank_ratio")


class LowRankLinear(nn.Module):
    """y = up(down(x)): (..., in) -> (..., r) -> (..., out). Exports as two MatMuls (+ the bias Add)."""

    def __init__(self, in_features: int, out_features: int, rank: int, bias: bool = True) -> None:
        super().__init__()
        self.in_features, self.out_features, self.rank = in_features, out_features, rank
        self.down = nn.Linear(in_features, rank, bias=False)
        self.up = nn.Linear(rank, out_features, bias=bias)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.up(self.down(x))  # (..., in) -> (..., r) -> (..., out)


@dataclass
class LowRankSummary:
    """What ``low_rank_`` did: whole-model params and Linear FLOPs per token (attention BMMs,
    which factorization leaves alone, are not counted), the same for the replaced Linears,
    and per layer the rank, shape and energy kept."""

    method: str
    params_before: int
    params_after: int
    flops_before: int
    flops_after: int
    replaced_params_before: int = 0
    replaced_params_after: int = 0
    replaced_flops_before: int = 0
    replaced_flops_after: int = 0
    ranks: dict[str, int] = field(default_factory=dict)
    skipped: dict[str, str] = field(default_factory=dict)  # name -> reason
    layers: dict[str, dict[str, Any]] = field(default_factory=dict)  # name -> m, n, rank, energy_kept

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    def describe(self) -> str:
        return (
            f"low-rank ({self.method}): {len(self.ranks)} Linears factorized, {len(self.skipped)} skipped; "
            f"params {self.params_before} -> {self.params_after}, "
            f"Linear FLOPs/token {self.flops_before} -> {self.flops_after}"
        )


@dataclass
class LayerwiseLowRankSummary:
    """A model factorized layer by layer (an encoder): per layer what ``low_rank_`` replaced, and what distillation recovered."""

    params_before: int
    params_after: int
    replaced_params_before: int = 0
    replaced_params_after: int = 0
    layers: dict[int, dict[str, Any]] = field(default_factory=dict)

    @property
    def replaced_ratio(self) -> float:
        """Parameters of the factorized Linears after / before (0.5 = half of Q/K kept)."""
        return self.replaced_params_after / self.replaced_params_before if self.replaced_params_before else 1.0

    def add(self, layer: int, summary: LowRankSummary, distilled: dict[str, Any] | None = None) -> None:
        """Record layer ``layer``'s factorization (and its distillation)."""
        self.layers[layer] = {"low_rank": summary.to_dict(), "distill": distilled}
        self.replaced_params_before += summary.replaced_params_before
        self.replaced_params_after += summary.replaced_params_after

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["replaced_ratio"] = self.replaced_ratio
        return d

    def describe(self) -> str:
        distilled = [v["distill"] for v in self.layers.values() if v.get("distill")]
        rel = ", ".join(f"{d['val_rel_l2_before']:.3g}->{d['val_rel_l2_after']:.3g}" for d in distilled)
        return (
            f"low-rank encoder: {len(self.layers)} layers, factorized Linears at {100 * self.replaced_ratio:.0f}% "
            f"of their parameters, encoder {self.params_before} -> {self.params_after} parameters" + (f"; distillation rel L2 per layer {rel}" if rel else "")
        )


def _model_cost(model: nn.Module) -> tuple[int, int]:
    linears = [m for m in model.modules() if isinstance(m, nn.Linear)]
    return sum(p.numel() for p in model.parameters()), sum(linear_flops(m.out_features, m.in_features) for m in linears)


def _find_targets(model: nn.Module, targets: tuple[str, ...], skipped: dict[str, str]) -> dict[str, _Site]:
    """name -> (parent, attribute, target) for every plain nn.Linear the targets select."""
    found: dict[str, _Site] = {}
    for pname, parent in model.named_modules():
        prefix = f"{pname}." if pname else ""
        if isinstance(parent, AttentionProjections) and parent.is_qkv_fused and set(targets) & {"q", "k", "v"}:
            skipped[prefix + "w_qkv"] = "Q/K/V are fused into one Linear; apply low_rank_ before fuse_qkv_"
        for target in targets:
            owner = TransformerLayer if target == "ffn" else AttentionProjections
            for attr in LOW_RANK_TARGETS[target] if isinstance(parent, owner) else ():
                mod = getattr(parent, attr, None)
                if mod is not None and type(mod) is not nn.Linear:
                    skipped[prefix + attr] = f"is {type(mod).__name__}, not a plain nn.Linear"
                elif mod is not None:
                    found[prefix + attr] = (parent, attr, target)
    return found


@torch.no_grad()
def _second_moments(
    model: nn.Module, linears: dict[str, nn.Linear], x: torch.Tensor, kpm: torch.Tensor | None, batch_size: int = 16
) -> dict[str, torch.Tensor]:
    """E[a a^T] (float64) of every Linear's input a, over the real (non-padded) tokens of x."""
    sums = {n: torch.zeros(m.in_features, m.in_features, dtype=torch.float64) for n, m in linears.items()}
    counts = dict.fromkeys(linears, 0)
    state: dict[str, Any] = {"keep": None, "cache": {}}

    def hook_for(name: str) -> Any:
        def hook(_mod: nn.Module, args: tuple[torch.Tensor, ...]) -> None:
            a = args[0]
            if id(a) not in state["cache"]:  # q, k and v read one tensor: one product
                keep = state["keep"]
                rows = a[keep] if keep is not None and a.shape[:-1] == keep.shape else a.reshape(-1, a.shape[-1])
                rows = rows.double().cpu()  # (T, in)
                state["cache"][id(a)] = (a, rows.T @ rows, rows.shape[0])
            _, moment, count = state["cache"][id(a)]
            sums[name] += moment
            counts[name] += count

        return hook

    handles = [m.register_forward_pre_hook(hook_for(n)) for n, m in linears.items()]
    device = device_of(model)
    try:
        with eval_mode(model):
            for i in range(0, x.shape[0], batch_size):
                xb, kb = x[i : i + batch_size].to(device), None if kpm is None else kpm[i : i + batch_size].to(device)
                state["keep"], state["cache"] = (None if kb is None else kb != 0), {}
                forward_layer(model, xb, kb)
    finally:
        for h in handles:
            h.remove()
    for name, count in counts.items():
        if count == 0:
            raise ConfigError(f"{name} saw no calibration tokens; check that the mask keeps some tokens")
        sums[name] /= count
    return sums


def _whitener(moment: torch.Tensor, damping: float) -> torch.Tensor:
    """Lower Cholesky factor C of moment + damping*mean(diag)*I; damping grows until it factors."""
    eye = torch.eye(moment.shape[0], dtype=moment.dtype)
    scale = float(moment.diagonal().mean()) or 1.0
    for boost in (1.0, 10.0, 100.0, 1000.0):
        chol, info = torch.linalg.cholesky_ex(moment + max(damping, 1e-8) * boost * scale * eye)
        if int(info) == 0:
            return chol
    raise ConfigError("the calibration second moment is not positive definite even damped; use more tokens or method='svd'")


def _factors(
    u: torch.Tensor, s: torch.Tensor, vh: torch.Tensor, chol: torch.Tensor | None, r: int
) -> tuple[torch.Tensor, torch.Tensor]:
    """up (m, r) and down (r, n), the singular values split evenly between them."""
    root = s[:r].sqrt()
    up, down = u[:, :r] * root, root[:, None] * vh[:r]  # (m, r), (r, n) in whitened coordinates
    if chol is not None:  # un-whiten: down C^{-1}, i.e. solve C^T down^T = (root Vh)^T
        down = torch.linalg.solve_triangular(chol.T, down.T, upper=True).T
    return up, down


def _rank(config: LowRankConfig, name: str, target: str, m: int, n: int, s: torch.Tensor) -> int | None:
    """The rank of one Linear under rank / energy / rank_ratio (None: not in the rank dict)."""
    if config.criterion == "rank":
        if not isinstance(config.rank, dict):
            return config.rank
        return next((config.rank[k] for k in (name, name.rsplit(".", 1)[-1], target) if k in config.rank), None)
    if config.criterion == "energy":
        kept = torch.cumsum(s**2, 0) / (s**2).sum().clamp_min(1e-300)
        return int((kept < config.energy - 1e-12).sum()) + 1
    return min(max(1, int(config.rank_ratio * m * n / (m + n))), min(m, n))


def _budget_ranks(
    budget: int, shapes: dict[str, tuple[int, int]], spectra: dict[str, torch.Tensor], force: bool
) -> dict[str, int | None]:
    """Greedy: a singular direction costs m+n parameters; buy the largest energy share per parameter."""
    floor = sum(m + n for m, n in shapes.values())
    if budget < floor:
        raise ConfigError(f"expected param_budget >= {floor} (rank 1 for each of {len(shapes)} Linears), got {budget}")
    ranks, spent, offers = dict.fromkeys(shapes, 1), floor, []
    for name, (m, n) in shapes.items():
        share = (spectra[name] ** 2 / (spectra[name] ** 2).sum().clamp_min(1e-300)).tolist()
        cap = min(m, n) if force else max(1, (m * n - 1) // (m + n))  # largest rank that still saves
        offers += [(share[i] / (m + n), name) for i in range(1, min(cap, len(share)))]
    for _, name in sorted(offers, key=lambda o: -o[0]):
        cost = sum(shapes[name])
        if spent + cost <= budget:
            ranks[name], spent = ranks[name] + 1, spent + cost
    return ranks


@torch.no_grad()
def low_rank_(
    model: nn.Module,
    config: LowRankConfig | None = None,
    calib_x: torch.Tensor | None = None,
    key_padding_mask: torch.Tensor | None = None,
) -> LowRankSummary:
    """Replace the targeted Linears of ``model`` by ``LowRankLinear`` factors, in place.

    ``calib_x`` (N, L, D) or an ``ActivationSet`` is required for ``method="activation"``;
    padded positions (key_padding_mask == 0) are left out of the statistics. ``model`` is
    run like a ``MaskedLayer`` (see ``forward_layer``).
    """
    config = config or LowRankConfig()
    skipped: dict[str, str] = {}
    found = _find_targets(model, config.targets, skipped)
    if not found and not skipped:
        raise ConfigError(f"expected attention projections or TransformerLayer FFNs for {list(config.targets)}, found none")
    params_before, flops_before = _model_cost(model)
    linears: dict[str, nn.Linear] = {name: getattr(parent, attr) for name, (parent, attr, _) in found.items()}
    chols: dict[str, torch.Tensor | None] = dict.fromkeys(linears)
    if config.method == "activation" and linears:
        if calib_x is None:
            raise ConfigError(
                "method 'activation' needs calibration activations; pass calib_x (load_calibration(...).calib) or use method='svd'"
            )
        if hasattr(calib_x, "to_torch"):  # an ActivationSet
            calib_x, key_padding_mask = calib_x.to_torch()
        kpm = None if key_padding_mask is None else torch.as_tensor(key_padding_mask)
        moments = _second_moments(model, linears, torch.as_tensor(calib_x, dtype=torch.float32), kpm)
        chols = {name: _whitener(moment, config.damping) for name, moment in moments.items()}
    svds = {}  # U, s, Vh of W, or of W C when whitening
    for name, lin in linears.items():
        w = lin.weight.detach().double().cpu()
        svds[name] = torch.linalg.svd(w if chols[name] is None else w @ chols[name], full_matrices=False)
    shapes = {n: (lin.out_features, lin.in_features) for n, lin in linears.items()}
    if config.criterion == "param_budget":
        ranks = _budget_ranks(config.param_budget, shapes, {n: s for n, (_, s, _) in svds.items()}, config.force)
    else:
        ranks = {n: _rank(config, n, found[n][2], *shapes[n], svds[n][1]) for n in linears}
    summary = LowRankSummary(config.method, params_before, params_before, flops_before, flops_before, skipped=skipped)
    for name, lin in linears.items():
        (m, n), r = shapes[name], ranks[name]
        if r is None:
            skipped[name] = "not in the rank dict"
            continue
        if r > min(m, n):
            raise ConfigError(f"rank {r} for {name} exceeds min(m, n) = {min(m, n)}; use a rank <= {min(m, n)}")
        if not factorization_is_profitable(m, n, r) and not config.force:
            saved = f"r*(m+n) = {r * (m + n)} >= m*n = {m * n}"
            skipped[name] = f"rank {r}: {saved} saves nothing (force=True to factorize anyway)"
            continue
        u, s, vh = svds[name]
        up, down = _factors(u, s, vh, chols[name], r)
        low = LowRankLinear(n, m, r, bias=lin.bias is not None).to(device=lin.weight.device, dtype=lin.weight.dtype)
        low.up.weight.copy_(up)
        low.down.weight.copy_(down)
        if lin.bias is not None:
            low.up.bias.copy_(lin.bias)
        parent, attr, _ = found[name]
        setattr(parent, attr, low)
        energy = float((s[:r] ** 2).sum() / (s**2).sum().clamp_min(1e-300))
        summary.ranks[name] = r
        profitable = factorization_is_profitable(m, n, r)
        summary.layers[name] = {"m": m, "n": n, "rank": r, "energy_kept": energy, "profitable": profitable}
        summary.replaced_params_before += m * n
        summary.replaced_params_after += r * (m + n)
        summary.replaced_flops_before += linear_flops(m, n)
        summary.replaced_flops_after += linear_flops(m, n, r)
    summary.params_after, summary.flops_after = _model_cost(model)
    if summary.ranks:
        log.info("%s", summary.describe())
    else:
        log.warning("%s; skipped: %s", summary.describe(), summary.skipped)
    return summary
