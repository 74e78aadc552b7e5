"""Round four, one vocabulary of precisions: ``--precision`` names the exported graph's float
type. An 8-bit name there (int8, and fp8 once the vocabulary listed it) was accepted and the run
exported and judged fp32 under the user's int8 request; it is refused before any work, pointing
at ``--quantize``."""

from __future__ import annotations

import pytest
from rel_helpers import assert_refused, run_cli


@pytest.mark.parametrize(
    ("value", "fix"),
    [
        pytest.param("int8", "use --quantize int8", id="c08_precision_int8_is_refused_pointing_at_quantize"),
        pytest.param("fp8", "use --quantize fp8", id="c08_precision_fp8_is_refused_pointing_at_quantize"),
        pytest.param("tf32", "use --precision fp32", id="c08_precision_tf32_is_refused"),
    ],
)
def test_c08_precision_takes_only_export_floats(value, fix, tmp_path, capsys):
    out = tmp_path / "run"
    o = run_cli(["--precision", value, "--out", out], capsys, tmp_path)
    assert_refused(o, f"expected --precision in fp32|fp16|bf16, got '{value}'; {fix}")
    assert not out.exists()
