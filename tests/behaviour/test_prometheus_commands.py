"""`kvtop snapshot --prometheus` and the app's discovery, run in this process against a fake
Prometheus API on 127.0.0.1 (real HTTP): every instance it stores, read through the newest
two scrapes, and a Prometheus that can't be read said in words with exit code 3."""

from __future__ import annotations

import asyncio
import json

import pytest

from kvtop.collect.prometheus import PrometheusSource, load_settings
from kvtop.collect.target import Scrape, Target
from kvtop.headless import gpus
from kvtop.headless.prometheus_commands import (
    discover_targets,
    latest_per_target,
    run_check_prometheus,
    run_snapshot_prometheus,
)
from tests.fakes.fake_nvml import FakeGpuReader
from tests.faultserver import served_in_thread
from tests.hostile.fakeprom import INSTANCES, FakePrometheus, answer


def test_the_newest_scrapes_of_each_target_in_time_order() -> None:
    a, b = Target.from_spec("a:1"), Target.from_spec("b:1")
    scrapes = [Scrape(a, 3.0, ""), Scrape(b, 1.0, ""), Scrape(a, 1.0, ""), Scrape(a, 2.0, ""),
               Scrape(b, 4.0, "")]
    kept = latest_per_target(scrapes, 2)
    assert [(s.target.url, s.t) for s in kept] == [
        (b.url, 1.0), (a.url, 2.0), (a.url, 3.0), (b.url, 4.0)]
    assert [s.t for s in latest_per_target(scrapes, 1)] == [3.0, 4.0]


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
        source = PrometheusSource(load_settings(prom.url))
        targets = asyncio.run(discover_targets(source))
    assert sorted(t.name or "" for t in targets) == sorted(INSTANCES)
    assert source.api._session is None  # closed: the app runs it again on its own loop


def test_the_table_and_the_gpus_are_asked_for_through_prometheus_too(
        capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(gpus, "read_gpus", FakeGpuReader(unavailable="no NVML here").read)
    with served_in_thread(FakePrometheus()) as prom:  # type: ignore[type-var]
        for with_gpus in (True, False):
            assert run_snapshot_prometheus(load_settings(prom.url), timeout_s=10,
                                           insecure=False, as_json=False,
                                           with_gpus=with_gpus) == 0
            table = capsys.readouterr().out.splitlines()
            assert table[0].split()[:2] == ["NAME", "MODEL"]
            assert sorted(line.split()[0] for line in table[1:3]) == sorted(INSTANCES)
            assert ("GPUs from nvml" in table[-1] and "no NVML here" in table[-1]) == with_gpus


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
