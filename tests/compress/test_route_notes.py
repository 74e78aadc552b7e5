"""What the run says about a route it left out: what happened, never advice to pass what it already uses."""

from __future__ import annotations

import pytest

from attn_export.config.run import RunConfig
from attn_export.errors import ConfigError
from attn_export.pipeline.plan import make_plan


@pytest.mark.parametrize("target", ["tensorrt", "jetson"])
def test_the_automatic_per_token_skip_on_tensorrt_tells_what_happened(target):
    plan = make_plan(RunConfig(target=target, quantize="int8"))
    note = plan.skipped["int8-per-token"]  # --int8-mode auto asks for per-token (ORT CPU's default); TensorRT cannot run it
    assert "MatMulIntegerToFloat" in note and "the target's route policy builds static for it instead" in note, note
    assert "int8-dynamic" not in plan.skipped and "int8-dynamic" not in {s.name for s in plan.steps}  # opt-in: not asked for
    assert "--int8-mode" not in note, f"the user did not choose the route mode, yet the note tells them to: {note}"
    assert any(s.name == "int8-static" for s in plan.steps)


def test_an_explicit_dynamic_request_on_tensorrt_is_refused_with_the_fix():
    with pytest.raises(ConfigError, match="use --int8-mode static"):
        RunConfig(target="tensorrt", quantize="int8", int8_mode="dynamic")
