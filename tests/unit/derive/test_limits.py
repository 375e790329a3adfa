"""What limits an engine: each word at its threshold and a hair either side, in the order
the rules are read (docs/kv-anatomy.md)."""

from __future__ import annotations

import pytest

from kvtop.derive.limits import LimitDetector, LimitParams
from kvtop.derive.stats import EngineStats


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
