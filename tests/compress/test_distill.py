"""Distillation: attention capture and KL, determinism, early stopping, and the acceptance claim
that distillation lowers the validation error of the activation-aware low-rank student."""

from __future__ import annotations

import copy

import numpy as np
import pytest
import torch

from attn_export.compress.calib.data import ActivationSet, CalibrationData, default_calibration_path, load_calibration
from attn_export.compress.calib.generate import generate_calibration
from attn_export.compress.distill import DistillConfig, attention_kl, capture_attention, distill_, output_error
from attn_export.compress.lowrank import LowRankConfig, low_rank_
from attn_export.errors import ConfigError
from attn_export.layers import MaskedLayer, build_layer


@pytest.fixture(autouse=True)
def _one_thread():
    """Training steps this small run fastest on one thread (and do not fight parallel jobs)."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


def _layer(d_model: int = 64, heads: int = 4, name: str = "transformer") -> MaskedLayer:
    return MaskedLayer(build_layer(name, d_model, heads, mask="padding"), "padding")


@pytest.fixture(scope="module")
def data64(tmp_path_factory) -> CalibrationData:
    path = generate_calibration(tmp_path_factory.mktemp("calib") / "d64.npz", d_model=64, n_calib=16, n_val=4, seq_len=16)
    return load_calibration(path, d_model=64)


def _student(teacher: MaskedLayer, data: CalibrationData, method: str = "activation") -> MaskedLayer:
    student = copy.deepcopy(teacher)
    low_rank_(student, LowRankConfig(rank_ratio=0.5, method=method), data.calib)
    return student


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [({"steps": 0}, "steps >= 1"), ({"lr": 0.0}, "lr > 0"), ({"attn_kl_weight": -1.0}, "attn_kl_weight >= 0"), ({"patience": 0}, "patience >= 1")],
)
def test_config_rejects_bad_values(kwargs, match):
    with pytest.raises(ConfigError, match=match):
        DistillConfig(**kwargs)


@pytest.mark.parametrize("name", ["transformer", "mha", "self-attention"])
def test_capture_attention_forces_weights_without_changing_the_output(name):
    layer = _layer(name=name)
    x = torch.randn(2, 5, 64)
    kpm = torch.tensor([[1, 1, 1, 1, 1], [1, 1, 0, 0, 0]], dtype=torch.int32)
    with torch.no_grad():
        plain = layer(x, kpm)
        with capture_attention(layer) as probs:
            hooked = layer(x, kpm)
    torch.testing.assert_close(hooked, plain)
    (p,) = probs.values()
    assert p.shape == (2, 4, 5, 5)
    torch.testing.assert_close(p.sum(-1), torch.ones(2, 4, 5))
    assert float(p[1, :, :, 2:].abs().max()) == 0.0, "padded keys get no attention"
    assert not any(m._forward_pre_hooks or m._forward_hooks for m in layer.modules()), "hooks must be removed"


def test_attention_kl_is_zero_for_equal_rows_and_ignores_padded_queries():
    p = torch.softmax(torch.randn(1, 2, 3, 3), -1)
    q = torch.softmax(torch.randn(1, 2, 3, 3), -1)
    assert float(attention_kl(p, p)) == pytest.approx(0.0, abs=1e-7)
    assert float(attention_kl(p, q)) > 0
    keep = torch.tensor([[True, True, False]])
    q_padded_row_differs = p.clone()
    q_padded_row_differs[:, :, 2] = q[:, :, 2]
    assert float(attention_kl(p, q_padded_row_differs, keep)) == pytest.approx(0.0, abs=1e-7)


def test_distillation_lowers_validation_error_and_leaves_teacher_alone(data64):
    teacher = _layer()
    before = copy.deepcopy(teacher.state_dict())
    student = _student(teacher, data64, method="svd")
    summary = distill_(student, teacher, data64.calib, data64.val, DistillConfig(steps=30, batch_size=4, eval_every=10, progress=False))
    assert summary.val_rel_l2_after < 0.9 * summary.val_rel_l2_before, summary.describe()
    assert output_error(student, teacher, data64.val).rel_l2 == pytest.approx(summary.val_rel_l2_after, rel=1e-5)
    assert all(torch.equal(v, teacher.state_dict()[k]) for k, v in before.items()), "the teacher must stay frozen"
    assert [h["step"] for h in summary.history] == [0, 10, 20, 30] and summary.to_dict()["steps_run"] == 30


def test_same_seed_same_student(data64):
    teacher = _layer()
    cfg = DistillConfig(steps=6, batch_size=4, eval_every=3, progress=False, seed=7)
    a, b = _student(teacher, data64), _student(teacher, data64)
    sa = distill_(a, teacher, data64.calib, data64.val, cfg)
    sb = distill_(b, teacher, data64.calib, data64.val, cfg)
    assert sa.history == sb.history
    assert all(torch.equal(v, b.state_dict()[k]) for k, v in a.state_dict().items())


def test_gradient_checkpointing_gives_the_same_training(data64, monkeypatch):
    import attn_export.compress.distill as distill_module

    calls = []
    real = distill_module.checkpoint
    monkeypatch.setattr(distill_module, "checkpoint", lambda *a, **kw: calls.append(1) or real(*a, **kw))
    teacher = _layer()
    cfg = DistillConfig(steps=4, batch_size=4, eval_every=2, progress=False)
    plain, ckpt = _student(teacher, data64), _student(teacher, data64)
    s_plain = distill_(plain, teacher, data64.calib, data64.val, cfg)
    assert not calls
    s_ckpt = distill_(ckpt, teacher, data64.calib, data64.val, DistillConfig(**{**cfg.__dict__, "grad_checkpointing": True}))
    assert len(calls) == 4
    assert [h["train_loss"] for h in s_ckpt.history[1:]] == pytest.approx([h["train_loss"] for h in s_plain.history[1:]], rel=1e-4)


def test_early_stopping_restores_the_best_weights(data64):
    teacher = _layer()
    student = _student(teacher, data64)
    start = copy.deepcopy(student.state_dict())
    summary = distill_(student, teacher, data64.calib, data64.val, DistillConfig(steps=50, lr=1.0, eval_every=1, patience=2, progress=False))
    assert summary.stopped_early and summary.steps_run < 50 and summary.best_step == 0
    assert summary.val_mse_after == summary.val_mse_before
    assert all(torch.equal(v, student.state_dict()[k]) for k, v in start.items()), "a diverged run must be rolled back"


def test_student_must_not_be_the_teacher(data64):
    teacher = _layer()
    with pytest.raises(ConfigError, match="deepcopy"):
        distill_(teacher, teacher, data64.calib, data64.val, DistillConfig(steps=1, progress=False))


@pytest.mark.parametrize("name", ["mha", "self-attention"])
def test_attention_only_layers_distill(name, data64):
    teacher = _layer(name=name)
    student = _student(teacher, data64, method="svd")
    summary = distill_(student, teacher, data64.calib, data64.val, DistillConfig(steps=10, batch_size=4, eval_every=5, progress=False))
    assert summary.val_mse_after < summary.val_mse_before


def _svd_act_distill(teacher: MaskedLayer, data: CalibrationData, cfg: DistillConfig) -> dict[str, float]:
    errors = {"svd": output_error(_student(teacher, data, "svd"), teacher, data.val).rel_l2}
    student = _student(teacher, data)
    summary = distill_(student, teacher, data.calib, data.val, cfg)
    errors["activation"], errors["activation+distill"] = summary.val_rel_l2_before, summary.val_rel_l2_after
    print(f"validation rel L2 at 50% of projection params: {errors}; {summary.describe()}")
    return errors


def test_distillation_improves_activation_aware_student_d128(tmp_path):
    """Fast acceptance variant: svd > activation-aware > activation-aware + distillation, on val."""
    data = load_calibration(generate_calibration(tmp_path / "d128.npz", 128, n_calib=32, n_val=8, seq_len=32, seed=2))
    errors = _svd_act_distill(_layer(128, 8), data, DistillConfig(steps=150, batch_size=8, eval_every=25, progress=False))
    assert errors["svd"] > errors["activation"] > errors["activation+distill"], errors
    assert errors["activation+distill"] < 0.95 * errors["activation"], errors


@pytest.mark.slow
def test_distillation_improves_activation_aware_student_default_layer():
    """Acceptance on the default layer (d_model 512, 8 heads) and the shipped calibration set."""
    data = load_calibration(default_calibration_path(512), d_model=512)
    errors = _svd_act_distill(_layer(512, 8), data, DistillConfig(steps=200, batch_size=8, eval_every=20, progress=False))
    assert errors["svd"] > errors["activation"] > errors["activation+distill"], errors
    assert errors["activation+distill"] < 0.95 * errors["activation"], errors


def test_unmasked_data_is_accepted():
    rng = np.random.default_rng(0)
    x = rng.standard_normal((6, 8, 64)).astype(np.float32)
    data = CalibrationData(ActivationSet(x[:4]), ActivationSet(x[4:]), "inline")
    teacher = MaskedLayer(build_layer("transformer", 64, 4), "none")
    student = _student(teacher, data, "svd")
    summary = distill_(student, teacher, data.calib, data.val, DistillConfig(steps=4, batch_size=2, eval_every=2, progress=False))
    assert np.isfinite(summary.val_mse_after) and summary.val_mse_after <= summary.val_mse_before
