"""Constructed series for the leak detector's rules, a minute-long bucket at a time: one scrape
every 10 s on a minute boundary (so every bucket's mean is exact) under a steady load, and
the verdict at each bucket's close."""

from __future__ import annotations

from dataclasses import replace

from kvtop.derive.leak import LeakDetector
from kvtop.derive.leak_params import LeakParams
from kvtop.derive.stats import EngineStats
from kvtop.derive.verdicts import LeakVerdict

T0M = 1_700_000_040.0  # on a minute: buckets start with the series


STEP = 10


FLOOR_POOL = 1000


PER_BUCKET = 60 // STEP


def floor_scrape(t: float, used: float, *, running: float = 5.0, preemptions: float = 0.0
           ) -> EngineStats:
    """One scrape of an engine under a steady load, without tokens in flight (the floor
    rules): a server that does not export the finished requests' token histograms."""
    return EngineStats(model="m", engine="0", t=T0M + t, blocks_total=FLOOR_POOL, blocks_used=used,
                       kv_usage=used / FLOOR_POOL, running=running, waiting=0.0, window_s=STEP,
                       prompt_tps=500.0, generation_tps=100.0, finished_per_s={"stop": 0.5},
                       preemptions_per_s=preemptions)


# Tokens a block holds in the series under a load that exports its tokens in flight
BLOCK = 16


def loaded(t: float, leaked: float, *, running: float, preemptions: float = 0.0,
           waiting: float = 0.0, aborted: float = 0.0, used: float | None = None
           ) -> EngineStats:
    """A scrape whose used blocks are exactly what its tokens in flight hold (a block per
    BLOCK tokens, half a block rounded up per request) plus `leaked`."""
    in_flight = running * (600.0 + 200.0 * (t // 60 % 3))  # contexts cycle, running swings
    level = in_flight / BLOCK + running / 2 + leaked if used is None else used
    return replace(floor_scrape(t, level, running=running, preemptions=preemptions),
                   tokens_in_flight=in_flight, waiting=waiting,
                   finished_per_s={"stop": 0.5, "abort": aborted})


def swinging(leaks: list[float], **kw: float) -> list[EngineStats]:
    """One bucket per entry, holding that many leaked blocks, under a load that swings
    between 4 and 9 running from bucket to bucket (an explained working set of 200–450)."""
    return [loaded((minute * PER_BUCKET + i) * STEP, leaked,
                   running=4.0 + (minute * 3) % 6, **kw)
            for minute, leaked in enumerate(leaks) for i in range(PER_BUCKET)]


def by_bucket(levels: list[float], **kw: float) -> list[EngineStats]:
    """A series whose every bucket (a minute) holds one level at all its scrapes."""
    return [floor_scrape((minute * PER_BUCKET + i) * STEP, level, **kw)
            for minute, level in enumerate(levels) for i in range(PER_BUCKET)]


def floor_verdicts(series: list[EngineStats],
                   params: LeakParams | None = None) -> list[LeakVerdict]:
    detector = LeakDetector(params)
    return [detector.update(s) for s in series]


def closes(found: list[LeakVerdict]) -> list[LeakVerdict]:
    """The verdict at each bucket's first scrape: the one after the previous bucket closed."""
    return found[::PER_BUCKET]
