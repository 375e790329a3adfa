"""LoRA adapters from vLLM's ``lora_requests_info``, on a real scrape with the gauge written
the way vLLM 0.33 writes it (vllm/v1/metrics/loggers.py): prometheus_client's Gauge with
labels max_lora, waiting_lora_adapters and running_lora_adapters (names joined by ","),
set to the current time at every stats interval; a label set, once made, is never removed,
so a scrape carries every set the server ever had, the newest with the latest time."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Gauge, generate_latest

from kvtop.collect.adapters import read_exposition
from kvtop.collect.adapters.vllm import NAMES
from kvtop.collect.reading import LoraInfo
from kvtop.collect.target import Scrape, Target
from kvtop.derive.tracker import TargetTracker
from tests.paths import fixture_text

UNDER_LOAD = "vllm-0.33.0-v1-twin-under-load.txt"
T0 = 1_767_225_600.0


def lora_gauge_text(history: list[tuple[list[str], list[str]]], max_loras: int = 4) -> str:
    """The gauge after vLLM logged each (running, waiting) adapter set in turn."""
    registry = CollectorRegistry()
    gauge = Gauge("vllm:lora_requests_info", "Running stats on lora requests.",
                  labelnames=["max_lora", "waiting_lora_adapters", "running_lora_adapters"],
                  registry=registry, multiprocess_mode="sum")
    for second, (running, waiting) in enumerate(history):
        # set_to_current_time() is set(time.time()): explicit times keep the order certain
        gauge.labels(max_lora=max_loras, waiting_lora_adapters=",".join(waiting),
                     running_lora_adapters=",".join(running)).set(T0 + second)
    return generate_latest(registry).decode()


def scrape_with_lora(history: list[tuple[list[str], list[str]]]) -> str:
    return fixture_text(UNDER_LOAD) + lora_gauge_text(history)


def test_the_newest_label_set_is_what_runs_now() -> None:
    text = scrape_with_lora([
        (["sql-lora"], []),
        (["sql-lora", "chat-lora"], ["summarise-lora"]),
        (["chat-lora"], []),  # now: the other two finished
    ])
    assert text.count("vllm:lora_requests_info{") == 3  # old label sets stay in the scrape
    [engine] = read_exposition(text).engines
    assert engine.lora == LoraInfo(4, ("chat-lora",), ())


def test_several_adapters_running_and_waiting() -> None:
    [engine] = read_exposition(scrape_with_lora([
        (["a"], []), (["a", "b", "c"], ["d", "e"])])).engines
    assert engine.lora == LoraInfo(4, ("a", "b", "c"), ("d", "e"))


def test_no_lora_when_the_server_has_it_off() -> None:
    [engine] = read_exposition(fixture_text(UNDER_LOAD)).engines  # no series at all
    assert engine.lora is None
    # V0 always wrote the gauge: max_lora 0 and no adapter is LoRA off, not "0 adapters"
    [v0] = read_exposition(fixture_text("vllm-0.7.x-v0-aibrix-runtime-doc.txt")).engines
    assert v0.lora is None


def test_lora_reaches_the_engine_stats_and_the_narrowed_read_asks_for_it() -> None:
    assert "vllm:lora_requests_info" in NAMES  # prometheus_client's name[] filter keeps it
    tracker = TargetTracker(Target.from_spec("h:8000"))
    tracker.update(Scrape(tracker.state.target, T0,
                          scrape_with_lora([(["sql-lora"], ["chat-lora"])])))
    [stats] = tracker.state.engines
    assert stats.lora == LoraInfo(4, ("sql-lora",), ("chat-lora",))
