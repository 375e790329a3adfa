"""The live sources, through Prometheus: `kvtop snapshot --prometheus`, `kvtop check
--prometheus` and the app's discovery, run in this
process against a fake Prometheus API on 127.0.0.1 (real HTTP): every instance it stores (one
discovery missed too), read through the newest two scrapes; a check past Prometheus's retention
watching the rest live (said on stderr, with the progress line on a terminal), `--until-leak`
ending it at the first leak, the leak thresholds, `--timeout` and `--insecure` used as given,
and a Prometheus that can't be read said in words with exit code 3.

A check through Prometheus over a stored history: the past judged at once, only what the
retention does not hold watched live (the real-server tier is tests/prometheus).

The targets read directly (a FaultServer on 127.0.0.1): a second apart unless told, the wait
between reads the interval less what the read took; by default only kvtop's series asked
for and only a trusted certificate read, as through Prometheus."""

from __future__ import annotations

import asyncio
import io
import json
import re
import socket
import ssl
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import pytest

from kvtop.cli import _discover
from kvtop.collect import live as live_module
from kvtop.collect.adapters import WANTED
from kvtop.collect.exposition import parse
from kvtop.collect.live import DirectSource, PrometheusFeed
from kvtop.collect.prometheus import (
    PrometheusSettings,
    load_settings,
)
from kvtop.collect.source import SourceError
from kvtop.collect.target import Scrape, Target
from kvtop.commands import check as check_command
from kvtop.commands.check import _judge
from kvtop.commands.snapshot import snapshot
from kvtop.derive.leak_params import LeakParams
from kvtop.derive.worst import CheckRun
from kvtop.report import gpus
from tests.fakes.fake_nvml import FakeGpuReader
from tests.fakes.fake_prometheus import INSTANCES, FakePrometheus, answer, series, success
from tests.fakes.faultserver import FaultServer, Request, served_in_thread
from tests.support.paths import fixture_text

LEAKING = "vllm-0.33.0-v1-twin-leaking-idle.txt"  # 827 of 1000 blocks held, nothing running


# An idle engine holding blocks is a LEAK after three scrapes, at once: the fake Prometheus
# stores two (15 s apart) in its history, so the third, read live, is the first leak.
LEAK_ON_THIRD = LeakParams(idle_min_s=1, idle_min_scrapes=3, idle_leak_s=1)


LEAK_ON_SECOND = LeakParams(idle_min_s=1, idle_min_scrapes=2, idle_leak_s=1)


class RetainingPrometheus(FakePrometheus):
    """The fake Prometheus serving ``fixture``'s samples, keeping ``retention`` of history
    (its ``status/runtimeinfo``)."""

    def __init__(self, retention: str, fixture: str | None = None) -> None:
        super().__init__()
        self.retention = retention
        if fixture is not None:
            self.samples = parse(fixture_text(fixture), keep=WANTED).samples

    def respond(self, request: Request) -> tuple[int, bytes]:
        if request.path.endswith("/status/runtimeinfo"):
            return 200, success({"storageRetention": self.retention})
        return super().respond(request)


def run_snapshot_prometheus(settings: PrometheusSettings, *, timeout_s: float | None,
                            insecure: bool, as_json: bool | None, with_gpus: bool) -> int:
    """`kvtop snapshot --prometheus` (its --interval is 1 s by default)."""
    feed = PrometheusFeed(settings, interval_s=1.0, timeout_s=timeout_s, insecure=insecure)
    return snapshot(feed, samples=2, as_json=as_json, with_gpus=with_gpus)


def run_check_prometheus(settings: PrometheusSettings, *, interval_s: float,
                         timeout_s: float | None, insecure: bool, **checking: Any) -> int:
    """`kvtop check --prometheus`."""
    feed = PrometheusFeed(settings, interval_s=interval_s, timeout_s=timeout_s,
                          insecure=insecure)
    return check_command.check(feed, **checking)


def fed(history: StoredHistory) -> PrometheusFeed:
    """A feed whose Prometheus is the stand-in."""
    feed = PrometheusFeed(load_settings("http://prom:9090"))
    feed.source = history  # type: ignore[assignment]
    return feed


class Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


def test_snapshot_through_prometheus_shows_every_instance_it_stores(
        capsys: pytest.CaptureFixture[str]) -> None:
    with served_in_thread(FakePrometheus()) as prom:  # type: ignore[type-var]
        code = run_snapshot_prometheus(load_settings(prom.url), timeout_s=10, insecure=False,
                                       as_json=True, with_gpus=False)
    document = json.loads(capsys.readouterr().out)
    assert code == 0
    assert sorted(t["label"] for t in document["targets"]) == sorted(INSTANCES)
    assert {t["status"] for t in document["targets"]} == {"up"}


def test_a_prometheus_that_cannot_be_read_is_said_with_exit_3(
        capsys: pytest.CaptureFixture[str]) -> None:
    with served_in_thread(FakePrometheus()) as prom:  # type: ignore[type-var]
        prom.hostile["discover"] = answer([1, "x"])
        code = run_snapshot_prometheus(load_settings(prom.url), timeout_s=10, insecure=False,
                                       as_json=True, with_gpus=False)
    out, err = capsys.readouterr()
    assert code == 3 and not out
    assert err.startswith("kvtop snapshot: ") and "not a Prometheus query answer" in err


def test_the_app_opens_on_the_instances_prometheus_knows() -> None:
    with served_in_thread(FakePrometheus()) as prom:  # type: ignore[type-var]
        feed = PrometheusFeed(load_settings(prom.url))
        targets = asyncio.run(_discover(feed))
    assert sorted(t.name or "" for t in targets) == sorted(INSTANCES)
    assert feed.source.api._session is None  # closed: the app runs it again on its own loop


def test_the_table_and_the_gpus_are_asked_for_through_prometheus_too(
        capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(gpus, "read_gpus", FakeGpuReader().read)
    with served_in_thread(FakePrometheus()) as prom:  # type: ignore[type-var]
        for with_gpus in (True, False):
            assert run_snapshot_prometheus(load_settings(prom.url), timeout_s=10,
                                           insecure=False, as_json=False,
                                           with_gpus=with_gpus) == 0
            table = capsys.readouterr().out.splitlines()
            assert table[0].split()[:2] == ["NAME", "MODEL"]
            assert sorted(line.split()[0] for line in table[1:3]) == sorted(INSTANCES)
            # this machine's GPUs (NVML) under the instances, one blank line apart
            assert ("" in table and "NVIDIA H100 80GB HBM3" in table[-1]) == with_gpus


def check(url: str) -> int:
    return run_check_prometheus(load_settings(url), params=None, duration_s=1, interval_s=1,
                                timeout_s=10, insecure=False, until_leak=False, as_json=True)


def test_check_through_prometheus_judges_every_instance_it_stores(
        capsys: pytest.CaptureFixture[str]) -> None:
    with served_in_thread(FakePrometheus()) as prom:  # type: ignore[type-var]
        check(prom.url)
    document = json.loads(capsys.readouterr().out)
    assert sorted(t["target"].rsplit("/", 1)[-1] for t in document["targets"]) == sorted(
        INSTANCES)
    assert all(engine["model"] == "twin-llama" for target in document["targets"]
               for engine in target["engines"])


def test_check_on_a_prometheus_that_cannot_be_read_says_why_with_exit_3(
        capsys: pytest.CaptureFixture[str]) -> None:
    with served_in_thread(FakePrometheus()) as prom:  # type: ignore[type-var]
        prom.hostile["range"] = b"{}"
        code = check(prom.url)
    out, err = capsys.readouterr()
    assert code == 3 and not out
    assert err.startswith("kvtop check: ") and "not a Prometheus API answer" in err


def check_prometheus(url: str, *, duration_s: float, params: LeakParams | None = None,
                     until_leak: bool = False, as_json: bool = True, timeout_s: float = 10,
                     insecure: bool = False) -> int:
    return run_check_prometheus(load_settings(url), params=params, duration_s=duration_s,
                                interval_s=0.05, timeout_s=timeout_s, insecure=insecure,
                                until_leak=until_leak, as_json=as_json)


def test_a_check_longer_than_the_retention_watches_the_rest_live(
        capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch) -> None:
    terminal = Terminal()
    monkeypatch.setattr(sys, "stderr", terminal)
    with served_in_thread(RetainingPrometheus("1s")) as prom:  # type: ignore[type-var]
        check_prometheus(prom.url, duration_s=3, until_leak=True)  # no leak to stop at
    document = json.loads(capsys.readouterr().out)
    shown = terminal.getvalue()
    said = "kvtop check: Prometheus keeps 1 s of history; watching live for the other 2 s\n"
    progress = r"\rkvtop check: \ds of 2s \(\ds left\) · 2 engine\(s\) seen · worst so far: [A-Z]+"
    assert re.match(re.escape(said) + progress, shown), shown
    assert shown.endswith("\r\x1b[K")
    # the history is two scrapes 15 s apart, ending 15 s ago; the live ones are read now
    assert document["duration_s"] > 29
    assert prom.answered["metrics"] >= 5  # every 0.05 s for 2 s: the --interval asked for


def test_until_leak_stops_the_live_watch_at_the_first_leak(
        capsys: pytest.CaptureFixture[str]) -> None:
    with served_in_thread(RetainingPrometheus("1s", LEAKING)) as prom:  # type: ignore[type-var]
        code = check_prometheus(prom.url, duration_s=5, params=LEAK_ON_THIRD, until_leak=True)
    out, err = capsys.readouterr()
    assert code == 1 and json.loads(out)["verdict"] == "leak"
    assert err == "kvtop check: Prometheus keeps 1 s of history; watching live for the " \
                  "other 4 s\n"
    assert prom.answered["metrics"] == 1  # one live read found it, the watch ended there


def test_a_leak_in_the_history_ends_an_until_leak_check_without_watching(
        capsys: pytest.CaptureFixture[str]) -> None:
    with served_in_thread(RetainingPrometheus("1s", LEAKING)) as prom:  # type: ignore[type-var]
        url = prom.url
        code = check_prometheus(url, duration_s=3, params=LEAK_ON_SECOND,
                                until_leak=True, as_json=False)
    out, err = capsys.readouterr()
    lines = out.splitlines()
    assert code == 1 and not err and prom.answered["metrics"] == 0
    assert lines[0].startswith("kvtop check: LEAK (15s judged, ")
    leaks = [line for line in lines[1:] if not line.startswith("          ")]
    assert leaks == [f"  LEAK    {url}#vllm/{instance} twin-llama 0: 827 blocks held "
                     "with nothing running or waiting" for instance in INSTANCES]
    advice = [line.strip() for line in lines[1:] if line.startswith("          ")]
    assert advice == ["leaked 827 blocks (13,232 tokens); next: record it (kvtop record), "
                      "report it upstream with the recording, and restart the server to get "
                      "the blocks back"] * len(INSTANCES)


def test_the_leak_thresholds_asked_for_are_the_ones_judged_by(
        capsys: pytest.CaptureFixture[str]) -> None:
    with served_in_thread(RetainingPrometheus("1d", LEAKING)) as prom:  # type: ignore[type-var]
        judged = []
        for params in (None, LEAK_ON_SECOND):
            code = check_prometheus(prom.url, duration_s=60, params=params)
            judged.append((code, json.loads(capsys.readouterr().out)["verdict"]))
    assert judged == [(3, "unknown"), (1, "leak")]


@contextmanager
def silent_prometheus() -> Iterator[str]:
    """A port that takes the connection and the request and never answers."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        sock.listen(8)
        yield f"http://127.0.0.1:{sock.getsockname()[1]}"


def test_the_timeout_asked_for_is_the_one_waited(capsys: pytest.CaptureFixture[str]) -> None:
    with silent_prometheus() as url:
        snapshot = run_snapshot_prometheus(load_settings(url), timeout_s=0.2, insecure=False,
                                           as_json=True, with_gpus=False)
        snapshot_err = capsys.readouterr().err
        checked = check_prometheus(url, duration_s=60, timeout_s=0.2)
        check_err = capsys.readouterr().err
    said = f"Prometheus {url}: no complete answer within 0.2 s\n"
    assert (snapshot, checked) == (3, 3)
    assert snapshot_err == f"kvtop snapshot: {said}" and check_err == f"kvtop check: {said}"


def test_a_self_signed_prometheus_is_read_only_when_insecure(
        self_signed: ssl.SSLContext, capsys: pytest.CaptureFixture[str]) -> None:
    prom = FakePrometheus()
    prom.server.ssl_context = self_signed
    with served_in_thread(prom):  # type: ignore[type-var]
        assert prom.url.startswith("https://")
        for insecure in (False, True):
            snapshot = run_snapshot_prometheus(load_settings(prom.url), timeout_s=10,
                                               insecure=insecure, as_json=True,
                                               with_gpus=False)
            snapshot_out, snapshot_err = capsys.readouterr()
            check_prometheus(prom.url, duration_s=60, insecure=insecure)
            check_out, check_err = capsys.readouterr()
            if insecure:
                assert snapshot == 0 and not snapshot_err and not check_err
                assert len(json.loads(snapshot_out)["targets"]) == len(INSTANCES)
                assert len(json.loads(check_out)["targets"]) == len(INSTANCES)
            else:
                assert snapshot == 3 and not snapshot_out and not check_out
                assert "TLS certificate not trusted" in snapshot_err
                assert "TLS certificate not trusted" in check_err


def test_an_instance_discovery_missed_is_shown_from_its_scrapes(
        capsys: pytest.CaptureFixture[str]) -> None:
    listed, missed = INSTANCES
    with served_in_thread(FakePrometheus()) as prom:  # type: ignore[type-var]
        prom.hostile["discover"] = answer(
            [{"metric": {"job": "vllm", "instance": listed}, "value": [0, "85"]}], "vector")
        prom.hostile["up"] = answer(
            [series({"__name__": "up", "job": "vllm", "instance": listed}, [[0, "1"]])])
        code = run_snapshot_prometheus(load_settings(prom.url), timeout_s=10, insecure=False,
                                       as_json=True, with_gpus=False)
    targets = json.loads(capsys.readouterr().out)["targets"]
    assert code == 0
    assert [(t["label"], t["status"], t["engines"][0]["model"]) for t in targets] == [
        (listed, "up", "twin-llama"), (missed, "up", "twin-llama")]


class StoredHistory:
    """A PrometheusSource stand-in with a retention and a stored past: records how it is read."""

    def __init__(self, retention_s: float | None) -> None:
        self.target = Target("http://prom:9090#vllm/gpu-1:8000")
        self.window_s = 1800.0  # the leak detector's window, as PrometheusSource has it
        self.retention = retention_s
        self.backfilled: list[float] = []
        self.watched = False

    async def __aenter__(self) -> StoredHistory:
        return self

    async def __aexit__(self, *exc: object) -> None:
        return None

    async def aclose(self) -> None:
        return None

    async def discover(self) -> list[Target]:
        return [self.target]

    async def retention_s(self) -> float | None:
        return self.retention

    async def backfill(self, span_s: float) -> list[Scrape]:
        self.backfilled.append(span_s)
        return [Scrape(self.target, 1_800_000_000.0 + t, failure="down", error="x")
                for t in range(0, int(span_s), 15)]

    async def run(self, on_scrape: Any, *, stop: asyncio.Event) -> None:
        assert self.backfilled  # read live after the history (so never backfilled again)
        self.watched = True
        await stop.wait()


async def test_check_through_prometheus_judges_the_stored_past_at_once() -> None:
    source = StoredHistory(retention_s=15 * 86400)
    run = CheckRun(LeakParams())
    await _judge(run, fed(source), duration_s=3600, until_leak=False, writer=None)
    assert source.backfilled == [3600] and not source.watched
    assert run.to_json()["duration_s"] == 3585.0  # the first and last stored scrape
    unknown = StoredHistory(retention_s=None)  # an API that does not say: assume it fits
    await _judge(CheckRun(), fed(unknown), duration_s=600, until_leak=False, writer=None)
    assert unknown.backfilled == [600] and not unknown.watched


async def test_check_through_prometheus_watches_only_what_retention_does_not_hold() -> None:
    source = StoredHistory(retention_s=60)
    started = asyncio.get_running_loop().time()
    await _judge(CheckRun(), fed(source), duration_s=60.3, until_leak=False, writer=None)
    assert source.backfilled == [60] and source.watched
    assert asyncio.get_running_loop().time() - started >= 0.3  # the other 0.3 s, live


async def test_the_stored_span_is_the_one_asked_or_the_detectors_window_within_retention(
        ) -> None:
    asked = [(None, None), (600.0, None), (None, 3600.0), (3600.0, 3600.0), (3601.0, 3600.0),
             (3599.0, 3600.0)]
    spans = []
    for span_s, retention_s in asked:
        history = StoredHistory(retention_s)
        _, span = await fed(history).stored(span_s)
        spans.append((history.backfilled, span))
    assert spans == [([1800.0], 1800.0), ([600.0], 600.0), ([1800.0], 1800.0),
                     ([3600.0], 3600.0), ([3600.0], 3600.0), ([3599.0], 3599.0)]


async def test_a_direct_source_reads_a_second_apart_waiting_the_rest_of_the_second(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """With no interval given the second read starts a second after the first began, and the
    wait after a read that took 0.3 s is at most the 0.7 s left of that second."""
    waits: list[float] = []
    sleep = asyncio.sleep

    async def recorded(delay: float, *args: Any) -> Any:
        waits.append(delay)
        return await sleep(delay, *args)

    async with FaultServer(mode="slow", delay_s=0.3) as server:
        source = DirectSource([Target.from_spec(server.url())], timeout_s=10)
        monkeypatch.setattr(live_module.asyncio, "sleep", recorded)
        began = time.monotonic()
        scrapes = await source.latest(2)
        monkeypatch.undo()
        await source.aclose()
    reads = [r.at for r in server.requests if r.path.startswith("/metrics")]
    assert [s.failure for s in scrapes] == [None, None] and len(reads) == 2
    assert reads[1] - began >= 1.0
    [waited] = [delay for delay in waits if delay > 0]
    assert waited <= 0.7


async def test_a_source_given_no_settings_asks_for_kvtops_series_and_trusts_no_bad_cert(
        self_signed: ssl.SSLContext) -> None:
    async with FaultServer() as plain, FaultServer(ssl_context=self_signed) as tls:
        source = DirectSource([Target.from_spec(plain.url()), Target.from_spec(tls.url())],
                              interval_s=0.1, timeout_s=10)
        read, refused = await source.latest(1)
        await source.aclose()
    assert read.failure is None and "name[]" in plain.requests[0].query
    assert (refused.failure, tls.hits) == ("down", 0)
    assert refused.error is not None and "TLS certificate not trusted" in refused.error
    prom = FakePrometheus()
    prom.server.ssl_context = self_signed
    with served_in_thread(prom):  # type: ignore[type-var]
        feed = PrometheusFeed(load_settings(prom.url), timeout_s=10)
        try:
            with pytest.raises(SourceError, match="TLS certificate not trusted"):
                await feed.latest(2)
        finally:
            await feed.aclose()
