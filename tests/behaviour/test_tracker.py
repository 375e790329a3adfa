"""What a target's row shows as its scrapes come and go: the last error only while it
fails, a restart of any of its engines, the last values for ``stale_after_s`` after a
failed read, and a history as long as asked for (15 minutes unless told)."""

from __future__ import annotations

from kvtop.collect.target import Scrape, Target
from kvtop.derive.tracker import TargetTracker

TARGET = Target.from_spec("127.0.0.1:8000")


def body(finished: dict[str, int]) -> str:
    """A vLLM server with one engine per key, each with its finished-request count."""
    lines = []
    for engine, count in finished.items():
        labels = f'engine="{engine}",model_name="m"'
        lines += [f"vllm:num_requests_running{{{labels}}} 1.0",
                  f"vllm:kv_cache_usage_perc{{{labels}}} 0.25",
                  f'vllm:request_success_total{{{labels},finished_reason="stop"}} {count}.0']
    return "\n".join(lines) + "\n"


def good(t: float, **finished: int) -> Scrape:
    return Scrape(TARGET, t, body=body(finished or {"0": 10}))


def failed(t: float) -> Scrape:
    return Scrape(TARGET, t, failure="down", error="connection refused")


def test_the_error_goes_when_the_target_answers_again() -> None:
    tracker = TargetTracker(TARGET, stale_after_s=5)
    tracker.update(good(100.0))
    state = tracker.update(failed(200.0))
    assert (state.status, state.error) == ("down", "connection refused")
    state = tracker.update(good(210.0))
    assert (state.status, state.error) == ("up", None)


def test_a_restart_of_any_engine_is_the_target_restarting() -> None:
    tracker = TargetTracker(TARGET)
    tracker.update(Scrape(TARGET, 1.0, body=body({"0": 50, "1": 50, "2": 50})))
    # engine 0's counter went back (restarted); engines 1 and 2, read after it, did not
    state = tracker.update(Scrape(TARGET, 2.0, body=body({"0": 1, "1": 60, "2": 60})))
    assert [e.restarted for e in state.engines] == [True, False, False]
    assert state.restarted_at == 2.0
    # and only the middle one
    tracker.update(Scrape(TARGET, 3.0, body=body({"0": 2, "1": 1, "2": 70})))
    assert tracker.state.restarted_at == 3.0


def test_the_last_values_stay_up_to_stale_after_s_after_a_failed_read() -> None:
    tracker = TargetTracker(TARGET, stale_after_s=30)
    tracker.update(good(100.0))
    state = tracker.update(failed(130.0))  # exactly stale_after_s later: still shown
    assert state.status == "stale" and state.engines
    state = tracker.update(failed(130.5))
    assert state.status == "down" and state.engines == []


def test_history_keeps_the_span_asked_for() -> None:
    tracker = TargetTracker(TARGET, history_s=120)
    for t in range(0, 600, 10):
        tracker.update(good(float(t), **{"0": t}))
    times = [s.t for s in tracker.history[("m", "0")]]
    assert times[0] == 590.0 - 120 and times[-1] == 590.0


def test_history_is_fifteen_minutes_unless_told() -> None:
    tracker = TargetTracker(TARGET)
    for t in range(0, 3600, 60):
        tracker.update(good(float(t), **{"0": t}))
    times = [s.t for s in tracker.history[("m", "0")]]
    assert times[-1] - times[0] == 15 * 60
