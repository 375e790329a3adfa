"""The verdict over the criteria: the rule at each boundary, a stall, a silent server,
what a GO rests on and what a no-verdict lacks.
"""

from __future__ import annotations

import pytest

from kvtop.derive.verdicts import StallVerdict
from kvtop.derive.worst import EngineVerdict
from kvtop.rehearse.criteria import TITLES, Criterion
from kvtop.rehearse.verdict import DEFAULT_MAX_ERROR_RATE, Requests, Stall, decide, judge_stall
from kvtop.rehearse.watch import WatchData


def crit(name: str, state: str) -> Criterion:
    return Criterion(name, TITLES[name], state, "")  # type: ignore[arg-type]


@pytest.mark.parametrize(("states", "strict", "errors", "verdict"), [
    (("ok", "ok", "ok"), False, 0.0, "go"),
    (("ok", "fail", "ok"), False, 0.0, "no-go"),  # a leak is NO-GO by itself
    (("fail", "ok", "ok"), False, 0.0, "go"),  # one soft signal of three
    (("ok", "ok", "fail"), False, 0.0, "go"),
    (("fail", "ok", "fail"), False, 0.0, "no-go"),  # two soft signals
    (("fail", "watch", "ok"), False, 0.0, "no-go"),  # WATCH counts toward two...
    (("ok", "watch", "fail"), False, 0.0, "no-go"),
    (("ok", "watch", "watch"), False, 0.0, "go"),  # ...a latency WATCH does not
    (("ok", "watch", "ok"), True, 0.0, "go"),  # ...and never alone, even --strict
    (("ok", "ok", "fail"), True, 0.0, "no-go"),
    (("fail", "ok", "ok"), True, 0.0, "no-go"),
    (("ok", "ok", "ok"), False, 0.02, "no-go"),
    (("ok", "ok", "ok"), False, 0.01, "go"),  # exactly the limit is not over it
    (("ok", "ok", "ok"), False, 0.0101, "no-go"),
    (("not_judged", "ok", "watch"), False, 0.005, "go"),
    (("ok", "not_judged", "ok"), False, 0.0, "no-verdict"),  # GO needs free KV judged...
    (("ok", "ok", "not_judged"), False, 0.0, "no-verdict"),  # ...and latency
    (("ok", "not_judged", "not_judged"), False, None, "no-verdict"),
    (("fail", "not_judged", "fail"), False, 0.0, "no-go"),  # a NO-GO needs no more
])
def test_the_rule(states: tuple[str, str, str], strict: bool, errors: float | None,
                  verdict: str) -> None:
    criteria = [crit(n, s) for n, s in zip(("gpu_memory", "kv_free", "latency"), states,
                                           strict=True)]
    decision = decide(criteria, strict=strict, error_rate=errors, max_error_rate=0.01)
    assert decision.verdict == verdict, decision.reasons
    assert decision.failed == [c.name for c in criteria if c.state == "fail"]


def test_a_go_says_what_it_rests_on_and_a_no_verdict_what_is_missing() -> None:
    judged = [crit("gpu_memory", "not_judged"), crit("kv_free", "ok"), crit("latency", "ok")]
    go = decide(judged, strict=False, error_rate=0.0, max_error_rate=0.01)
    assert go.verdict == "go" and go.missing == []
    assert [line.split(":")[0] for line in go.evidence] == ["free KV not falling",
                                                            "slow-request share not rising"]
    short = [crit("gpu_memory", "ok"), crit("kv_free", "ok"),
             Criterion("latency", TITLES["latency"], "not_judged", "too few",
                       {"needs": "needs about 12 more minutes of load at this rate"})]
    none = decide(short, strict=False, error_rate=0.0, max_error_rate=0.01)
    assert none.verdict == "no-verdict" and none.evidence == []
    assert none.missing == ["needs about 12 more minutes of load at this rate"]
    assert none.reasons == ["not enough evidence for GO: needs about 12 more minutes of "
                            "load at this rate"]


def all_ok() -> list[Criterion]:
    return [crit(name, "ok") for name in ("gpu_memory", "kv_free", "latency")]


def test_a_stalled_engine_is_no_go_by_itself_in_the_detectors_words() -> None:
    stall = Stall("stalled", "no token generated for 162 s with 4 running", "m 0", 30.0)
    decision = decide(all_ok(), strict=False, error_rate=0.0, max_error_rate=0.01,
                      stall=stall)
    assert decision.verdict == "no-go"
    assert decision.reasons == ["stalled: m 0: no token generated for 162 s with 4 running"]
    saturated = Stall("saturated", "KV pool pinned full", "m 0", 30.0)
    assert decide(all_ok(), strict=False, error_rate=0.0, max_error_rate=0.01,
                  stall=saturated).verdict == "go"


@pytest.mark.parametrize(("answered", "load_s", "verdict"), [
    (0, 60.0, "no-go"), (0, 59.9, "no-verdict"), (1, 600.0, "go")])
def test_a_server_that_answers_nothing_is_never_go(answered: int, load_s: float,
                                                   verdict: str) -> None:
    requests = Requests(40, answered, 0.0)
    decision = decide(all_ok(), strict=False, error_rate=0.0, max_error_rate=0.01,
                      requests=requests, load_s=load_s)
    assert decision.verdict == verdict
    if verdict == "no-go":
        assert decision.reasons == ["the server answered none of the 40 requests in 1.0 min "
                                    "of load"]


def test_the_worst_stall_of_the_run_is_the_one_judged() -> None:
    data = WatchData()
    assert judge_stall(data).state == "unknown"
    calm, stuck = EngineVerdict("m", "0"), EngineVerdict("m", "1")
    calm.observe_stall(10.0, StallVerdict("ok", "making progress", 10.0))
    stuck.observe_stall(40.0, StallVerdict("saturated", "pinned", 40.0))
    stuck.observe_stall(50.0, StallVerdict("stalled", "no token generated for 12 s", 38.0))
    data.verdicts = {("m", "0"): calm, ("m", "1"): stuck}
    stall = judge_stall(data)
    assert stall == Stall("stalled", "no token generated for 12 s", "m 1", 50.0)
    assert stall.to_json(20.0) == {"state": "stalled", "reason": "no token generated for 12 s",
                                   "engine": "m 1", "first_s": 30.0}


def said(name: str, state: str, reason: str) -> Criterion:
    return Criterion(name, TITLES[name], state, reason)  # type: ignore[arg-type]


def test_the_rule_in_words_names_the_error_limit_and_how_many_soft_signals() -> None:
    lenient = decide(all_ok(), strict=False, error_rate=0.0, max_error_rate=0.025)
    assert lenient.rule == (
        "NO-GO on a confirmed leak (free KV failed), a STALLED engine, more than 2.5% of the "
        "requests failed, or a server that answered none; or when two (--strict: GPU or "
        "latency alone) of GPU memory growing, the slow share rising and free KV at WATCH "
        "hold. GO needs free KV and latency judged; without them, no-verdict")
    strict = decide(all_ok(), strict=True, error_rate=0.0, max_error_rate=0.01)
    assert "more than 1.0% of the requests failed" in strict.rule
    assert "or when any one of GPU memory growing" in strict.rule
    # every verdict carries the rule it was decided by
    leak = [crit("gpu_memory", "ok"), crit("kv_free", "fail"), crit("latency", "ok")]
    assert decide(leak, strict=False, error_rate=0.0, max_error_rate=0.025).rule == lenient.rule
    short = [crit("gpu_memory", "ok"), crit("kv_free", "not_judged"), crit("latency", "ok")]
    assert decide(short, strict=False, error_rate=0.0,
                  max_error_rate=0.025).rule == lenient.rule


def test_every_hard_reason_and_the_soft_signals_in_their_words() -> None:
    criteria = [said("gpu_memory", "fail", "growing: GPU 0 up 2 GiB"),
                said("kv_free", "fail", "falling: 40 blocks kept"),
                said("latency", "fail", "rising: 10 % to 30 %")]
    stall = Stall("stalled", "no token generated for 162 s", None, 30.0)
    decision = decide(criteria, strict=False, error_rate=0.123, max_error_rate=0.01,
                      stall=stall, requests=Requests(40, 0, 0.123), load_s=600.0)
    assert decision.verdict == "no-go"
    assert decision.reasons == [
        "a leak: free KV not falling: failed (falling: 40 blocks kept)",
        "stalled: no token generated for 162 s",  # no engine named: no "None: "
        "12.3% of the requests failed (limit 1.0%)",
        "the server answered none of the 40 requests in 10.0 min of load",
        "GPU memory stable: failed (growing: GPU 0 up 2 GiB)",
        "slow-request share not rising: failed (rising: 10 % to 30 %)"]


def test_free_kv_at_watch_is_named_among_the_two_soft_signals() -> None:
    criteria = [said("gpu_memory", "fail", "growing"), said("kv_free", "watch", "suspect"),
                said("latency", "ok", "")]
    decision = decide(criteria, strict=False, error_rate=0.0, max_error_rate=0.01)
    assert decision.reasons == ["GPU memory stable: failed (growing)",
                                "free KV not falling: WATCH (suspect)"]


def test_a_go_says_each_judged_criterion_and_a_failure_it_overlooked() -> None:
    criteria = [said("gpu_memory", "not_judged", "no GPU"), said("kv_free", "ok", "holding"),
                said("latency", "watch", "creeping up")]
    go = decide(criteria, strict=False, error_rate=0.0, max_error_rate=0.01)
    assert go.reasons == ["free KV and latency judged, no criterion failed"]
    assert go.evidence == ["free KV not falling: OK (holding)",
                           "slow-request share not rising: WATCH (creeping up)"]
    one_soft = [said("gpu_memory", "fail", "growing"), *criteria[1:]]
    assert decide(one_soft, strict=False, error_rate=0.0,
                  max_error_rate=0.01).reasons == ["GPU memory stable: failed"]


def test_a_no_verdict_lists_everything_missing() -> None:
    criteria = [crit("gpu_memory", "ok"),
                said("kv_free", "not_judged", "not judged: never idle"),
                Criterion("latency", TITLES["latency"], "not_judged", "too few",
                          {"needs": "needs about 3 more minutes of load"})]
    decision = decide(criteria, strict=False, error_rate=0.0, max_error_rate=0.01,
                      requests=Requests(12, 0, 0.0), load_s=30.0)
    assert decision.missing == ["not judged: never idle", "needs about 3 more minutes of load",
                                "no request was answered yet (12 sent)"]
    assert decision.reasons == ["not enough evidence for GO: not judged: never idle; needs "
                                "about 3 more minutes of load; no request was answered yet "
                                "(12 sent)"]


def test_a_stall_verdict_with_too_little_to_go_on_names_no_engine() -> None:
    data = WatchData()
    data.verdicts = {("m", "0"): EngineVerdict("m", "0")}  # scraped, no stall verdict yet
    assert judge_stall(data) == Stall("unknown", "the stall verdict had too little to go on")


def test_a_saturated_engine_is_dated_from_its_first_saturation() -> None:
    data = WatchData()
    busy = EngineVerdict(None, "1")
    busy.observe_stall(40.0, StallVerdict("saturated", "KV pool pinned full", 40.0))
    busy.observe_stall(70.0, StallVerdict("saturated", "KV pool pinned full", 70.0))
    data.verdicts = {(None, "1"): busy}  # type: ignore[dict-item]
    assert judge_stall(data) == Stall("saturated", "KV pool pinned full", "1", 40.0)


def test_a_stall_state_kept_without_its_verdict_reads_as_the_state() -> None:
    data = WatchData()
    data.verdicts = {("m", "0"): EngineVerdict("m", "0", stall="stalled", stall_first_t=5.0)}
    assert judge_stall(data) == Stall("stalled", "stalled", "m 0", 5.0)


def test_a_stall_in_json_is_timed_from_the_load_in_milliseconds() -> None:
    assert Stall("stalled", "stuck", "m 0", 50.12345).to_json(20.0)["first_s"] == 30.123
    assert Stall("unknown", "too little").to_json(20.0) == {
        "state": "unknown", "reason": "too little", "engine": None, "first_s": None}


@pytest.mark.parametrize(("errors", "verdict"), [(0.01, "go"), (0.0101, "no-go")])
def test_the_default_error_limit_is_the_documented_1_percent(errors: float, verdict: str) -> None:
    decision = decide(all_ok(), strict=False, error_rate=errors,
                      max_error_rate=DEFAULT_MAX_ERROR_RATE)
    assert decision.verdict == verdict
