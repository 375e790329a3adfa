"""Prometheus source pieces that need no Prometheus: selectors, series -> samples,
settings, and the rules' thresholds (the real-server tier is tests/prometheus)."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from kvtop.collect.adapters import adapt, read_exposition
from kvtop.collect.exposition import Exposition, to_text
from kvtop.collect.prometheus import (
    group_scrapes,
    load_settings,
    parse_retention,
    selector_matchers,
    target_for,
    vector_selector,
)
from kvtop.collect.target import Scrape, Target
from kvtop.commands.prometheus import _judge
from kvtop.derive.leak import LeakParams
from kvtop.derive.worst import CheckRun
from kvtop.report.rules import render_rules


def test_selector_matchers_are_merged_into_the_fleet_query() -> None:
    assert selector_matchers("") == ""
    assert selector_matchers(' {namespace="prod", pod=~"a.*",} ') == 'namespace="prod", pod=~"a.*"'
    query = vector_selector({"vllm:b", "vllm:a"}, '{namespace="prod"}')
    assert query == '{__name__=~"vllm:a|vllm:b", namespace="prod"}'
    for bad in ('namespace="prod"', '{__name__="up"}'):
        with pytest.raises(ValueError):
            selector_matchers(bad)


def test_series_become_one_scrape_per_instance_and_timestamp() -> None:
    result = [
        {"metric": {"__name__": "vllm:kv_cache_usage_perc", "job": "j", "instance": "a:1",
                    "model_name": 'm"x\\', "engine": "0"},
         "values": [[100.5, "0.25"], [101.5, "0.5"]]},
        {"metric": {"__name__": "vllm:num_requests_running", "job": "j", "instance": "a:1",
                    "model_name": 'm"x\\', "engine": "0"},
         "values": [[100.5, "3"]]},
        {"metric": {"__name__": "vllm:num_requests_running", "job": "j", "instance": "b:1",
                    "model_name": "m", "engine": "0"},
         "values": [[100.7, "NaN"]]},
    ]
    grouped = group_scrapes(result)
    assert set(grouped) == {("j", "a:1"), ("j", "b:1")}
    assert sorted(grouped["j", "a:1"]) == [100.5, 101.5]
    samples = Exposition(grouped["j", "a:1"][100.5])
    (engine,) = adapt(samples).engines
    assert (engine.model, engine.kv_usage, engine.running) == ('m"x\\', 0.25, 3.0)
    # Written out (snapshot files, recordings) they read back the same, escapes and all.
    assert read_exposition(to_text(samples)).engines == adapt(samples).engines
    (nan,) = grouped["j", "b:1"][100.7]
    assert nan.labels == {"model_name": "m", "engine": "0"} and nan.value != nan.value


def test_settings_reject_credentials_and_bad_selectors() -> None:
    settings = load_settings("prom:9090/", selector='{job="vllm"}')
    assert settings.url == "http://prom:9090"
    target = target_for(settings, "vllm", "10.0.0.1:8000")
    assert (target.url, target.label, target.group) == (
        "http://prom:9090#vllm/10.0.0.1:8000", "10.0.0.1:8000", "vllm")
    for url, selector in (("http://u:p@prom:9090", ""), ("prom:9090", "job=vllm")):
        with pytest.raises(ValueError):
            load_settings(url, selector=selector)


def test_rules_carry_the_thresholds() -> None:
    params = LeakParams(idle_leak_s=90, idle_min_s=15, residual_min_frac=0.002, window_s=3600,
                        bucket_s=120, leak_rise_frac=0.03)
    text = render_rules(params, '{namespace="prod"}')
    assert 'kvtop:kv_idle_residual:ratio > 0.002"' in text
    assert "for: 90s" in text and "for: 15s" in text
    assert "[3600s:120s]" in text and ">= 0.03" in text
    assert 'vllm:kv_cache_usage_perc{namespace=\\"prod\\"}' in text


@pytest.mark.parametrize(("text", "seconds"), [
    ("15d", 15 * 86400), ("1w2d", 9 * 86400), ("2h30m", 9000), ("15d or 10GiB", 15 * 86400),
    ("10GiB", None), ("", None), ("banana", None), ("1y", 365 * 86400),
])
def test_prometheus_retention_is_read_from_its_runtime_info(text: str,
                                                            seconds: float | None) -> None:
    assert parse_retention(text) == seconds


class StoredHistory:
    """A PrometheusSource stand-in with a retention and a stored past: records how it is read."""

    def __init__(self, retention_s: float | None) -> None:
        self.target = Target("http://prom:9090#vllm/gpu-1:8000")
        self.retention = retention_s
        self.backfilled: list[float] = []
        self.watched = False

    async def __aenter__(self) -> StoredHistory:
        return self

    async def __aexit__(self, *exc: object) -> None:
        return None

    async def discover(self) -> list[Target]:
        return [self.target]

    async def retention_s(self) -> float | None:
        return self.retention

    async def backfill(self, span_s: float) -> list[Scrape]:
        self.backfilled.append(span_s)
        return [Scrape(self.target, 1_800_000_000.0 + t, failure="down", error="x")
                for t in range(0, int(span_s), 15)]

    async def run(self, on_scrape: Any, *, stop: asyncio.Event, backfill: bool) -> None:
        assert not backfill
        self.watched = True
        await stop.wait()


async def test_check_through_prometheus_judges_the_stored_past_at_once() -> None:
    source = StoredHistory(retention_s=15 * 86400)
    run = CheckRun(LeakParams())
    await _judge(run, source, duration_s=3600, until_leak=False)  # type: ignore[arg-type]
    assert source.backfilled == [3600] and not source.watched
    assert run.to_json()["duration_s"] == 3585.0  # the first and last stored scrape
    unknown = StoredHistory(retention_s=None)  # an API that does not say: assume it fits
    await _judge(CheckRun(), unknown, duration_s=600, until_leak=False)  # type: ignore[arg-type]
    assert unknown.backfilled == [600] and not unknown.watched


async def test_check_through_prometheus_watches_only_what_retention_does_not_hold() -> None:
    source = StoredHistory(retention_s=60)
    started = asyncio.get_running_loop().time()
    await _judge(CheckRun(), source, duration_s=60.3, until_leak=False)  # type: ignore[arg-type]
    assert source.backfilled == [60] and source.watched
    assert asyncio.get_running_loop().time() - started >= 0.3  # the other 0.3 s, live
