"""Route selection ships the same route run after run: ties within the timing noise go to the target's preference."""

from __future__ import annotations

from attn_export.pipeline.select import Candidate, select_most_accurate, select_route

ORT_CPU = ("dynamic", "static")


def _c(route: str, p50: float, ok: bool = True, headline: float = 0.9999) -> Candidate:
    return Candidate(f"int8-{route}", route, p50, ok, headline, "" if ok else "cosine 0.98 < 0.99")


def test_routes_within_the_noise_band_pick_the_preferred_one_either_way_round():
    for static_ms, dynamic_ms in ((11.2, 11.5), (11.5, 11.2), (10.0, 10.49)):
        res = select_route([_c("static", static_ms), _c("dynamic", dynamic_ms)], ORT_CPU, band=0.05)
        assert res.chosen is not None and res.chosen.route == "dynamic", (static_ms, dynamic_ms)
        assert "within 5%" in res.reason and "prefers dynamic > static" in res.reason


def test_a_clearly_faster_route_wins_over_the_preference():
    res = select_route([_c("static", 8.0), _c("dynamic", 11.0)], ORT_CPU)
    assert res.chosen.route == "static" and "fastest" in res.reason


def test_failing_routes_never_ship_and_the_best_one_is_named():
    res = select_route([_c("static", 8.0, ok=False, headline=0.974), _c("dynamic", 11.0, ok=False, headline=0.988)], ORT_CPU)
    assert res.chosen is None and res.best_failing.route == "dynamic"
    assert "int8-dynamic" in res.reason and "0.98 < 0.99" in res.reason
    only = select_route([_c("static", 8.0, ok=False), _c("dynamic", 30.0)], ORT_CPU)
    assert only.chosen.route == "dynamic"
    assert [t["stage"] for t in only.tried] == ["int8-static", "int8-dynamic"]


def test_a_route_the_policy_does_not_list_is_never_shipped():
    # fp8 static as the fastest and most accurate, on a target whose policy lists int8 static only
    fp8 = Candidate("fp8-static", "fp8-static", 5.0, True, 0.99999)
    for res in (select_route([fp8, _c("static", 9.0)], ("static",)), select_most_accurate([fp8, _c("static", 9.0)], ("static",))):
        assert res.chosen is not None and res.chosen.route == "static", res.reason
    res = select_route([_c("dynamic", 5.0), _c("static", 9.0, ok=False)], ("static",))
    assert res.chosen is None and "int8-dynamic did, on routes it never ships" in res.reason


def test_auto_ships_the_preferred_format_that_meets_its_tolerance():
    """--quantize auto on an FP8 GPU: FP8 ships when it passes, even when int8 scores higher; int8 when FP8 misses."""
    fp8 = Candidate("fp8-static", "static", 9.0, True, 0.99989, precision="fp8")
    int8 = Candidate("int8-static", "static", 9.0, True, 0.99993, precision="int8")
    res = select_most_accurate([fp8, int8], ("static", "static"), ("fp8", "int8"))
    assert res.chosen is fp8 and "the format the GPU prefers (fp8 > int8)" in res.reason, res.reason
    missed = Candidate("fp8-static", "static", 9.0, False, 0.97, "cosine 0.97 < 0.999", precision="fp8")
    assert select_most_accurate([missed, int8], ("static", "static"), ("fp8", "int8")).chosen is int8
    assert select_most_accurate([fp8, int8], ("static",)).chosen is int8  # one format (no order given): the most accurate


def test_a_route_that_fails_a_judged_data_set_ships_only_when_none_passes_them_all():
    """Every judged data set must pass (issue 33): the faster dynamic route fails long texts, the larger static one passes them."""
    long_miss = ("long texts filling 128 tokens (select split) (mean cosine 0.972 < 0.99)",)
    dynamic = Candidate("int8-dynamic", "dynamic", 17.8, True, 0.9971, missed=long_miss)
    static = Candidate("int8-static", "static", 23.4, True, 0.9970)
    for res in (select_route([dynamic, static], ORT_CPU), select_most_accurate([dynamic, static], ORT_CPU)):
        assert res.chosen is static, res.reason
        assert "among the routes passing every judged data set (int8-dynamic fails on long texts filling 128 tokens" in res.reason, res.reason
    assert select_route([dynamic, static], ORT_CPU).tried[0]["fails_on"] == list(long_miss)
    alone = select_route([dynamic, Candidate("int8-static", "static", 23.4, True, 0.9970, missed=long_miss)], ORT_CPU)
    assert alone.chosen is dynamic and "no route passes every judged data set" in alone.reason, alone.reason
