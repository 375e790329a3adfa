"""What limits an engine: each word at its threshold and a hair either side, in the order
the rules are read (docs/kv-anatomy.md)."""

from __future__ import annotations

import pytest

from kvtop.derive.limits import LimitDetector, LimitParams
from kvtop.derive.stats import EngineStats
from kvtop.derive.verdicts import LimitVerdict


def stats(**values: object) -> EngineStats:
    base: dict[str, object] = dict(model="m", engine="0", t=0.0, running=8.0, waiting=4.0,
                                   waiting_by_reason={"capacity": 4.0, "deferred": 0.0},
                                   kv_usage=0.5, tokens_total=100_000)
    return EngineStats(**(base | values))  # type: ignore[arg-type]


def limit(**values: object) -> str:
    return LimitDetector().update(stats(**values)).limit


@pytest.mark.parametrize("state, word", [
    ("weights_offloaded", "sleeping"), ("discard_all", "sleeping"), ("awake", "kv_capacity"),
    (None, "kv_capacity")])
def test_an_engine_asleep_is_limited_by_sleep_whatever_waits(state: str | None,
                                                            word: str) -> None:
    assert limit(sleep_state=state, kv_usage=0.95) == word


def test_no_waiting_count_is_unknown_and_an_empty_queue_is_none() -> None:
    assert limit(waiting=None) == "unknown"
    assert limit(waiting=0.0) == "none"


@pytest.mark.parametrize("usage, word", [(0.90, "kv_capacity"), (0.8999, "token_budget")])
def test_kv_capacity_from_90_percent_used(usage: float, word: str) -> None:
    assert limit(kv_usage=usage) == word


def test_usage_from_blocks_when_the_fraction_is_not_sent() -> None:
    assert limit(kv_usage=None, blocks_used=90.0, blocks_total=100) == "kv_capacity"


@pytest.mark.parametrize("rate, word", [(1e-9, "kv_capacity"), (0.0, "token_budget"),
                                        (None, "token_budget")])
def test_any_preemption_in_the_window_is_kv_capacity(rate: float | None, word: str) -> None:
    assert limit(preemptions_per_s=rate) == word


@pytest.mark.parametrize("prompt, word", [(50_001.0, "kv_capacity"), (50_000.0, "token_budget")])
def test_free_kv_smaller_than_a_mean_prompt_is_kv_capacity(prompt: float, word: str) -> None:
    # half of 100,000 tokens is free
    assert limit(mean_prompt_tokens=prompt) == word


@pytest.mark.parametrize("deferred, fetching, word", [
    (3.0, 0.0, "kv_capacity"),  # deferred no more than capacity (3 of 7 < 4)
    (5.0, 0.0, "deferred"),
    (5.0, 2.5, "kv_transfer"),  # half of the deferred wait on a KV load
    (5.0, 2.4, "deferred"),
])
def test_deferred_requests_and_kv_transfers(deferred: float, fetching: float, word: str) -> None:
    got = limit(waiting=4.0 + deferred, kv_usage=0.95,
                waiting_by_reason={"capacity": 4.0, "deferred": deferred},
                kv_fetch_by_stage={"in_progress": fetching} if fetching else None)
    assert got == word


def test_without_reasons_all_waiting_reads_as_capacity_and_says_so() -> None:
    verdict = LimitDetector().update(stats(waiting_by_reason=None, kv_usage=0.95))
    assert verdict.limit == "kv_capacity"
    assert verdict.evidence["reasons"] == "not exported: all waiting read as capacity"


def test_llamacpp_waiting_for_a_slot_is_max_sequences() -> None:
    assert limit(waiting_by_reason={"slots": 2.0}, kv_usage=None) == "max_sequences"


@pytest.mark.parametrize("running, word", [(32.0, "max_sequences"), (31.0, "token_budget")])
def test_running_at_a_known_max_num_seqs(running: float, word: str) -> None:
    detector = LimitDetector(LimitParams(max_num_seqs=32))
    assert detector.update(stats(running=running)).limit == word


def test_a_running_count_held_for_three_scrapes_with_a_queue_is_max_sequences() -> None:
    detector = LimitDetector()
    words = [detector.update(stats(running=r)).limit for r in (30.0, 32.0, 32.0, 32.0)]
    assert words == ["token_budget", "token_budget", "token_budget", "max_sequences"]
    # a scrape with nothing waiting breaks the plateau
    detector = LimitDetector()
    detector.update(stats(running=32.0))
    detector.update(stats(running=32.0, waiting=0.0))
    assert detector.update(stats(running=32.0)).limit == "token_budget"


def test_without_kv_usage_and_no_ceiling_the_limit_is_unknown() -> None:
    verdict = LimitDetector().update(stats(kv_usage=None, tokens_total=None))
    assert verdict.limit == "unknown" and "no KV usage" in verdict.reason


def test_the_reason_names_the_numbers() -> None:
    verdict = LimitDetector().update(stats(kv_usage=0.97))
    assert verdict.reason == "KV pool 97% used, 4 waiting"
    assert verdict.evidence == {"waiting": 4.0, "capacity": 4.0, "deferred": 0.0,
                                "kv_usage": 0.97}


def verdict(**values: object) -> LimitVerdict:
    return LimitDetector().update(stats(**values))


# the evidence every rule after the queue's gets: what waits and why
QUEUE: dict[str, float | str] = {"waiting": 4.0, "capacity": 4.0, "deferred": 0.0}
DEFERRED: dict[str, float | str] = {"waiting": 9.0, "capacity": 4.0, "deferred": 5.0}


@pytest.mark.parametrize("values, expected", [
    ({"sleep_state": "weights_offloaded"},
     LimitVerdict("sleeping", "asleep (weights offloaded, KV pool discarded)",
                  {"sleep_state": "weights_offloaded"})),
    ({"sleep_state": "discard_all"},
     LimitVerdict("sleeping", "asleep (all GPU memory discarded)",
                  {"sleep_state": "discard_all"})),
    ({"waiting": None}, LimitVerdict("unknown", "the server exports no waiting count", {})),
    ({"waiting": 0.0}, LimitVerdict("none", "nothing waits", {"waiting": 0.0})),
    ({"waiting": 9.0, "waiting_by_reason": {"capacity": 4.0, "deferred": 5.0},
      "kv_fetch_by_stage": {"in_progress": 3.0}},
     LimitVerdict("kv_transfer", "3 of 9 waiting requests wait on a KV transfer",
                  DEFERRED | {"kv_fetching": 3.0})),
    ({"waiting": 9.0, "waiting_by_reason": {"capacity": 4.0, "deferred": 5.0}},
     LimitVerdict("deferred", "5 of 9 waiting requests are deferred (LoRA budget, KV "
                  "transfer, blocked)", DEFERRED)),
    ({"waiting": 1.0, "waiting_by_reason": {"slots": 1.0}, "kv_usage": None},
     LimitVerdict("max_sequences", "1 requests wait for a free slot",
                  {"waiting": 1.0, "capacity": 0.0, "deferred": 0.0})),
    ({"kv_usage": 0.95, "waiting_by_reason": None},
     LimitVerdict("kv_capacity", "KV pool 95% used, 4 waiting",
                  {"waiting": 4.0, "reasons": "not exported: all waiting read as capacity",
                   "kv_usage": 0.95})),
    ({"kv_usage": None, "blocks_used": 90.0, "blocks_total": 100},
     LimitVerdict("kv_capacity", "KV pool 90% used, 4 waiting", QUEUE | {"kv_usage": 0.9})),
    ({"preemptions_per_s": 0.5},
     LimitVerdict("kv_capacity", "preempting 0.5/s, 4 waiting",
                  QUEUE | {"kv_usage": 0.5, "preemptions_per_s": 0.5})),
    ({"mean_prompt_tokens": 50_001.0},
     LimitVerdict("kv_capacity", "50,000 tokens of KV free, less than a mean prompt (50,001), "
                  "4 waiting", QUEUE | {"kv_usage": 0.5, "free_tokens": 50_000.0,
                                        "mean_prompt_tokens": 50_001.0})),
    ({"kv_usage": None, "tokens_total": None},
     LimitVerdict("unknown", "4 waiting; the server exports no KV usage", QUEUE)),
    ({}, LimitVerdict("token_budget", "KV pool 50% used and the running count moving, "
                      "4 waiting: the step's token budget", QUEUE | {"kv_usage": 0.5})),
])
def test_each_limit_says_its_numbers_and_keeps_its_evidence(values: dict[str, object],
                                                            expected: LimitVerdict) -> None:
    assert verdict(**values) == expected


def test_running_at_a_known_max_num_seqs_says_so_with_its_evidence() -> None:
    got = LimitDetector(LimitParams(max_num_seqs=32)).update(stats(running=32.0))
    assert got == LimitVerdict("max_sequences", "32 running (held there), 4 waiting",
                               QUEUE | {"kv_usage": 0.5, "running": 32.0})


@pytest.mark.parametrize("waiting, word", [(0.0, "none"), (1.0, "token_budget")])
def test_one_request_waiting_is_a_queue(waiting: float, word: str) -> None:
    assert limit(waiting=waiting, waiting_by_reason={"capacity": waiting}) == word


@pytest.mark.parametrize("slots, word", [(1.0, "max_sequences"), (0.0, "token_budget")])
def test_one_request_waiting_for_a_slot_is_max_sequences(slots: float, word: str) -> None:
    assert limit(waiting_by_reason={"capacity": 4.0, "slots": slots}) == word


def test_without_reasons_a_fraction_waiting_is_capacity_never_deferred() -> None:
    """An averaged waiting gauge below one request: none of it is read as deferred."""
    assert limit(waiting=0.5, waiting_by_reason=None) == "token_budget"


def test_a_block_count_without_the_used_blocks_is_no_usage() -> None:
    assert limit(kv_usage=None, blocks_used=None, blocks_total=100) == "unknown"


def test_without_the_pool_size_in_tokens_a_mean_prompt_is_not_compared() -> None:
    assert limit(tokens_total=None, mean_prompt_tokens=1e9) == "token_budget"


def test_a_pool_of_no_tokens_has_none_free() -> None:
    got = verdict(kv_usage=0.0, tokens_total=0, mean_prompt_tokens=100.0)
    assert got.reason == "0 tokens of KV free, less than a mean prompt (100), 4 waiting"
    assert got.evidence["free_tokens"] == 0.0


def test_a_max_num_seqs_of_one_is_reached_by_one_running() -> None:
    detector = LimitDetector(LimitParams(max_num_seqs=1))
    assert detector.update(stats(running=1.0)).limit == "max_sequences"


@pytest.mark.parametrize("most", [None, 32])
def test_nothing_running_or_no_running_count_is_no_ceiling(most: int | None) -> None:
    """Nothing running for three scrapes with a queue is not a plateau at a scheduler limit."""
    for running in (0.0, None):
        detector = LimitDetector(LimitParams(max_num_seqs=most))
        words = [detector.update(stats(running=running)).limit for _ in range(3)]
        assert words == ["token_budget"] * 3
