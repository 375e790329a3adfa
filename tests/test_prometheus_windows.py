"""Successive refreshes through Prometheus read every stored sample once, late ones too.

A fake API answers the range queries as Prometheus does (samples with timestamps in
(at − range, at], visible only once they have landed), over a clock the test moves."""

from __future__ import annotations

import re
from typing import Any

from kvtop.collect.prometheus import INGEST_LAG_S, PrometheusSource, load_settings

SCRAPE_S = 3.0
LANDS_AFTER_S = 1.5  # a scrape is queryable this long after its timestamp (< INGEST_LAG_S)
RUNNING = "vllm:num_requests_running"


class FakeAPI:
    """Two instances scraped every SCRAPE_S; `running` counts the scrapes."""

    def __init__(self, clock: list[float]) -> None:
        self.clock = clock
        self.requests = 0
        self.values_sent = 0

    def _series(self, instance: str, at: float, span: float) -> dict[str, Any]:
        now = self.clock[0]
        stamps = [i * SCRAPE_S for i in range(1, int(now / SCRAPE_S) + 1)]
        values = [[t, str(t / SCRAPE_S)] for t in stamps
                  if at - span < t <= at and t + LANDS_AFTER_S <= now]
        self.values_sent += len(values)
        return {"metric": {"__name__": RUNNING, "job": "vllm", "instance": instance,
                           "model_name": "m", "engine": "0"}, "values": values}

    async def matrix(self, query: str, at: float) -> list[dict[str, Any]]:
        self.requests += 1
        span = int(re.search(r"\[(\d+)ms\]", query).group(1)) / 1000  # type: ignore[union-attr]
        if query.startswith("up"):
            return []
        return [self._series(instance, at, span) for instance in ("a:1", "b:1")]

    async def call(self, path: str, form: dict[str, str] | None = None, **_: Any) -> Any:
        return {"activeTargets": []}

    async def aclose(self) -> None:
        pass


async def test_refreshes_read_each_sample_once_including_late_ones() -> None:
    clock = [100.0]
    source = PrometheusSource(load_settings("prom:9090"), interval_s=1.0, lookback_s=30.0,
                              clock=lambda: clock[0])
    api = source.api = FakeAPI(clock)  # type: ignore[assignment]
    delivered: dict[str, list[float]] = {"a:1": [], "b:1": []}
    while clock[0] < 160.0:
        for scrape in await source.poll_once():
            assert scrape.ok, scrape.error
            delivered[scrape.target.name or ""].append(scrape.t)
        clock[0] += 1.3  # refreshes out of step with the scrapes
    # Every scrape that had landed by the last refresh, each exactly once, in order;
    # the first refresh went back lookback_s, to now (no earlier read to continue).
    expected = [t for t in (i * SCRAPE_S for i in range(1, 60))
                if 100.0 - 30.0 < t <= clock[0] - 1.3 - INGEST_LAG_S]
    for instance, times in delivered.items():
        assert times == expected[:len(times)], instance
        assert len(times) >= len(expected) - 1  # at most the newest is still to come
        assert times[0] == 72.0
    # Read once: only the first refresh's last INGEST_LAG_S (< one scrape) is read again.
    assert api.values_sent <= sum(len(times) for times in delivered.values()) + 2
