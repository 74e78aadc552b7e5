"""int8 recovery by distillation (QAT-lite): fine-tune the float weights through fake int8, then export Q/DQ.

Post-training quantization picks ranges and leaves the weights alone; a few hundred
optimizer steps with the quantizer in the loop let the weights (and, optionally, the
activation ranges) adapt to int8. ``qat_`` trains a copy of the model whose quantized
Linears compute exactly what the static Q/DQ graph will:

* activations: symmetric per-tensor int8, zero point 0, clip threshold t (scale t / 127),
  calibrated on the train split like the static route (real tokens, ``--calib-method``),
  after the same SmoothQuant search (``smoothquant.choose_alpha``; the input is scaled by
  1/s and the weight by s inside the fake-quant Linear, so the trained weights stay in the
  model's own parametrisation); Linears that read the same tensor (Q, K, V) share t and s;
* weights: symmetric int8 per output channel, scale max |w| / 127, recomputed every step;
* rounding passes the gradient straight through; with ``learn_scales`` the thresholds are
  parameters too (LSQ-style: their gradient comes through the scale), else they stay frozen;
* GEMM groups the static route keeps in float stay float here too.

The loss is the subject's own outputs against the fp32 teacher on the train split
(normalised MSE per output on real tokens: hidden states and sentence embedding for an
encoder, y for a layer); early stopping watches ``Subject.select_error`` of the fake-quant
model on the select split and keeps the best weights. Export then writes the trained
float weights, the smoothing scales and the thresholds as Q/DQ ranges
(``quantize_static_onnx(smoothing=..., range_overrides=...)``).
"""

from __future__ import annotations

import copy
import logging
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from attn_export.errors import ConfigError

__all__ = ["FakeQuantLinear", "QatConfig", "QatSummary", "fake_quant", "qat_"]

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class QatConfig:
    """Steps, learning rates, early stopping, and how the activation ranges start and move."""

    steps: int = 200
    lr: float = 1e-5
    scale_lr: float = 1e-3
    learn_scales: bool = True
    method: str = "percentile"  # initial thresholds: the static route's calibration method
    smoothquant: bool = True  # search SmoothQuant scales as the static route does (--smoothquant auto)
    eval_every: int = 25
    patience: int = 3
    select_items: int = 64
    seed: int = 0

    def __post_init__(self) -> None:
        for name in ("steps", "eval_every", "patience", "select_items"):
            if getattr(self, name) < 1:
                raise ConfigError(f"expected QAT {name} >= 1, got {getattr(self, name)}")
        if not (self.lr > 0 and self.scale_lr > 0):
            raise ConfigError(f"expected positive QAT learning rates, got {self.lr} and {self.scale_lr}")


@dataclass
class QatSummary:
    """Select-split error of the fake-quant model before and after (best step), and the history."""

    select_error_before: float
    select_error_after: float
    steps_run: int
    best_step: int
    stopped_early: bool
    learn_scales: bool
    quantized_linears: int
    thresholds: dict[str, float] = field(default_factory=dict)  # Linear path -> trained activation threshold
    history: list[dict[str, float]] = field(default_factory=list)
    scales: dict[str, np.ndarray] = field(default_factory=dict, repr=False)  # Linear path -> SmoothQuant s of its input
    smoothed: int = 0

    @property
    def gain(self) -> float:
        """Share of the fake-quant model's select-split error that training removed."""
        return 1.0 - self.select_error_after / self.select_error_before if self.select_error_before > 0 else 0.0

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d.pop("scales", None)
        d["gain"] = self.gain
        return d

    def describe(self) -> str:
        scales = "learned" if self.learn_scales else "frozen"
        return (f"QAT-lite ({scales} scales, {self.quantized_linears} Linears): select-split error {self.select_error_before:.3e} -> "
                f"{self.select_error_after:.3e} ({100 * self.gain:.0f}% removed, best at step {self.best_step} of {self.steps_run})")  # fmt: skip


def fake_quant(x: torch.Tensor, threshold: torch.Tensor) -> torch.Tensor:
    """Symmetric int8 (zero point 0, scale threshold / 127) with a straight-through rounding gradient."""
    scale = threshold / 127.0
    q = torch.clamp(x / scale, -128.0, 127.0)
    return (q + (torch.round(q) - q).detach()) * scale


def _fake_quant_weight(w: torch.Tensor) -> torch.Tensor:
    """Per-output-channel symmetric int8 of a (out, in) weight, as ORT's per-channel QDQ stores it."""
    scale = w.detach().abs().amax(dim=1, keepdim=True).clamp_min(1e-12) / 127.0
    q = torch.clamp(w / scale, -127.0, 127.0)
    return (q + (torch.round(q) - q).detach()) * scale


class FakeQuantLinear(nn.Module):
    """A Linear whose (smoothed) input and weight pass through int8 fake quantization (training only):
    ``y = Q(x / s) @ Q(W * s)^T + b`` with s = 1 when not smoothed."""

    def __init__(self, linear: nn.Linear, threshold: nn.Parameter, scale: np.ndarray | None = None) -> None:
        super().__init__()
        self.linear = linear
        self.threshold = threshold
        s = torch.ones(linear.in_features) if scale is None else torch.from_numpy(np.asarray(scale, dtype=np.float32))
        self.register_buffer("smooth", s, persistent=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        xq = fake_quant(x / self.smooth, self.threshold.abs() + 1e-8)
        return F.linear(xq, _fake_quant_weight(self.linear.weight * self.smooth), self.linear.bias)


def _to_torch(feed: dict[str, np.ndarray], names: list[str]) -> list[torch.Tensor]:
    return [torch.from_numpy(np.ascontiguousarray(feed[n])) for n in names]


def _keep(feed: dict[str, np.ndarray], out: torch.Tensor) -> torch.Tensor | None:
    """Real-token mask (B, S) for an output whose leading axes are (batch, seq)."""
    from attn_export.compress.probe import MASK_INPUTS

    for name in MASK_INPUTS:
        m = feed.get(name)
        if m is not None and np.asarray(m).ndim == 2 and out.dim() >= 3 and tuple(out.shape[:2]) == np.asarray(m).shape:
            return torch.from_numpy(np.asarray(m) != 0)
    return None


def _outputs(module: nn.Module, feed: dict[str, np.ndarray], names: list[str]) -> tuple[torch.Tensor, ...]:
    out = module(*_to_torch(feed, names))
    return tuple(out) if isinstance(out, (tuple, list)) else (out,)


@contextmanager
def _swapped(module: nn.Module, replacements: dict[str, nn.Module]) -> Iterator[None]:
    """Temporarily replace submodules by path (the originals come back, trained, on exit)."""
    originals = {}
    for path, new in replacements.items():
        parent_path, _, name = path.rpartition(".")
        parent = module.get_submodule(parent_path) if parent_path else module
        originals[path] = (parent, name, getattr(parent, name))
        setattr(parent, name, new)
    try:
        yield
    finally:
        for parent, name, old in originals.values():
            setattr(parent, name, old)


def _shared_inputs(module: nn.Module, linears: list[str], feed: dict[str, np.ndarray], names: list[str]) -> dict[str, str]:
    """Linear path -> key of the tensor it reads (Linears reading the same tensor share a key)."""
    seen: dict[int, str] = {}
    key: dict[str, str] = {}
    alive: list[torch.Tensor] = []  # no tensor may be freed (and its id reused) during the pass
    hooks = []
    for path in linears:
        def hook(_m: nn.Module, args: tuple[torch.Tensor, ...], path: str = path) -> None:
            alive.append(args[0])
            key[path] = seen.setdefault(id(args[0]), path)
        hooks.append(module.get_submodule(path).register_forward_pre_hook(hook))
    try:
        with torch.no_grad():
            _outputs(module, feed, names)
    finally:
        for h in hooks:
            h.remove()
    return key


def _collect(module: nn.Module, linears: list[str], keys: dict[str, str], feeds: list[dict[str, np.ndarray]], names: list[str],
             scales: dict[str, np.ndarray] | None, sample_tokens: int = 512, seed: int = 0) -> dict[str, Any]:  # fmt: skip
    """Per shared input, real-token statistics: channel maxima, a token sample, and the |x / s| histogram."""
    from attn_export.compress.probe import TensorStats, real_tokens

    rng = np.random.default_rng(seed)
    stats = {k: TensorStats(k) for k in set(keys.values())}
    samples: dict[str, list[np.ndarray]] = {k: [] for k in stats}
    per_feed = -(-sample_tokens // max(1, len(feeds)))
    current: dict[str, Any] = {}
    hooks = []
    for path in linears:
        if keys[path] != path:
            continue  # a Linear sharing another's input adds nothing
        def hook(_m: nn.Module, args: tuple[torch.Tensor, ...], path: str = path) -> None:
            rows = real_tokens(current["feed"], args[0].detach().numpy())
            st = stats[path]
            m = np.abs(rows).max(axis=0)
            st.channel_absmax = m if st.channel_absmax is None else np.maximum(st.channel_absmax, m)
            st.hist.add(rows / scales[path] if scales and path in scales else rows)
            samples[path].append(rows[rng.choice(len(rows), size=min(per_feed, len(rows)), replace=False)])
        hooks.append(module.get_submodule(path).register_forward_pre_hook(hook))
    try:
        with torch.no_grad():
            for feed in feeds:
                current["feed"] = feed
                _outputs(module, feed, names)
    finally:
        for h in hooks:
            h.remove()
    for k, parts in samples.items():
        stats[k].sample = np.concatenate(parts)[:sample_tokens] if parts else None
    return stats


def _smoothing(module: nn.Module, linears: list[str], keys: dict[str, str], stats: dict[str, Any], method: str) -> dict[str, np.ndarray]:
    """The static route's SmoothQuant search, per shared input (key -> s, for the keys it helps)."""
    from attn_export.compress.quant.smoothquant_alpha import MIN_GAIN, MIN_GAIN_MUL, choose_alpha, smoothing_scale

    out = {}
    for key, st in stats.items():
        members = [p for p in linears if keys[p] == key]
        w = np.concatenate([module.get_submodule(p).weight.detach().numpy().T for p in members], axis=1)  # (K, sum M)
        folds = all(p.rsplit(".", 1)[-1] in ("w_o", "out_proj") for p in members)  # the static route folds these into W_v
        choice = choose_alpha(key, st.sample, st.channel_absmax, w, "static", method, min_gain=MIN_GAIN if folds else MIN_GAIN_MUL)
        if choice.alpha is not None:
            out[key] = smoothing_scale(st.channel_absmax, w, choice.alpha)
    return out


def qat_(student: nn.Module, teacher: nn.Module, subject: Any, float_groups: set[str], config: QatConfig | None = None) -> QatSummary:
    """Fine-tune ``student`` (in place, float weights) through int8 fake quantization towards ``teacher``.

    ``subject`` gives the data (``feeds("train")``, ``select_error(runner, n)``) and the
    input/output names; Linears of ``float_groups`` (``mixed_precision`` group names) stay float.
    """
    from attn_export.compress.quant.gemm_groups import group_of
    from attn_export.runtime import EagerRunner

    config = config or QatConfig()
    if student is teacher:
        raise ConfigError("expected a student copy of the model; pass copy.deepcopy(teacher) as the student")
    names, outs = list(subject.input_names), list(subject.output_names)
    train = subject.feeds("train")
    linears = [p for p, m in student.named_modules() if type(m) is nn.Linear and group_of(p) not in float_groups]
    if not linears:
        raise ConfigError("no Linear left to quantize: every GEMM group is kept in float")
    student.eval()
    teacher.eval()
    from attn_export.compress.calib.choice import choose_ranges

    keys = _shared_inputs(student, linears, train[0], names)
    scales: dict[str, np.ndarray] = {}
    if config.smoothquant:
        scales = _smoothing(student, linears, keys, _collect(student, linears, keys, train, names, None), config.method)
    init = {k: c.threshold for k, c in choose_ranges(_collect(student, linears, keys, train, names, scales), config.method).items()}
    thresholds = nn.ParameterDict({k.replace(".", "/"): nn.Parameter(torch.tensor(float(v)), requires_grad=config.learn_scales) for k, v in init.items()})
    wrappers = {p: FakeQuantLinear(student.get_submodule(p), thresholds[keys[p].replace(".", "/")], scales.get(keys[p])) for p in linears}
    weights = [p for p in student.parameters() if p.requires_grad]
    groups: list[dict[str, Any]] = [{"params": weights, "lr": config.lr}]
    if config.learn_scales:
        groups.append({"params": list(thresholds.parameters()), "lr": config.scale_lr})
    opt = torch.optim.AdamW(groups, weight_decay=0.0)
    with torch.no_grad():
        targets = [_outputs(teacher, f, names) for f in train]

    def select_error() -> float:
        return float(subject.select_error(EagerRunner(student, names, outs, name="qat"), config.select_items))

    history: list[dict[str, float]] = []
    with _swapped(student, wrappers), torch.random.fork_rng(devices=[]):
        torch.manual_seed(config.seed)
        before = best = select_error()
        best_state = copy.deepcopy((student.state_dict(), thresholds.state_dict()))
        best_step, bad, stopped, step = 0, 0, False, 0
        history.append({"step": 0, "select_error": before})
        order = torch.randperm(len(train)).tolist()
        for step in range(1, config.steps + 1):
            i = order[(step - 1) % len(order)]
            feed, target = train[i], targets[i]
            loss = torch.zeros(())
            for got, ref in zip(_outputs(student, feed, names), target):
                keep = _keep(feed, ref)
                g, r = (got[keep], ref[keep]) if keep is not None else (got, ref)
                loss = loss + F.mse_loss(g, r) / r.pow(2).mean().clamp_min(1e-12)
            opt.zero_grad(set_to_none=True)
            loss.backward()
            opt.step()
            if step % config.eval_every and step != config.steps:
                continue
            err = select_error()
            history.append({"step": step, "train_loss": float(loss.detach()), "select_error": err})
            if err < best:
                best, best_step, bad = err, step, 0
                best_state = copy.deepcopy((student.state_dict(), thresholds.state_dict()))
            else:
                bad += 1
                if bad >= config.patience:
                    stopped = True
                    break
        student.load_state_dict(best_state[0])
        thresholds.load_state_dict(best_state[1])
    student.eval()
    trained = {p: float(thresholds[keys[p].replace(".", "/")].detach().abs()) for p in linears}
    summary = QatSummary(before, best, step, best_step, stopped, config.learn_scales, len(linears), trained, history,
                         {p: scales[keys[p]] for p in linears if keys[p] in scales}, len(scales))  # fmt: skip
    log.info("%s", summary.describe())
    return summary
