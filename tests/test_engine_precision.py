"""The engine's precision is decided once, by the plan (``Plan.engine_precision``): the CLI builds the
engine options without one, ``RunConfig.engine_spec`` takes the plan's, and the deploy step passes it."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

from attn_export.config.run import RunConfig
from attn_export.pipeline.plan import make_plan

PACKAGE = Path(__file__).resolve().parents[1] / "attn_export"


@pytest.mark.parametrize(("options", "expect"), [
    ({"target": "tensorrt"}, "fp32"),
    ({"target": "tensorrt", "precision": "fp16"}, "fp16"),
    ({"target": "tensorrt", "quantize": "int8"}, "int8"),
    ({"target": "tensorrt", "precision": "fp16", "quantize": "int8"}, "int8"),  # the 8-bit route ships, not model.onnx
    ({"target": "tensorrt", "quantize": "fp8", "gpu_arch": "sm90"}, "fp8"),
])  # fmt: skip
def test_the_plan_decides_the_engine_precision(options, expect):
    assert make_plan(RunConfig(**options)).engine_precision() == expect


def test_auto_builds_the_engine_in_the_format_that_shipped():
    plan = make_plan(RunConfig(target="jetson", gpu_arch="sm110", quantize="auto"))
    assert plan.deploy_precision == "8bit"
    assert plan.engine_precision("int8") == "int8" and plan.engine_precision("fp8") == "fp8"
    assert plan.engine_precision(None) == "fp8"  # the first format the run planned for this GPU


def test_only_the_plan_calls_the_precision_rule():
    """``engine_precision`` (the rule in vocab/precisions.py) is called by pipeline/plan.py alone."""
    callers = []
    for path in sorted(PACKAGE.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Call) and getattr(node.func, "id", getattr(node.func, "attr", None)) == "engine_precision":
                callers.append(path.relative_to(PACKAGE).as_posix())
    assert set(callers) <= {"pipeline/plan.py", "pipeline/deploy.py"}, callers
    assert "pipeline/deploy.py" not in callers or "plan.engine_precision" in (PACKAGE / "pipeline/deploy.py").read_text()
