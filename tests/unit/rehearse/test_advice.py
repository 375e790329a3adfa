"""The figures under load and the advice table: each lever at its evidence, a leak or a
stall standing alone, counters across a restart.
"""

from __future__ import annotations

import json

import pytest

from kvtop.derive.leak_params import LeakParams
from kvtop.load.driver import RequestRecord
from kvtop.rehearse.advice import LoadFigures, _counter_rise, advise, load_figures
from kvtop.rehearse.criteria import Criterion
from kvtop.rehearse.kv_free import judge_kv
from kvtop.rehearse.requests import RequestTable
from kvtop.rehearse.verdict import Stall
from kvtop.rehearse.watch import EnginePoint, WatchData
from tests.scenarios.rehearse_runs import SPAN, engine_points, sized_leak, watch_data


def test_counters_across_a_restart_count_from_zero() -> None:
    values = (10.0, 20.0, 5.0, 15.0)  # a restart between 20 and 5
    points = [EnginePoint(600.0 * i, "load", 0.0, 1000, 0.0, 1, 0, v, None, None, 0)
              for i, v in enumerate(values)]
    data = WatchData(points={("m", "0"): points})
    assert _counter_rise(data, SPAN, "preemptions") == 10 + 5 + 10
    assert _counter_rise(data, SPAN, "prefix_hits") is None  # not exported


def test_a_stall_is_named_in_the_advice_with_no_capacity_lines() -> None:
    queued = LoadFigures(pinned_share=0.0, preemptions_per_min=0.02, waiting_p90=12,
                         running_max=64, prompt_p90=300)
    stall = Stall("stalled", "no token generated for 162 s with 4 running", "m 0", 9.0)
    (advice,) = advise({}, queued, model_len=4096, expected_hit_rate=None,
                       error_rate=None, errors={}, stall=stall)
    assert advice.lever == "stall"
    assert advice.action.startswith("the engine stopped making progress: no token generated "
                                    "for 162 s with 4 running; its log says why")
    assert advice.figures == {"engine": "m 0", "reason": stall.reason}


def test_the_advice_table() -> None:
    pinned = LoadFigures(pinned_share=0.6, prompt_p90=3000)
    levers = lambda advice: [a.lever for a in advice]  # noqa: E731
    advice = advise({}, pinned, model_len=4096, expected_hit_rate=None,
                    error_rate=None, errors={})
    assert levers(advice) == ["max-model-len"]
    assert advice[0].figures == {"pinned_share": 0.6, "prompt_p90_tokens": 3000,
                                 "max_model_len": 4096}
    queued = LoadFigures(pinned_share=0.0, preemptions_per_min=4.0, waiting_p90=12,
                         running_max=64, prompt_p90=300)
    assert levers(advise({}, queued, model_len=4096, expected_hit_rate=None,
                         error_rate=None, errors={})) == ["max-num-seqs"]
    cold = LoadFigures(hit_rate=0.05)
    advice = advise({}, cold, model_len=4096, expected_hit_rate=0.9, error_rate=0.2,
                    errors={"HTTP 500": 3, "timeout": 9})
    assert levers(advice) == ["prefix-caching", "errors"]
    assert advice[1].figures == {"error_rate": 0.2, "most_common": "timeout"}
    kv = judge_kv(watch_data(engine_points(0, 40), "leak"), LeakParams(), SPAN)
    advice = advise({"kv_free": kv}, pinned, model_len=4096, expected_hit_rate=None,
                    error_rate=None, errors={})
    assert levers(advice) == ["leak"]  # the leak explains the pinned pool
    assert advice[0].figures["idle_used_after"] == 40
    assert advice[0].figures["leak_verdict"] == "leak"


def test_a_leak_is_advised_with_its_size_and_the_next_step() -> None:
    kv = judge_kv(sized_leak(), LeakParams(), SPAN)
    (advice,) = advise({"kv_free": kv}, LoadFigures(), model_len=4096,
                       expected_hit_rate=None, error_rate=None, errors={})
    assert advice.lever == "leak" and "a KV leak of 40 blocks (640 tokens, 0.04 GiB)" in \
        advice.action and "record it (kvtop record)" in advice.action
    assert (advice.figures["leaked_blocks"], advice.figures["leaked_tokens"],
            advice.figures["leaked_gib"]) == (40.0, 640.0, 0.04)


def at(t: float, usage: float | None = None, running: float | None = None,
       waiting: float | None = None, preemptions: float | None = None,
       queries: float | None = None, hits: float | None = None) -> EnginePoint:
    return EnginePoint(t, "load", None, 1000, usage, running, waiting, preemptions, queries,
                       hits, 0)


def prompts(*tokens: int) -> RequestTable:
    table = RequestTable()
    for i, n in enumerate(tokens):
        table.add(RequestRecord(i + 1, 1, "c", 60.0 * i, 0.0, "ok", 7, 10, prompt_tokens=n))
    return table


def test_the_figures_under_load_from_two_engines() -> None:
    outside = (at(-1.0, 1.0, 999, 999, 0, 0, 0), at(3601.0, 1.0, 999, 999, 99, 999, 0))
    data = WatchData(points={
        ("m", "0"): [outside[0], at(0.0, 0.95, 3, 0, 10, 100, 50),
                     at(1800.0, 0.9499, 7, 4, 14, 200, 60), at(3600.0), outside[1]],
        ("m", "1"): [at(600.0, 0.5, 5, 2, 5, 0, 0), at(1200.0, 0.96, 1, 1, 7, 100, 90)]})
    figures = load_figures(data, SPAN, prompts(100, 200, 300, 400, 500, 600))
    assert figures == LoadFigures(
        pinned_share=0.5,  # 0.95 and 0.96 of four: exactly 0.95 is pinned, 0.9499 not
        usage_max=0.96, preemptions=6.0, preemptions_per_min=0.1,
        waiting_p90=pytest.approx(3.4, abs=1e-12),  # of 0, 1, 2, 4
        running_max=7, hit_rate=0.5,  # (10 + 90) / (100 + 100)
        prompt_p90=550.0)


def test_the_figures_of_a_load_that_exported_nothing() -> None:
    data = WatchData(points={("m", "0"): [at(0.0), at(60.0)]})
    assert load_figures(data, SPAN, None) == LoadFigures()
    assert load_figures(data, SPAN, RequestTable()) == LoadFigures()
    assert load_figures(WatchData(), SPAN, None) == LoadFigures()


@pytest.mark.parametrize(("queries", "hits", "hit_rate"), [
    ((0, 0), (0, 0), None),  # no queries: no rate, never a division by zero
    ((0, 10), (None, None), None),  # hits not exported
    ((0, 10), (0, 0), 0.0),
    ((0, 10), (0, 4), 0.4)])
def test_the_hit_rate_needs_queries_and_hits(queries: tuple, hits: tuple,
                                             hit_rate: float | None) -> None:
    points = [at(60.0 * i, queries=q, hits=h) for i, (q, h) in enumerate(zip(queries, hits,
                                                                            strict=True))]
    figures = load_figures(WatchData(points={("m", "0"): points}), SPAN, None)
    assert figures.hit_rate == hit_rate
    assert figures.preemptions is None and figures.preemptions_per_min is None


def test_a_counter_that_did_not_move_rose_by_zero() -> None:
    points = [at(0.0, preemptions=5), at(60.0, preemptions=5), at(120.0, preemptions=7)]
    assert _counter_rise(WatchData(points={("m", "0"): points}), SPAN, "preemptions") == 2


def test_exactly_at_the_pinned_share_and_a_quarter_context_prompt() -> None:
    def levers(share: float, p90: float) -> list[str]:
        figures = LoadFigures(pinned_share=share, prompt_p90=p90)
        return [a.lever for a in advise({}, figures, model_len=4000, expected_hit_rate=None,
                                        error_rate=None, errors={})]
    assert levers(0.25, 1000) == ["max-model-len"]  # both exactly at their thresholds
    assert levers(0.2499, 1000) == []
    assert levers(0.25, 999.9) == []
    assert levers(1.0, 1000) == ["max-model-len"]
    assert levers(0.25, 1000) == levers(0.25, 4000)
    (advice,) = advise({}, LoadFigures(pinned_share=0.62345, prompt_p90=3000.6),
                       model_len=4096, expected_hit_rate=None, error_rate=None, errors={})
    assert advice.action == ("the pool is pinned by long prompts: lower --max-model-len or "
                             "split long tasks")
    assert json.dumps(advice.figures) == (
        '{"pinned_share": 0.623, "prompt_p90_tokens": 3001.0, "max_model_len": 4096}')
    unknown_len = LoadFigures(pinned_share=1.0, prompt_p90=3000)
    assert advise({}, unknown_len, model_len=None, expected_hit_rate=None, error_rate=None,
                  errors={}) == []


@pytest.mark.parametrize(("per_min", "waiting", "queued"), [
    (1.0, None, True), (0.999, None, False), (None, 1.0, True), (None, 0.999, False),
    (0.999, 0.999, False), (1.0, 1.0, True)])
def test_queues_or_preemptions_at_their_thresholds(per_min: float | None,
                                                   waiting: float | None,
                                                   queued: bool) -> None:
    figures = LoadFigures(pinned_share=0.0, preemptions_per_min=per_min, waiting_p90=waiting)
    advice = advise({}, figures, model_len=4096, expected_hit_rate=None, error_rate=None,
                    errors={})
    assert [a.lever for a in advice] == (["max-num-seqs"] if queued else [])


def test_the_queue_advice_in_words_and_figures() -> None:
    figures = LoadFigures(pinned_share=0.9, preemptions_per_min=1.23456, waiting_p90=12.345,
                          running_max=64, prompt_p90=300.4)
    (advice,) = advise({}, figures, model_len=4096, expected_hit_rate=None, error_rate=None,
                       errors={})
    assert advice.action == ("queues and preemptions at moderate context: cap --max-num-seqs "
                             "(or the clients' concurrency), or raise --gpu-memory-utilization")
    assert json.dumps(advice.figures) == (
        '{"preemptions_per_min": 1.23, "waiting_p90": 12.3, "running_max": 64, '
        '"prompt_p90_tokens": 300.0, "max_model_len": 4096}')


@pytest.mark.parametrize(("hit_rate", "expected", "advised"), [
    (0.45, 0.9, False),  # exactly half the expected rate
    (0.4499, 0.9, True), (0.4501, 0.9, False), (0.0, 0.9, True),
    (0.1, None, False), (0.1, 0.0, False), (None, 0.9, False)])
def test_a_low_hit_rate_at_half_the_expected(hit_rate: float | None, expected: float | None,
                                             advised: bool) -> None:
    advice = advise({}, LoadFigures(hit_rate=hit_rate), model_len=None,
                    expected_hit_rate=expected, error_rate=None, errors={})
    assert [a.lever for a in advice] == (["prefix-caching"] if advised else [])


def test_the_hit_rate_advice_in_words_and_figures() -> None:
    (advice,) = advise({}, LoadFigures(hit_rate=0.123456), model_len=None,
                       expected_hit_rate=0.876543, error_rate=None, errors={})
    assert advice.action == ("a low hit rate on a shared-prefix workload: prefix caching is "
                             "off (--enable-prefix-caching) or the prompts do not share a "
                             "prefix")
    assert advice.figures == {"hit_rate": 0.123, "expected_hit_rate": 0.877}


def test_the_errors_advice_in_words_and_figures() -> None:
    (advice,) = advise({}, LoadFigures(), model_len=None, expected_hit_rate=None,
                       error_rate=0.0123456, errors={"b": 2, "a": 5, "c": 1})
    assert advice.action == "requests failed: the server's log says why"
    assert advice.figures == {"error_rate": 0.0123, "most_common": "a"}
    (advice,) = advise({}, LoadFigures(), model_len=None, expected_hit_rate=None,
                       error_rate=0.5, errors={})
    assert advice.figures == {"error_rate": 0.5, "most_common": None}
    assert advise({}, LoadFigures(), model_len=None, expected_hit_rate=None, error_rate=0.0,
                  errors={"a": 1}) == []


def test_a_stall_and_a_leak_both_advised_and_the_capacity_kept_out() -> None:
    stall = Stall("stalled", "no token for 99 s", "m 0", 9.0)
    kv = Criterion("kv_free", "t", "fail", "r", {"engines": []})
    queued = LoadFigures(waiting_p90=5)
    advice = advise({"kv_free": kv}, queued, model_len=None, expected_hit_rate=None,
                    error_rate=None, errors={}, stall=stall)
    assert [a.lever for a in advice] == ["leak", "stall"]
    assert advice[1].action == (
        "the engine stopped making progress: no token for 99 s; its log says why (a hung "
        "worker, a wedged scheduler); record it (kvtop record), report it upstream, restart "
        "the server")
    assert advice[0].action.startswith("the idle floor rises: a KV leak of size unknown; ")
    saturated = Stall("saturated", "busy", "m 0", 9.0)
    assert [a.lever for a in advise({}, queued, model_len=None, expected_hit_rate=None,
                                    error_rate=None, errors={}, stall=saturated)] == \
        ["max-num-seqs"]


def engine(blocks: float | None, rise: float | None, before: float) -> dict:
    return {"leak_size": None if blocks is None else
            {"blocks": blocks, "tokens": blocks * 16, "gib": blocks / 1000},
            "idle_used_rise": rise, "idle_used_before": before, "idle_used_after": before + 1,
            "leak_detector": {"verdict": f"v{before:.0f}", "slope_blocks_per_hour": before * 2}}


@pytest.mark.parametrize(("engines", "chosen", "blocks"), [
    ([engine(None, 5, 1), engine(3, 1, 2), engine(None, 9, 3)], 2, 3),  # the most blocks
    ([engine(None, 5, 1), engine(None, 9, 3), engine(None, 2, 4)], 3, None),  # else the rise
    ([engine(0, None, 1), engine(None, None, 2)], 1, 0),  # a tie: the first
    ([engine(None, None, 1), engine(None, 0.5, 2)], 2, None),  # an unknown rise counts as 0
    ([engine(None, None, 1), engine(0.5, None, 2)], 2, 0.5)])
def test_the_leak_advice_reads_the_worst_engine(engines: list[dict], chosen: int,
                                                blocks: float | None) -> None:
    kv = Criterion("kv_free", "t", "fail", "r", {"engines": engines})
    (advice,) = advise({"kv_free": kv}, LoadFigures(), model_len=None,
                       expected_hit_rate=None, error_rate=None, errors={})
    assert advice.figures == {
        "idle_used_before": chosen, "idle_used_after": chosen + 1,
        "leak_verdict": f"v{chosen}", "leaked_blocks": blocks,
        "leaked_tokens": None if blocks is None else blocks * 16,
        "leaked_gib": None if blocks is None else blocks / 1000,
        "slope_blocks_per_hour": chosen * 2}


def test_a_failed_kv_criterion_without_engines_advises_a_leak_of_unknown_size() -> None:
    for figures in ({}, {"engines": []}):
        kv = Criterion("kv_free", "t", "fail", "r", figures)
        (advice,) = advise({"kv_free": kv}, LoadFigures(), model_len=None,
                           expected_hit_rate=None, error_rate=None, errors={})
        assert advice.figures == dict.fromkeys(
            ("idle_used_before", "idle_used_after", "leak_verdict", "leaked_blocks",
             "leaked_tokens", "leaked_gib", "slope_blocks_per_hour"))
        assert advice.action == ("the idle floor rises: a KV leak of size unknown; record it "
                                 "(kvtop record), report it upstream with the recording, and "
                                 "restart the server to get the blocks back")
