"""The engine attestation in the CI gate: ``check --expect-precision int8 --expect-fused-attention``.

A run that builds an engine records, on its engine stage, what the engine inspector showed
(``runtime.tensorrt.attest``): per GEMM group the precision planned and the one run, fused
attention kernels against attention blocks. The gate asserts those counts from report.json, so a
CI job (or a user's pytest, ``attn_export.testing.assert_engine_attested``) fails when an upgrade
silently widens a GEMM or unfuses attention, even where the run itself was told to accept it.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from attn_export.validate.gate.result import GateCheck

__all__ = ["attestation_checks"]


def _engine_stages(report: Mapping[str, Any]) -> list[tuple[str, dict[str, Any]]]:
    return [(str(s.get("name", "?")), s["details"]["attestation"]) for s in report.get("stages") or []
            if isinstance((s.get("details") or {}).get("attestation"), dict)]  # fmt: skip


def _precision_check(stage: str, att: Mapping[str, Any], precision: str) -> GateCheck:
    planned = [g for g in att.get("groups") or [] if g.get("requested") == precision]
    running = [g for g in planned if g.get("actual") == [precision]]
    wrong = [f"{g['group']} runs {'/'.join(g.get('actual') or ['?'])}" for g in planned if g not in running]
    if not planned:
        why = f"no GEMM group of the engine was planned in {precision} (planned: {', '.join(sorted({str(g.get('requested')) for g in att.get('groups') or []})) or 'none attested'})"
        return GateCheck(stage, f"gemm_groups_{precision}", None, 0.0, None, False, why)
    message = "; ".join(wrong) if wrong else f"every GEMM group planned {precision} runs {precision}"
    return GateCheck(stage, f"gemm_groups_{precision}", None, float(len(running)), float(len(planned)), not wrong, message)


def _fusion_check(stage: str, att: Mapping[str, Any]) -> GateCheck:
    blocks, fused, softmax = int(att.get("attention_blocks") or 0), int(att.get("fused_attention") or 0), att.get("standalone_softmax") or []
    ok = blocks > 0 and fused >= blocks and not softmax
    if blocks == 0:
        message = "the engine's model has no attention block to fuse"
    elif ok:
        message = "one fused attention kernel per block"
    else:
        message = f"{fused} fused attention kernel(s) for {blocks} block(s)" + (f", standalone softmax layer {softmax[0]!r}" if softmax else "")
    return GateCheck(stage, "fused_attention", None, float(fused), float(blocks), ok, message)


def attestation_checks(report: Mapping[str, Any], expect_precision: str | None, expect_fused_attention: bool) -> list[GateCheck]:
    """One check per engine stage and expectation; a report without an attested engine is one failed check."""
    stages = _engine_stages(report)
    if not stages:
        return [GateCheck("engine", "attestation", None, None, None, False,
                          "the report has no engine attestation: the run built no TensorRT engine (add --build-engine)")]  # fmt: skip
    checks: list[GateCheck] = []
    for stage, att in stages:
        if expect_precision is not None:
            checks.append(_precision_check(stage, att, expect_precision))
        if expect_fused_attention:
            checks.append(_fusion_check(stage, att))
    return checks
