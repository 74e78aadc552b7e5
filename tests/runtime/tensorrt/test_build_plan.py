"""One build plan per TensorRT release, held to the strict doubles and the recorded trtexec option lists.

For 10.3 (JetPack 6), 10.14 and 11.4 (and 11.0): every plan's ``BuilderFlag`` names are set on
the release's strict double (a name the bindings lack fails as on a GPU), and every trtexec
argument is an option of that release's trtexec. trtexec 11.4's option list is not recorded
(the TensorRT repository snapshot stops at release/11.1), so 11.4 lines are checked against
11.1's, the newest recorded.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from trt_fakes import FakeTensorRT, unknown_flags

from attn_export.errors import ConfigError
from attn_export.runtime.tensorrt.build_plan import GRAPH_PRECISIONS, plan_build, plan_table, precision_plan
from attn_export.runtime.tensorrt.spec import EngineSpec

# release -> (bindings manifest, trtexec option list)
RELEASES = {"10.3": ("10.3.0", "10.3"), "10.14": ("10.14.1.48.post1", "10.14"), "11.0": ("11.0.0.114", "11.0"), "11.4": ("11.4.0.106", "11.1")}
CASES = [(g, ft, e) for g in GRAPH_PRECISIONS for ft in ("fp32", "fp16") for e in ((None, "fp16") if g == "fp32" else (None,)) if not (g == "fp32" and ft == "fp16")]
DOCS = Path(__file__).resolve().parents[3] / "docs" / "targets.md"


def _plans(release: str):  # type: ignore[no-untyped-def]
    for graph, float_type, engine in CASES:
        try:
            yield (graph, float_type, engine), precision_plan(release, graph, float_type=float_type, engine_precision=engine)
        except ConfigError as err:
            assert release.startswith("11") and graph == "fp32" and engine == "fp16", f"{release} {graph}/{float_type}/{engine}: {err}"


@pytest.mark.parametrize("release", list(RELEASES))
def test_every_plan_is_valid_for_the_release(release: str) -> None:
    manifest, trtexec = RELEASES[release]
    trt = FakeTensorRT(manifest)
    for case, plan in _plans(release):
        args = list(plan.trtexec_args)
        assert unknown_flags(["trtexec", *args], trtexec) == [], f"{release} {case}: {args}"
        builder = trt.Builder(trt.Logger(trt.Logger.WARNING))
        flags = 1 << int(trt.NetworkDefinitionCreationFlag.STRONGLY_TYPED) if plan.strongly_typed else 0
        builder.create_network(flags)
        config = builder.create_builder_config()
        for name in plan.builder_flags:
            config.set_flag(getattr(trt.BuilderFlag, name))  # AttributeError where the bindings lack the flag
        if release.startswith("11"):
            assert plan.strongly_typed and plan.builder_flags == () and not {"--fp16", "--int8", "--fp8", "--stronglyTyped"} & set(args), (case, args)


@pytest.mark.parametrize("release", ["10.3", "10.14"])
def test_fp8_on_10x_is_weakly_typed_fp8_plus_fp16_unless_the_graph_is_typed(release: str) -> None:
    plan = precision_plan(release, "fp8", arch="sm90")
    assert (plan.strongly_typed, plan.builder_flags, plan.trtexec_args) == (False, ("FP8", "FP16"), ("--fp8", "--fp16")), plan
    assert "weak-fp8" in plan.sources and "fp8-int8" in plan.sources
    deprecated = any("deprecated" in r for r in plan.reasons)
    assert deprecated == (release == "10.14"), plan.reasons  # BuilderFlag.FP8 is deprecated from 10.12
    typed = precision_plan(release, "fp8", float_type="fp16")
    assert typed.strongly_typed and typed.trtexec_args == ("--stronglyTyped",) and typed.builder_flags == ()
    assert precision_plan(release, "int8").trtexec_args == ("--int8", "--fp16")


def test_refusals_are_one_line_and_say_what_to_do() -> None:
    cases = [
        (dict(trt_version="10.3", graph="fp8", arch="sm87"), "sm89"),
        (dict(trt_version="11.4", graph="fp8", arch="sm80"), "--quantize int8"),
        (dict(trt_version="10.14", graph="fp8", hardware_compatibility="ampere+"), "ampere\\+"),
        (dict(trt_version="11.4", graph="fp32", engine_precision="fp16"), "removed BuilderFlag.FP16"),
        (dict(trt_version="11.0", graph="int8", strongly_typed=False), "only strongly typed"),
        (dict(trt_version="10.14", graph="fp32", engine_precision="int8"), "quantize the graph first"),
        (dict(trt_version="10.14", graph="int4"), "expected a graph precision"),
    ]
    for kwargs, pattern in cases:
        with pytest.raises(ConfigError, match=pattern) as err:
            precision_plan(**kwargs)  # type: ignore[arg-type]
        assert "\n" not in str(err.value)


@pytest.mark.parametrize("release", ["10.3", "10.14", "11.0", "11.4"])
def test_agrees_with_plan_build_where_both_decide(release: str) -> None:
    """For fp32/fp16/int8 the new plan is today's ``trt_spec.plan_build``, so merging them changes no engine."""
    for engine, graph_float, has_qdq, graph in (("fp16", "fp32", False, "fp32"), ("fp16", "fp16", False, "fp16"), ("int8", "fp32", True, "int8"), ("fp32", "fp32", False, "fp32")):
        try:
            old = plan_build(EngineSpec(precision=engine), release, graph_float, has_qdq)
        except ConfigError:
            with pytest.raises(ConfigError):
                precision_plan(release, graph, float_type=graph_float, engine_precision=engine if graph == "fp32" else None)
            continue
        new = precision_plan(release, graph, float_type=graph_float, engine_precision=engine if graph == "fp32" else None)
        assert (new.strongly_typed, new.builder_flags) == (old.strongly_typed, old.builder_flags), (release, engine, graph_float, old, new)


def test_docs_table_is_the_data() -> None:
    assert plan_table() in DOCS.read_text(), "docs/targets.md lacks the generated build table; paste build_plan.plan_table()"


def test_every_source_a_plan_cites_is_in_the_table() -> None:
    """Each rule a plan applies names its source; the key must be a row of ``SOURCES`` and every row cited by some plan."""
    from attn_export.runtime.tensorrt.build_plan import SOURCES

    cited = {key for release in RELEASES for _case, plan in _plans(release) for key in plan.sources}
    assert cited <= set(SOURCES), cited - set(SOURCES)
    assert cited == set(SOURCES), set(SOURCES) - cited  # a row no plan cites is a rule the code does not apply
