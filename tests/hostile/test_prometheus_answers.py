"""Malformed and oversized answers from a (fake, real-HTTP) Prometheus API: ``kvtop snapshot
--prometheus`` and ``check --prometheus`` give a clean status and exit code, and the source
the app runs keeps going once the answers are good again. Each answer once crashed the
commands with a traceback or ended the app's source without a word."""

from __future__ import annotations

import asyncio
import json
import os
import sys
from typing import Any

import pytest

from kvtop.collect.prometheus import (
    MAX_ANSWER_BYTES,
    PrometheusSource,
    load_settings,
    target_for,
)
from kvtop.collect.target import Scrape
from kvtop.derive.tracker import TargetTracker
from tests.fakes.fake_prometheus import INSTANCES, JOB, FakePrometheus, answer, series, success

METRIC = {"__name__": "vllm:num_requests_running", "job": JOB, "instance": INSTANCES[0],
          "model_name": "m", "engine": "0"}

MALFORMED = {  # what a broken or hostile Prometheus (or a proxy before it) answers
    "data a list": success([]),
    "result not a list": success({"resultType": "matrix", "result": {"a": 1}}),
    "result of non-objects": answer([1, "x", None]),
    "metric a list": answer([series(["job", JOB], [[1.0, "1"]])]),
    "a label not a string": answer([series({**METRIC, "engine": 0}, [[1.0, "1"]])]),
    "a label a list": answer([series({**METRIC, "engine": ["0"]}, [[1.0, "1"]])]),
    "values not a list": answer([series(METRIC, "1")]),
    "3-element values": answer([series(METRIC, [[1.0, "1", 2]])]),
    "a time not a number": answer([series(METRIC, [["abc", "1"]])]),
    "a time a list": answer([series(METRIC, [[[1], "1"]])]),
    "a 400-digit time": b'{"status":"success","data":{"resultType":"matrix","result":[{"metric'
                        b'":{},"values":[[' + b"9" * 400 + b',"1"]]}]}}',
    "nested 100,000 deep": b"[" * 100_000 + b"]" * 100_000,
}


async def kvtop(*args: str, timeout: float = 120) -> tuple[int, str, str]:
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "kvtop", *args, stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE, env={**os.environ})
    out, err = await asyncio.wait_for(proc.communicate(), timeout)
    return proc.returncode or 0, out.decode(), err.decode()


def statuses(out: str) -> dict[str, tuple[str, str]]:
    document: dict[str, Any] = json.loads(out)
    return {t["label"]: (t["status"], t["error"] or "") for t in document["targets"]}


@pytest.mark.parametrize("name", list(MALFORMED))
async def test_a_malformed_refresh_is_bad_payload_for_its_instances(name: str) -> None:
    async with FakePrometheus() as prom:
        prom.hostile["metrics"] = MALFORMED[name]
        code, out, err = await kvtop("snapshot", "--prometheus", prom.url, "--json", "--no-gpu")
    assert code == 3 and "Traceback" not in err, err
    shown = statuses(out)
    assert set(shown) == set(INSTANCES)
    for status, error in shown.values():  # JSON that does not decode is no API answer
        assert status == "bad_payload", (name, status, error)
        assert "not a Prometheus query answer" in error or "not a Prometheus API answer" in error


@pytest.mark.parametrize("kind", ["discover", "up"])
async def test_a_malformed_discovery_or_up_answer_is_a_clean_error(kind: str) -> None:
    async with FakePrometheus() as prom:
        prom.hostile[kind] = MALFORMED["result of non-objects"]
        code, out, err = await kvtop("snapshot", "--prometheus", prom.url, "--json", "--no-gpu")
    # discovery reads both: nothing is known yet, so the command says why it has nothing
    assert code == 3 and "Traceback" not in err, err
    assert "not a Prometheus query answer" in err and not out


async def test_a_malformed_targets_answer_only_loses_the_detail() -> None:
    """/api/v1/targets only adds Prometheus's own scrape error to 'down'."""
    async with FakePrometheus() as prom:
        prom.hostile["targets"] = success({"activeTargets": [1, {"labels": [], "lastError": 5}]})
        source = PrometheusSource(load_settings(prom.url))
        async with source:
            assert await source._scrape_errors(0.0) == {}


async def test_check_on_a_malformed_backfill_is_a_clean_error() -> None:
    async with FakePrometheus() as prom:
        prom.hostile["range"] = MALFORMED["3-element values"]
        code, _, err = await kvtop("check", "--prometheus", prom.url, "--duration", "1",
                                   "--json")
    assert code == 3 and "Traceback" not in err, err
    assert "not a Prometheus query answer" in err


async def test_the_source_goes_on_after_malformed_answers() -> None:
    """The app's source: a refresh that can't be read fails its instances and the next
    refresh, good again, is read. It once ended the source, and the app with it went on
    showing the last values forever."""
    async with FakePrometheus() as prom:
        source = PrometheusSource(load_settings(prom.url), interval_s=0.05)
        got: list[Scrape] = []
        stop = asyncio.Event()

        def on_scrape(scrape: Scrape) -> None:
            got.append(scrape)
            if len(got) == 2:  # the instances are known: now the answers go bad
                prom.hostile["metrics"] = MALFORMED["metric a list"]
            if sum(s.failure == "bad_payload" for s in got) >= 4:
                prom.hostile.clear()
            if prom.answered["metrics"] > 4 and not prom.hostile and got[-1].ok:
                stop.set()

        async with source:
            await source.discover()
            await asyncio.wait_for(source.run(on_scrape, stop=stop, backfill=False), 60)
    failures = [s for s in got if not s.ok]
    assert len(failures) >= 4 and all("not a Prometheus query answer" in (s.error or "")
                                      for s in failures)
    assert got[-1].ok and got[-1].samples is not None


async def test_an_answer_over_the_cap_is_refused() -> None:
    """A 1 GiB cap let a 210 MB answer take 1.3 GB; the cap is now what a large fleet needs."""
    pad = b"x" * (MAX_ANSWER_BYTES + 1)
    huge = answer([series({**METRIC, "pad": "PAD"}, [[1.0, "1"]])]).replace(b"PAD", pad)
    async with FakePrometheus() as prom:
        prom.hostile["metrics"] = huge
        code, out, err = await kvtop("snapshot", "--prometheus", prom.url, "--json", "--no-gpu")
    assert code == 3, err
    for status, error in statuses(out).values():
        assert status == "bad_payload" and "size cap" in error


async def test_a_bad_value_through_prometheus_fails_only_its_instance() -> None:
    """The tracker's exception once ended the source: the whole fleet stopped updating."""
    async with FakePrometheus() as prom:
        bad, good = INSTANCES
        prom.config_of[bad] = {"num_gpu_blocks": "inf"}
        code, out, err = await kvtop("snapshot", "--prometheus", prom.url, "--json", "--no-gpu")
        assert code == 3 and "Traceback" not in err, err
        shown = statuses(out)
        assert shown[good] == ("up", "")
        assert shown[bad][0] == "bad_payload" and "num_gpu_blocks='inf'" in shown[bad][1]

        trackers = {i: TargetTracker(target_for(load_settings(prom.url), JOB, i))
                    for i in INSTANCES}
        stop = asyncio.Event()
        seen: list[Scrape] = []

        def on_scrape(scrape: Scrape) -> None:
            trackers[scrape.target.name or ""].update(scrape)
            seen.append(scrape)
            if sum(s.target.name == good for s in seen) >= 4:
                stop.set()

        async with PrometheusSource(load_settings(prom.url), interval_s=0.05) as source:
            await source.discover()
            await asyncio.wait_for(source.run(on_scrape, stop=stop, backfill=False), 60)
    assert trackers[good].state.status == "up"
    assert trackers[bad].state.status == "bad_payload"
