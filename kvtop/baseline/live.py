"""A live run for ``kvtop baseline save`` and ``kvtop compare``: watch the targets for the
duration through the app's poller, read the local GPUs, and (with ``--probe``) send the
fixed request to each server a few times, spread over the run.

With ``time_scale`` S (a ``kvtop sim --speed S`` server) scrape times, the duration and the
probe's timings are moved into the server's time, as ``kvtop rehearse --time-scale`` does.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
from dataclasses import dataclass, field

import aiohttp

from kvtop.baseline.collect import Collector
from kvtop.baseline.probe import Prober, ProbeSettings
from kvtop.collect.clock import stop_event
from kvtop.collect.live import DirectSource
from kvtop.collect.nvml import GpuReader, NvmlUnavailable
from kvtop.collect.target import Scrape, Target
from kvtop.collect.watch import watch
from kvtop.derive.leak_params import LeakParams
from kvtop.load.driver import RunClock
from kvtop.load.openai_client import NotOpenAI, make_session

log = logging.getLogger(__name__)


class CannotProbe(Exception):
    """A server that can't take the probe (not an OpenAI-compatible API, or no model)."""


@dataclass
class LiveSettings:
    targets: list[Target]
    duration_s: float
    interval_s: float = 1.0
    timeout_s: float | None = None
    insecure: bool = False
    full_metrics: bool = False
    time_scale: float = 1.0
    leak_params: LeakParams | None = None
    probe: ProbeSettings | None = None  # None: send nothing
    notes: list[str] = field(default_factory=list)  # filled in: what could not be read


async def collect_live(settings: LiveSettings, gpu_reader: GpuReader | None) -> Collector:
    """Watch the targets for the duration (or until Ctrl-C); CannotProbe before any
    polling when a server can't be probed."""
    collector = Collector(leak_params=settings.leak_params)
    for target in settings.targets:
        collector.add_target(target)
    clock = RunClock(settings.time_scale)
    interrupted = stop_event()  # Ctrl-C, SIGTERM
    stop = asyncio.Event()  # the end of the watching: the duration, or interrupted
    asyncio.get_running_loop().call_later(clock.wall(settings.duration_s), stop.set)
    async with make_session(insecure=settings.insecure) as session:
        probers = await _probers(session, settings)

        def on_scrape(scrape: Scrape) -> None:
            collector.feed(dataclasses.replace(
                scrape, t=clock.unix0 + clock.since_start(scrape.t)))

        tasks = [asyncio.create_task(_relay(interrupted, stop))]
        tasks += [asyncio.create_task(_probe(p, t, collector, clock, settings, stop,
                                             interrupted)) for t, p in probers]
        if gpu_reader is not None:
            tasks.append(asyncio.create_task(_gpus(gpu_reader, collector, clock, settings,
                                                   stop)))
        source = DirectSource(settings.targets, interval_s=clock.wall(settings.interval_s),
                              timeout_s=settings.timeout_s, insecure=settings.insecure,
                              narrow=not settings.full_metrics)
        try:
            await watch(source.live(), on_scrape, stop=stop)
        finally:
            stop.set()
            for task in tasks if interrupted.is_set() else tasks[:1]:
                task.cancel()  # Ctrl-C: no probe is waited for
            await asyncio.gather(*tasks, return_exceptions=True)
    return collector


async def _probers(session: aiohttp.ClientSession,
                   settings: LiveSettings) -> list[tuple[Target, Prober]]:
    if settings.probe is None:
        return []
    probe = dataclasses.replace(settings.probe, time_scale=settings.time_scale)
    probers = []
    for target in settings.targets:
        token = target.token.reveal() if target.token else None
        prober = Prober(session, target.url, probe, token)
        try:
            await prober.identify()
        except NotOpenAI as exc:
            raise CannotProbe(f"--probe: {exc}") from None
        probers.append((target, prober))
    return probers


async def _relay(source: asyncio.Event, target: asyncio.Event) -> None:
    await source.wait()
    target.set()


async def _probe(prober: Prober, target: Target, collector: Collector, clock: RunClock,
                 settings: LiveSettings, stop: asyncio.Event,
                 interrupted: asyncio.Event) -> None:
    """Probe i goes at (i + ½)/N of the run, one at a time. On a server so slow that they
    don't all fit, the rest go right after the watching ends (the test needs N); Ctrl-C
    stops them."""
    count = max(1, prober.settings.count)

    async def wait_turn(i: int) -> bool:
        await clock.sleep_until(settings.duration_s * (i + 0.5) / count, stop)
        return not interrupted.is_set()

    try:
        await prober.run(wait_turn)
    finally:
        collector.set_probe(target, prober.summary())


async def _gpus(reader: GpuReader, collector: Collector, clock: RunClock,
                settings: LiveSettings, stop: asyncio.Event) -> None:
    while not stop.is_set():
        try:
            readings = await asyncio.to_thread(reader.read)
        except NvmlUnavailable as exc:
            settings.notes.append(f"GPUs not read: {exc.reason}")
            return
        except Exception as exc:  # a driver hiccup must not end the run
            log.debug("reading GPUs failed", exc_info=True)
            settings.notes.append(f"reading GPUs failed: {exc}")
            return
        t = clock.now()
        collector.feed_gpus(clock.unix0 + t, readings)
        await clock.sleep_until(t + settings.interval_s, stop)
