"""What a rehearsal watches, scrape by scrape: each good scrape's engines as points in the
target's time and the run's phase, a failed scrape counted with its error, a restart noted
once, the server's kind and version, the watch-only TTFT histograms summed over engines,
the GPUs read until stopped (or why not), and how many latest scrapes were idle."""

from __future__ import annotations

import asyncio
import logging
import ssl
import time
from pathlib import Path

import pytest

from kvtop.collect.gpu import GpuReading
from kvtop.collect.reading import Histogram
from kvtop.collect.source import read_scrape
from kvtop.collect.target import Scrape, Target
from kvtop.derive.leak_params import LeakParams
from kvtop.load.driver import RunClock
from kvtop.rehearse.watch import EnginePoint, GpuPoint, Watcher, _summed
from kvtop.store.writer import RecordingWriter
from tests.fakes.fake_nvml import FakeGpuReader, sample_gpus
from tests.fakes.faultserver import FaultServer, fixture
from tests.scenarios.check_runs import body as holding_body
from tests.support.paths import fixture_text

TARGET = Target.from_spec("127.0.0.1:8000")
LOADED_NAME, IDLE_NAME = "vllm-0.33.0-v1-twin-under-load.txt", "vllm-0.33.0-v1-twin-idle.txt"
LOADED, IDLE = fixture_text(LOADED_NAME), fixture_text(IDLE_NAME)


def watcher(scale: float = 60.0, **options: object) -> Watcher:
    settings: dict[str, object] = {
        "interval_s": 1.0, "timeout_s": None, "insecure": False, "full_metrics": False,
        "leak_params": None, "writer": None, "gpu_reader": None, "gpu_interval_s": 5.0}
    settings.update(options)
    return Watcher(TARGET, RunClock(scale), **settings)  # type: ignore[arg-type]


def scrape(w: Watcher, wall_s: float, body: str | None) -> None:
    """A scrape ``wall_s`` wall seconds after the run's start, fed to the watcher."""
    t = w.clock.unix0 + wall_s
    if body is None:
        w._on_scrape(Scrape(TARGET, t, failure="down", error="connection refused"))
    else:
        w._on_scrape(read_scrape(Scrape(TARGET, t, body=body)))


def test_good_scrapes_become_points_in_the_target_time_and_phase() -> None:
    w = watcher()  # a simulator at 60x: a wall second is a target minute
    scrape(w, 1.0, LOADED)
    w.phase = "load"
    scrape(w, 2.0, IDLE)
    assert w.data.points == {("twin-llama", "0"): [
        EnginePoint(60.0, "before", 588.0, 599, 588 / 599, 30.0, 149.0, 6.0, 17016.0, 6400.0, 0),
        EnginePoint(120.0, "load", 0.0, 599, 0.0, 0.0, 0.0, 68.0, 65720.0, 24320.0, 0)]}
    data = w.data
    assert (data.scrapes, data.failed_scrapes, data.last_error, data.last_failure) == \
        (2, 0, None, None)
    assert (data.kind, data.version, data.version_inferred) == ("vllm", "0.10.2+", True)
    assert (data.cache_config["block_size"], data.prefix_caching) == ("16", True)
    verdict = data.verdicts[("twin-llama", "0")]
    assert (verdict.first_t, verdict.last_t, verdict.block_size) == (60.0, 120.0, 16)
    assert verdict.at_worst is not None and verdict.stall_at_worst is not None  # observed
    assert (data.restarts, data.ttft) == ([], [])  # no TTFT histograms unless asked
    assert w.changed.is_set()


def test_a_failed_scrape_is_counted_with_its_error_and_keeps_the_points() -> None:
    w = watcher()
    scrape(w, 1.0, LOADED)
    w.changed.clear()
    scrape(w, 2.0, None)
    data = w.data
    assert (data.scrapes, data.failed_scrapes, data.last_error, data.last_failure) == \
        (1, 1, "connection refused", "down")
    assert len(data.points[("twin-llama", "0")]) == 1 and w.changed.is_set()
    scrape(w, 0.5, IDLE)  # answered late, older than the good one: the tracker ignores it
    assert (data.scrapes, data.failed_scrapes, len(data.points[("twin-llama", "0")])) == \
        (1, 2, 1)


def test_a_restart_is_noted_once_at_its_time() -> None:
    w = watcher()
    for wall_s, body in ((1.0, IDLE), (2.0, LOADED), (3.0, IDLE)):
        scrape(w, wall_s, body)
    assert w.data.restarts == [120.0]  # the counters went back between 60 s and 120 s


def test_every_scrape_goes_to_the_recording(tmp_path: Path) -> None:
    path = tmp_path / "run.kvtop"
    with RecordingWriter(path, interval_s=1.0, targets=[TARGET]) as writer:
        w = watcher(writer=writer)
        scrape(w, 1.0, LOADED)
        scrape(w, 2.0, None)
        assert writer.written == 2
        lines = path.read_text().splitlines()  # flushed at once: a kill loses nothing
    assert len(lines) == 3  # header and two scrapes


def test_watch_only_sums_the_ttft_histograms_of_the_engines() -> None:
    w = watcher(histograms=True)
    scrape(w, 1.0, LOADED)
    scrape(w, 2.0, None)
    assert [t for t, _ in w.data.ttft] == [60.0]
    buckets = dict(w.data.ttft[0][1])
    assert (buckets[0.001], buckets[0.02], buckets[0.06], buckets[float("inf")]) == \
        (32.0, 35.0, 44.0, 51.0)
    assert _summed([Histogram(((0.1, 1.0), (1.0, 3.0))),
                    Histogram(((1.0, 2.0), (0.1, 2.0), (float("inf"), 4.0)))]) == [
        (0.1, 3.0), (1.0, 5.0), (float("inf"), 4.0)]


def point(phase: str, running: float | None, waiting: float | None) -> EnginePoint:
    return EnginePoint(0.0, phase, 0.0, 10, 0.0, running, waiting,  # type: ignore[arg-type]
                       None, None, None, 0)


def test_idle_scrapes_counts_the_latest_idle_run_of_every_engine() -> None:
    w = watcher()
    assert w.idle_scrapes("after") == 0  # no engine seen
    w.data.points = {
        ("m", "0"): [point("after", 1.0, 0.0), point("after", 0.0, 0.0), point("after", 0.0, 0.0)],
        ("m", "1"): [point("load", 0.0, 0.0), point("after", 0.0, 0.0), point("after", 0.0, 0.0),
                     point("after", 0.0, 0.0)]}
    assert w.idle_scrapes("after") == 2  # the least of the engines
    assert w.idle_scrapes("load") == 0  # the latest scrapes are of another phase
    w.data.points[("m", "0")].append(point("after", 0.0, 1.0))  # one waiting: not idle
    assert w.idle_scrapes("after") == 0
    assert not point("after", None, 0.0).idle and not point("after", 0.0, None).idle


def test_gpus_are_read_until_stopped() -> None:
    unread = [GpuReading(None, "exporter GPU", "GPU-c", 1, 2, None, None, None),
              GpuReading(3, "no memory", "GPU-d", None, 2, None, None, None),
              GpuReading(4, "no total", "GPU-e", 1, None, None, None, None)]
    seen: list[GpuPoint] = []
    reader = FakeGpuReader([*unread, *sample_gpus()])
    w = watcher(scale=1.0, gpu_reader=reader, on_gpu=seen.append, gpu_interval_s=3600.0)
    stop = asyncio.Event()

    async def read_once() -> None:
        task = asyncio.create_task(w._gpus(stop))
        while not seen:
            await asyncio.sleep(0)
        stop.set()  # ends the hour's wait at once
        await asyncio.wait_for(task, 5.0)
    asyncio.run(read_once())
    gib = 1024 ** 3
    assert reader.reads == 1  # the next read is an hour away
    assert [(p.index, p.name, p.used, p.total) for p in seen] == [
        (0, "NVIDIA H100 80GB HBM3", 74 * gib, 80 * gib), (1, "NVIDIA H100 80GB HBM3", 0, 80 * gib)]
    assert w.data.gpus == seen and w.data.gpu_unavailable is None
    assert 0.0 <= seen[0].t == seen[1].t < 5.0  # the run's clock when read


def test_gpus_without_a_listener() -> None:
    w = watcher(gpu_reader=FakeGpuReader(), gpu_interval_s=3600.0)
    stop = asyncio.Event()

    async def read_once() -> None:
        task = asyncio.create_task(w._gpus(stop))
        while not w.data.gpus:
            await asyncio.sleep(0)
        stop.set()
        await task
    asyncio.run(read_once())
    assert [p.index for p in w.data.gpus] == [0, 1]


def test_why_the_gpus_were_not_read(caplog: pytest.LogCaptureFixture) -> None:
    stop = asyncio.Event()
    w = watcher()
    asyncio.run(w._gpus(stop))
    assert w.data.gpu_unavailable == "GPUs not read (--no-gpu)"
    w = watcher(gpu_reader=FakeGpuReader(unavailable="NVML not found (no NVIDIA driver)"))
    asyncio.run(w._gpus(stop))
    assert w.data.gpu_unavailable == "NVML not found (no NVIDIA driver)"

    class Broken(FakeGpuReader):
        def read(self) -> list[GpuReading]:
            raise RuntimeError("driver hiccup")
    w = watcher(gpu_reader=Broken())
    with caplog.at_level(logging.DEBUG, logger="kvtop.rehearse.watch"):
        asyncio.run(w._gpus(stop))
    assert (w.data.gpu_unavailable, w.data.gpus) == ("reading GPUs failed: driver hiccup", [])
    [record] = caplog.records  # the traceback goes to the debug log
    assert (record.levelno, record.getMessage()) == (logging.DEBUG, "reading GPUs failed")
    assert record.exc_info is not None and str(record.exc_info[1]) == "driver hiccup"


def test_wait_for_a_condition_after_scrapes_or_until_the_deadline() -> None:
    w = watcher(scale=1000.0)  # 1000 target seconds take a wall second

    async def scrapes() -> None:
        for wall_s in (0.0, 0.0):
            await asyncio.sleep(0.01)
            scrape(w, wall_s, IDLE)

    async def waits() -> list[bool]:
        ready = await w.wait_for(lambda: True, 0.0)
        task = asyncio.create_task(scrapes())
        scraped = await w.wait_for(lambda: w.data.scrapes == 2, 500.0)  # half a wall second
        await task
        return [ready, scraped, await w.wait_for(lambda: False, 50.0),  # 50 ms of wall time
                await w.wait_for(lambda: False, -1.0)]
    assert asyncio.run(waits()) == [True, True, False, False]


def vllm_body(engines: dict[str, int], cache_config: bool = False) -> str:
    """A vLLM server with one engine per key, each with its finished-request count (a
    smaller count than before is a restart), no histograms, and its cache_config if asked."""
    lines = []
    for engine, count in engines.items():
        labels = f'engine="{engine}",model_name="m"'
        lines += [f"vllm:num_requests_running{{{labels}}} 0.0",
                  f"vllm:num_requests_waiting{{{labels}}} 0.0",
                  f"vllm:kv_cache_usage_perc{{{labels}}} 0.25",
                  f'vllm:request_success_total{{{labels},finished_reason="stop"}} {count}.0']
        if cache_config:
            lines.append(f'vllm:cache_config_info{{{labels},block_size="32",'
                         f'enable_prefix_caching="False",kv_cache_memory_bytes="1048576000",'
                         f'num_gpu_blocks="1000"}} 1.0')
    return "\n".join(lines) + "\n"


def test_engines_restarting_together_are_one_restart_and_each_restart_counts() -> None:
    w = watcher(histograms=True)
    for wall_s, count in ((1.0, 50), (2.0, 1), (3.0, 60), (4.0, 2), (5.0, 70)):
        scrape(w, wall_s, vllm_body({"0": count, "1": count}))
    assert w.data.restarts == [120.0, 240.0]
    assert w.data.ttft == []  # no TTFT histogram, nothing to sum
    assert sorted(w.data.verdicts) == [("m", "0"), ("m", "1")]
    assert [(v.model, v.engine) for v in w.data.verdicts.values()] == [("m", "0"), ("m", "1")]


def test_the_cache_config_and_prefix_caching_stay_when_later_scrapes_lack_them() -> None:
    w = watcher()
    scrape(w, 1.0, vllm_body({"0": 1}, cache_config=True))
    scrape(w, 2.0, vllm_body({"0": 2}))
    assert (w.data.cache_config["block_size"], w.data.prefix_caching) == ("32", False)
    verdict = w.data.verdicts[("m", "0")]
    assert (verdict.block_size, verdict.bytes_per_block) == (32, 1048576.0)


async def watched(server: FaultServer, scrapes: int, **options: object) -> Watcher:
    """A Watcher run against ``server`` until it has ``scrapes`` readings (good or not)."""
    w = Watcher(Target.from_spec(server.url()), RunClock(10.0), **{  # type: ignore[arg-type]
        "interval_s": 1.0, "timeout_s": 5.0, "insecure": False, "full_metrics": False,
        "leak_params": None, "writer": None, "gpu_reader": FakeGpuReader(),
        "gpu_interval_s": 3600.0, **options})
    stop = asyncio.Event()
    task = asyncio.create_task(w.run(stop))
    # 3 s of wall time: 30 scrapes' intervals at 10x (a wall second apart would be too slow)
    done = await w.wait_for(lambda: w.data.scrapes + w.data.failed_scrapes >= scrapes, 30.0)
    stop.set()
    await asyncio.wait_for(task, 10.0)
    assert done
    return w


def test_a_run_reads_the_server_and_the_gpus_until_stopped() -> None:
    async def go() -> tuple[Watcher, FaultServer]:
        async with FaultServer(bodies=[fixture(LOADED_NAME), fixture(IDLE_NAME)]) as server:
            return await watched(server, 4), server
    w, server = asyncio.run(go())
    assert w.data.scrapes >= 4 and w.data.failed_scrapes == 0
    assert [p.used for p in w.data.points[("twin-llama", "0")][:2]] == [588.0, 0.0]
    assert [p.index for p in w.data.gpus] == [0, 1]  # read once: the next is an hour away
    metrics = [r for r in server.requests if r.path.startswith("/metrics")]
    assert metrics and all(r.query for r in metrics)  # narrowed to kvtop's series


def test_a_run_reads_every_series_when_asked() -> None:
    async def go() -> FaultServer:
        async with FaultServer(bodies=[fixture(IDLE_NAME)]) as server:
            await watched(server, 1, full_metrics=True)
            return server
    server = asyncio.run(go())
    assert not any(r.query for r in server.requests if r.path.startswith("/metrics"))


def test_a_run_times_out_a_slow_server() -> None:
    async def go() -> Watcher:
        async with FaultServer(mode="slow", delay_s=1.0) as server:  # in 2 s by default
            return await watched(server, 1, timeout_s=0.2)
    w = asyncio.run(go())
    assert (w.data.scrapes, w.data.last_failure) == (0, "timeout")


def stalled_body() -> str:
    labels = 'engine="0",model_name="m"'
    return "\n".join([f"vllm:num_requests_running{{{labels}}} 0.0",
                      f"vllm:num_requests_waiting{{{labels}}} 5.0",
                      f"vllm:kv_cache_usage_perc{{{labels}}} 0.25",
                      f'vllm:request_success_total{{{labels},finished_reason="stop"}} 5.0',
                      f"vllm:generation_tokens_total{{{labels}}} 100.0"]) + "\n"


def test_a_stall_is_dated_in_the_target_time_and_the_leak_judged_with_the_run_s_params(
        ) -> None:
    params = LeakParams(window_s=1800.0)
    w = watcher(leak_params=params)
    for wall_s in range(1, 8):  # 5 waiting, nothing running, no token for minutes
        scrape(w, float(wall_s), stalled_body())
    verdict = w.data.verdicts[("m", "0")]
    assert (verdict.stall, verdict.stall_first_t) == ("stalled", 240.0)
    assert w.tracker.detectors[("m", "0")].params is params


def test_a_gpu_read_in_flight_neither_holds_the_run_nor_ends_it_in_error() -> None:
    class Slow(FakeGpuReader):
        def read(self) -> list[GpuReading]:
            time.sleep(0.3)
            return super().read()

    async def go() -> set[asyncio.Task[object]]:
        async with FaultServer(bodies=[fixture(IDLE_NAME)]) as server:
            w = Watcher(Target.from_spec(server.url()), RunClock(10.0), interval_s=1.0,
                        timeout_s=5.0, insecure=False, full_metrics=False, leak_params=None,
                        writer=None, gpu_reader=Slow(), gpu_interval_s=0.0)
            stop = asyncio.Event()
            task = asyncio.create_task(w.run(stop))
            await w.wait_for(lambda: w.data.scrapes >= 1, 300.0)
            stop.set()  # the GPU read is still in its thread
            await task  # returns, not cancelled
            return asyncio.all_tasks() - {asyncio.current_task()}  # type: ignore[operator]
    assert asyncio.run(go()) == set()  # the GPU task ended with the run


def test_a_run_over_tls_with_insecure(self_signed: ssl.SSLContext) -> None:
    async def go() -> Watcher:
        async with FaultServer(bodies=[fixture(IDLE_NAME)], ssl_context=self_signed) as server:
            return await watched(server, 1, insecure=True)
    w = asyncio.run(go())
    assert (w.data.scrapes, w.data.failed_scrapes) == (1, 0)


def test_a_leak_is_dated_in_the_target_time() -> None:
    w = watcher(scale=1.0)
    for i in range(12):  # 40 blocks of 1000 held with nothing running, 10 s apart
        scrape(w, 10.0 * i, holding_body(0.04))
    verdict = w.data.verdicts[("m", "0")]
    assert (verdict.verdict, verdict.watch_first_t, verdict.leak_first_t) == ("leak", 20.0, 60.0)
