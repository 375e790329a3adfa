"""The figures under load and the advice table: each lever at its evidence, a leak or a
stall standing alone, counters across a restart.
"""

from __future__ import annotations

from kvtop.derive.leak_params import LeakParams
from kvtop.rehearse.advice import LoadFigures, _counter_rise, advise
from kvtop.rehearse.kv_free import judge_kv
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
