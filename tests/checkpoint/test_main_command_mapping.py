"""``attn-export --checkpoint ...`` maps the main command's flags onto the encoder stages."""

from __future__ import annotations

from pathlib import Path

import pytest

from attn_export.checkpoint.cli import encoder_config_from_main
from attn_export.errors import ConfigError

BASE = dict(
    checkpoint="minilm", layers="all", out=Path("o"), precision="fp32", quantize=None, int8_mode="auto", low_rank=None,
    low_rank_method="activation", low_rank_targets=None, distill=None, calib_method="minmax", attention=None, opset=None,
    batch=8, seq_len=128, threads=None, warmup=1, repeats=3, target="ort-cpu",
)  # fmt: skip


def test_flags_become_stages():
    assert encoder_config_from_main(**BASE).stages == ("onnx-fp32",)
    cfg = encoder_config_from_main(**{**BASE, "precision": "fp16", "quantize": "int8", "low_rank": 0.5, "distill": 40})
    assert cfg.stages == ("onnx-fp32", "onnx-fp16", "int8-dynamic", "int8-static", "int8-torchao", "lowrank", "lowrank-int8")
    assert cfg.lowrank.targets == ("q", "k") and cfg.distill is not None and cfg.distill.steps == 40
    only_static = encoder_config_from_main(**{**BASE, "quantize": "int8", "int8_mode": "static", "calib_method": "entropy"})
    assert only_static.stages == ("onnx-fp32", "int8-static") and only_static.static.method == "entropy"


@pytest.mark.parametrize(
    "override,match",
    [({"target": "jetson"}, "drop --target"), ({"distill": 10}, "add --low-rank"), ({"quantize": "int4"}, "--quantize int8")],
)
def test_bad_combinations(override, match):
    with pytest.raises(ConfigError, match=match):
        encoder_config_from_main(**{**BASE, **override})
