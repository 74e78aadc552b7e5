"""The public entry point of the one pipeline: ``run_pipeline(PipelineConfig(...))``.

``PipelineConfig`` is ``attn_export.config.run.RunConfig`` (every option of a run, validated
before anything is built) and ``run_pipeline`` runs it through ``attn_export.pipeline.runner`` and
returns the report. Layers and checkpoints go through the same stages:

    subject -> export -> low-rank -> distillation -> int8 routes -> select -> deploy -> report
"""

from __future__ import annotations

from collections.abc import Callable

from attn_export.config.run import RunConfig
from attn_export.validate.report import Report

__all__ = ["PipelineConfig", "run_pipeline"]

PipelineConfig = RunConfig


def run_pipeline(cfg: RunConfig, progress: Callable[[str], None] | None = None) -> Report:
    """Run every requested stage; writes the artifacts and report.json into ``cfg.out``."""
    from attn_export.pipeline.runner import run

    return run(cfg, progress).report
