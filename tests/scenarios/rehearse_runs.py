"""Made-up rehearsal runs the criteria's and the advice's tests build on: an hour of load,
one engine's scrapes idle before and after it, and the leak verdict the detector reached."""

from __future__ import annotations

from kvtop.derive.verdicts import LeakVerdict
from kvtop.derive.worst import EngineVerdict
from kvtop.rehearse.criteria import Span
from kvtop.rehearse.watch import EnginePoint, WatchData

SPAN = Span(0.0, 3600.0)  # an hour of load
GIB = 2**30


def engine_points(before: float, after: float, *, idle_after: bool = True) -> list[EnginePoint]:
    """One engine of a 1000-block pool: 3 idle scrapes with ``before`` blocks used, an hour
    busy at 500, then 3 scrapes with ``after`` used (idle unless told)."""

    def point(t: float, phase: str, used: float, idle: bool) -> EnginePoint:
        return EnginePoint(t, phase, used, 1000, used / 999, 0 if idle else 4,
                           0 if idle else 2, 0.0, 0.0, 0.0, 0)

    return ([point(-2.0 + i, "before", before, True) for i in range(3)]
            + [point(60.0 * i, "load", 500, False) for i in range(60)]
            + [point(3600 + i, "after", after, idle_after) for i in range(3)])


def watch_data(points: list[EnginePoint], state: str | None = None) -> WatchData:
    """The run of those points, its leak detector at ``state`` (none observed: None)."""
    data = WatchData(points={("m", "0"): points})
    verdict = EngineVerdict("m", "0")
    if state is not None:
        verdict.observe(100.0, LeakVerdict(state, f"made-up {state}", 12.0, 30.0, 20.0))
    data.verdicts[("m", "0")] = verdict
    return data


def sized_leak() -> WatchData:
    """40 blocks more used at idle after the load, on an engine whose block size (16 tokens)
    and KV memory (1 GiB over 1000 blocks) are known: a leak of 40 blocks, 640 tokens, 0.04
    GiB."""
    data = watch_data(engine_points(0, 40), "ok")
    data.verdicts[("m", "0")].seen(0.0, 16, {"kv_cache_memory_bytes": "1073741824",
                                             "num_gpu_blocks": "1000"})
    return data
