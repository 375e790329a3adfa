"""The verdict over the criteria: the rule at each boundary, a stall, a silent server,
what a GO rests on and what a no-verdict lacks.
"""

from __future__ import annotations

import pytest

from kvtop.derive.verdicts import StallVerdict
from kvtop.derive.worst import EngineVerdict
from kvtop.rehearse.criteria import TITLES, Criterion
from kvtop.rehearse.verdict import Requests, Stall, decide, judge_stall
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
