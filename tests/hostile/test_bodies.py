"""Hostile and broken /metrics bodies served by real HTTP servers on 127.0.0.1, read the way
users read them (``kvtop snapshot`` in a subprocess, the poller, the app under Pilot), with
a healthy server beside them that must still be read right.

Each body once crashed a command, froze a row or the whole event loop, or showed a number
no server meant (docs/security.md, "Bodies and parsing")."""

from __future__ import annotations

import asyncio
import json
import os
import sys
import time
from contextlib import AsyncExitStack
from typing import Any

from kvtop.collect.adapters import read_exposition
from kvtop.collect.poller import READ_SHARE, Poller
from kvtop.collect.source import read_scrape
from kvtop.collect.target import Scrape, Target
from kvtop.derive.tracker import TargetTracker
from kvtop.ui.app import AppConfig, KvtopApp
from tests.fakes.fake_nvml import FakeGpuReader
from tests.fakes.faultserver import FaultServer
from tests.scenarios import bodies
from tests.scenarios.app import until
from tests.support.paths import fixture_text

LOAD = "vllm-0.33.0-v1-twin-under-load.txt"


async def kvtop(*args: str, timeout: float = 120) -> tuple[int, dict[str, Any], str, float]:
    """``kvtop <args> --json`` as a user runs it: exit code, document, stderr, seconds."""
    started = time.monotonic()
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "kvtop", *args, "--json", stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE, env={**os.environ})
    out, err = await asyncio.wait_for(proc.communicate(), timeout)
    return proc.returncode or 0, json.loads(out), err.decode(), time.monotonic() - started


async def serving(stack: AsyncExitStack, body: str | bytes) -> str:
    """The /metrics URL of a server (open until ``stack`` closes) that serves ``body``."""
    data = body.encode() if isinstance(body, str) else body
    return (await stack.enter_async_context(FaultServer(bodies=[data]))).url()


def by_url(document: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {target["target"]: target for target in document["targets"]}


def healthy_is_right(target: dict[str, Any]) -> None:
    """The vLLM 0.33 under-load scrape, read right: 588 of 599 blocks, 30 running."""
    assert target["status"] == "up", target["error"]
    (engine,) = target["engines"]
    assert engine["kv"]["blocks_total"] == 599 and engine["kv"]["blocks_used"] == 588.0
    assert engine["requests"]["running"] == 30


# --- values that don't convert ----------------------------------------------------------------

REFUSED_VALUES = {  # body -> what the error must name
    bodies.bad_config("num_gpu_blocks", "inf"): "num_gpu_blocks='inf'",
    bodies.bad_config("num_gpu_blocks", "1e308"): "num_gpu_blocks='1e308'",
    bodies.bad_config("block_size", "inf"): "block_size='inf'",
    bodies.trtllm_infinite_pool(): "max=inf",
}
ODD_ENGINES = ("²", "9" * 5000)  # labels, not numbers: read like any other name


async def test_values_that_do_not_convert_are_bad_payload_beside_a_healthy_target() -> None:
    async with AsyncExitStack() as stack:
        healthy = await serving(stack, fixture_text(LOAD))
        refused = {await serving(stack, body): named for body, named in REFUSED_VALUES.items()}
        odd = {await serving(stack, bodies.vllm_body(engine=e)): e for e in ODD_ENGINES}
        code, doc, err, _ = await kvtop("snapshot", healthy, *refused, *odd,
                                        "--samples", "1", "--no-gpu")
    assert code == 3 and "Traceback" not in err, err
    targets = by_url(doc)
    healthy_is_right(targets[healthy])
    for url, named in refused.items():
        assert targets[url]["status"] == "bad_payload"
        assert named in targets[url]["error"] and "not a usable count" in targets[url]["error"]
        assert targets[url]["engines"] == []
    for url, engine in odd.items():
        assert targets[url]["status"] == "up"
        assert [e["engine"] for e in targets[url]["engines"]] == [engine]


async def test_the_app_shows_a_bad_value_as_bad_payload_and_reads_the_rest() -> None:
    """The app once kept such a row at its last values, still 'up', forever."""
    async with FaultServer(bodies=[fixture_text(LOAD).encode()]) as healthy, \
            FaultServer(bodies=[bodies.vllm_body().encode(),
                                bodies.bad_config("num_gpu_blocks", "inf").encode()]) as bad:
        good_url, bad_url = healthy.url(), bad.url()
        app = KvtopApp(AppConfig(targets=[Target(good_url), Target(bad_url)], interval_s=0.2,
                                 gpu_reader=FakeGpuReader(), no_gpu=True, watch_tty=False))
        async with app.run_test(size=(160, 30)) as pilot:
            state = app.trackers[bad_url].state
            assert await until(pilot, lambda: state.status in ("stale", "bad_payload"))
            assert "num_gpu_blocks='inf'" in (state.error or "")
            read = healthy.hits
            assert await until(pilot, lambda: healthy.hits >= read + 3)
            assert app.trackers[good_url].state.status == "up"
            assert app.is_running


# --- bodies that once froze the event loop -----------------------------------------------------

FREEZERS = {  # body -> what the error must say
    bodies.malformed_lines(16_000): "more than 1,000 malformed lines",  # 72 s, quadratic
    bodies.many_series(200_000): "200,000 lines of metrics kvtop reads",  # ~10 s
}


async def test_bodies_that_froze_the_loop_are_refused_quickly_beside_a_healthy_target() -> None:
    """Together they once took minutes: every malformed line rescanned the body, and huge
    bodies were parsed on the event loop with no bound. The deadline here is generous
    (start-up and two rounds take ~3 s); the old code took over a minute."""
    async with AsyncExitStack() as stack:
        healthy = await serving(stack, fixture_text(LOAD))
        freezers = {await serving(stack, body): said for body, said in FREEZERS.items()}
        long_line = await serving(stack, bodies.long_line(15_000_000))
        code, doc, err, elapsed = await kvtop("snapshot", healthy, *freezers, long_line,
                                              "--timeout", "3", "--interval", "0.5", "--no-gpu")
    assert code == 3, err
    assert elapsed < 30, elapsed
    targets = by_url(doc)
    healthy_is_right(targets[healthy])
    for url, said in freezers.items():
        assert targets[url]["status"] == "bad_payload" and said in targets[url]["error"]
    # the 15 MB line is skipped and reported; the rest of that body is read
    assert targets[long_line]["status"] == "up"
    assert any("line of 15,000," in note for note in targets[long_line]["notes"])


def near_the_limits(tag: str) -> str:
    """39,000 lines to read (the parser reads at most 40,000), 13,000 engines: what a hostile
    server can make kvtop read every scrape, every line new (no cache helps)."""
    return bodies.many_models(13_000, tag=tag,
                              names=(bodies.RUNNING, bodies.WAITING, bodies.USAGE))


async def until_scrapes(poller: Poller, count: int, *also: Any) -> list[tuple[Scrape, float]]:
    """Run the poller until it has delivered ``count`` scrapes (with their loop times),
    alongside the coroutines ``also(stop)``."""
    got: list[tuple[Scrape, float]] = []
    stop = asyncio.Event()

    def on_scrape(scrape: Scrape) -> None:
        got.append((scrape, asyncio.get_running_loop().time()))
        if len(got) >= count:
            stop.set()

    await asyncio.gather(poller.run(on_scrape, stop=stop), *(coro(stop) for coro in also))
    return got


async def test_a_big_body_is_read_off_the_event_loop() -> None:
    """Read in the loop, such a body held every other target and the keys for as long as
    it took (here: as long as reading one in this test takes); read in a worker thread,
    the loop goes on (what is left is the GIL's 5 ms turns and garbage collection)."""
    started = time.perf_counter()
    assert read_exposition(near_the_limits("probe-")).engines_over_cap == 13_000 - 256
    in_the_loop_s = time.perf_counter() - started
    lags: list[float] = []

    async def watch_the_loop(stop: asyncio.Event) -> None:
        while not stop.is_set():
            before = time.perf_counter()
            await asyncio.sleep(0.01)
            lags.append(time.perf_counter() - before - 0.01)

    async with FaultServer(bodies=[near_the_limits("served-").encode()]) as big, \
            Poller([Target(big.url())], interval_s=0.1, timeout_s=10) as poller:
        ((scrape, _),) = await until_scrapes(poller, 1, watch_the_loop)
    assert scrape.reading is not None and scrape.reading.engines_over_cap == 13_000 - 256
    assert max(lags) < in_the_loop_s / 2, (max(lags), in_the_loop_s)


async def test_a_target_that_is_slow_to_read_is_read_less_often() -> None:
    """Reading one target takes at most a tenth of a core, whatever the interval."""
    async with FaultServer(bodies=[bodies.many_models(3_000).encode()]) as slow:
        target = Target(slow.url())
        async with Poller([target], interval_s=0.05, timeout_s=10) as poller:
            first_read_s: list[float] = []

            async def note_first_read(stop: asyncio.Event) -> None:
                while poller.state(target).read_s == 0 and not stop.is_set():
                    await asyncio.sleep(0.005)
                first_read_s.append(poller.state(target).read_s)

            (first, first_t), (second, second_t) = await until_scrapes(
                poller, 2, note_first_read)
    assert first.ok and second.ok
    # the second attempt starts READ_SHARE reads after the first started (before it was read)
    assert second_t - first_t >= (READ_SHARE - 2) * first_read_s[0] > 0.05


# --- values flagged, not shown ----------------------------------------------------------------


async def test_impossible_values_are_flagged_and_not_shown() -> None:
    async with AsyncExitStack() as stack:
        twice = await serving(stack, bodies.duplicate_series())
        impossible = await serving(stack, bodies.impossible_values())
        code, doc, err, _ = await kvtop("snapshot", twice, impossible, "--samples", "1",
                                        "--no-gpu")
    assert code == 0, err
    targets = by_url(doc)
    (engine,) = targets[twice]["engines"]
    assert engine["requests"]["running"] is None  # was 30 + 9999 = 10029
    assert any("series written twice" in note for note in targets[twice]["notes"])

    target = targets[impossible]
    (engine,) = target["engines"]
    assert engine["kv"]["usage"] is None  # 1.7
    assert engine["latency_s"]["e2e"] is None  # buckets 5, 2, 7: p50 = p90 = p99 = 0
    assert engine["requests"]["running"] == 3  # the rest is read
    assert target["impossible_values"] == 3
    (note,) = [n for n in target["notes"] if n.startswith("impossible values")]
    assert "kv_usage 1.7" in note and "preemptions_total -4" in note and "go down" in note


async def test_a_server_naming_too_many_engines_shows_the_first_256() -> None:
    async with AsyncExitStack() as stack:
        crowd = await serving(stack, bodies.many_models(1_000))
        code, doc, err, _ = await kvtop("snapshot", crowd, "--samples", "1", "--no-gpu")
    assert code == 0, err
    (target,) = doc["targets"]
    assert len(target["engines"]) == 256 and target["engines_over_cap"] == 744
    assert any(note.startswith("too many engines: 1,000") for note in target["notes"])


# --- compressed bodies that are not what they claim ---------------------------------------------


async def test_raw_deflate_and_corrupt_gzip_are_named() -> None:
    async with FaultServer(bodies=[fixture_text(LOAD).encode()]) as server:
        urls = [server.url(), server.url("deflate_raw"), server.url("gzip_corrupt")]
        code, doc, err, _ = await kvtop("snapshot", *urls, "--samples", "1", "--no-gpu",
                                        "--full-metrics")
    assert code == 3, err
    healthy, raw, corrupt = (by_url(doc)[url] for url in urls)
    healthy_is_right(healthy)
    assert "raw deflate" in raw["error"] and "corrupt gzip" in corrupt["error"]


# --- a tracker fed hostile scrapes stays total -------------------------------------------------


def test_a_tracker_turns_a_refused_answer_into_bad_payload_then_recovers() -> None:
    target = Target("http://127.0.0.1:9/metrics")
    tracker = TargetTracker(target, stale_after_s=5)
    tracker.update(read_scrape(Scrape(target, 100.0, body=bodies.vllm_body())))
    assert tracker.state.status == "up"
    tracker.update(read_scrape(Scrape(target, 101.0, body=bodies.bad_config("block_size", "inf"))))
    assert tracker.state.status == "stale" and "block_size='inf'" in (tracker.state.error or "")
    tracker.update(read_scrape(Scrape(target, 110.0, body=bodies.bad_config("block_size", "inf"))))
    assert tracker.state.status == "bad_payload" and tracker.state.engines == []
    tracker.update(read_scrape(Scrape(target, 111.0, body=bodies.vllm_body())))
    assert tracker.state.status == "up" and tracker.state.error is None
