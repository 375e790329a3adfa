"""An engine's KV event stats as the views get them: a healthy base any test changes what
it needs of (the view tests of the cache pane, its detail lines and the app's)."""

from __future__ import annotations

from dataclasses import replace

from kvtop.derive.stats import KvEventStats


def kv_event_stats(**changes: object) -> KvEventStats:
    """500 blocks stored and 400 removed, 100 cached, 4.2 turnovers of a 999-block pool
    without a leaked block; ``changes`` as in dataclasses.replace."""
    base = KvEventStats(
        batches=10, stored_total=500, removed_total=400, cleared=0, population=100,
        index_dropped=0, removed_unknown=0, reuses=5, stored_events=50, stored_per_s=12.5,
        removed_per_s=11.0, reuses_per_s=0.5, age_at_eviction=None, hot=(), leak="none",
        leak_reason="every cached block was used within 3 pool turnovers", leaked_blocks=0,
        leaked_sample=(), turnovers=4.2, pool_blocks=999, lost_batches=0, malformed=0,
        unknown_events=0, restarts=0, last_seq=9, first_seq=0, by_medium={"GPU": (500, 400)})
    return replace(base, **changes)  # type: ignore[arg-type]
