"""Process-wide settings for kvtop's long-running commands."""

from __future__ import annotations

import gc

# Every scrape makes a few hundred short-lived objects (samples, readings, stats), nearly
# all freed by reference counting; CPython's default gen-0 threshold (700) still runs a
# collection every 700 allocations, ~16 a second for 500 engines at 1 Hz, each walking the
# young objects and the trackers' histories. In bench_fleet that was 0.1 of a core of 0.5.
GEN0_THRESHOLD = 20_000


def tune_gc() -> None:
    """Collect the young generation less often, and leave what is alive at start-up (the
    imported modules) out of full collections."""
    gc.freeze()
    gen0, gen1, gen2 = gc.get_threshold()
    gc.set_threshold(max(gen0, GEN0_THRESHOLD), gen1, gen2)
