"""The header's numbers: the fleet's KV blocks weighed by capacity, hosts up, verdict counts,
load and rates, over the rows given (the app gives every row: the header is the fleet's,
whatever a search shows, as htop's is the system's) or every engine of states. Only servers
answering now count: a server that stopped answering keeps its last numbers in its own
(dimmed) row, never in the fleet's sums."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from kvtop.collect.reading import GPU_EXPORTER_KINDS
from kvtop.view.cache import limit_counts
from kvtop.view.cells import window_hit
from kvtop.view.fleet import FleetRow

if TYPE_CHECKING:
    from kvtop.derive.stats import EngineStats
    from kvtop.derive.tracker import TargetState

INFERENCE_KINDS = frozenset({"vllm", "sglang", "llamacpp", "trtllm"})


@dataclass(frozen=True, slots=True)
class FleetSummary:
    """The header's numbers, over the rows given."""

    hosts_up: int  # inference servers answering now (not GPU exporters, not unknown ones)
    hosts_total: int  # targets that are not GPU exporters
    blocks_used: float | None  # summed over engines that report both used and total
    blocks_total: int | None
    running: float
    waiting: float
    leaks: int = 0  # engines whose indicator says LEAK
    watches: int = 0  # ... and WATCH
    judged: int = 0  # engines past the detector's warmup
    stalls: int = 0  # engines whose stall verdict says STALLED
    saturated: int = 0  # ... and SATURATED
    hit_rate: float | None = None  # window hits over window lookups, all engines together
    prompt_tps: float | None = None
    generation_tps: float | None = None
    limits: tuple[tuple[str, int], ...] = ()  # (word, engines) held back by each limit

    @property
    def kv_usage(self) -> float | None:
        """Fleet KV use weighted by capacity: a big pool counts more than a small one."""
        if not self.blocks_total or self.blocks_used is None:
            return None
        return self.blocks_used / self.blocks_total


class _Totals:
    """Running sums for :func:`summarise`."""

    def __init__(self) -> None:
        self.used = self.running = self.waiting = 0.0
        self.total = 0
        self.lookups = self.hits = 0.0
        self.rates: dict[str, float] = {}
        self.leak_states: list[str] = []
        self.stalls = self.saturated = 0

    def add(self, stats: EngineStats) -> None:
        usage = stats.usage
        if stats.blocks_total and usage is not None:
            used = stats.blocks_used
            self.used += used if used is not None else usage * stats.blocks_total
            self.total += stats.blocks_total
        self.running += stats.running or 0.0
        self.waiting += stats.waiting or 0.0
        hit, lookups = window_hit(stats), stats.prefix_queries_per_s
        if hit is not None and lookups:
            self.hits += hit * lookups
            self.lookups += lookups
        for name in ("prompt_tps", "generation_tps"):
            value = getattr(stats, name)
            if value is not None:
                self.rates[name] = self.rates.get(name, 0.0) + value
        if stats.leak is not None:
            self.leak_states.append(stats.leak.state)
        if stats.stall is not None:
            self.stalls += stats.stall.state == "stalled"
            self.saturated += stats.stall.state == "saturated"


def summarise(rows: list[FleetRow] | list[TargetState]) -> FleetSummary:
    """The header's numbers over ``rows`` (or every engine of ``states``)."""
    states = {id(s): s for s in _states_of(rows)}.values()
    totals = _Totals()
    engines = _engines_of(rows)
    for stats in engines:
        totals.add(stats)
    hosts = [s for s in states if s.kind not in GPU_EXPORTER_KINDS]
    leaks = totals.leak_states
    return FleetSummary(
        hosts_up=sum(1 for s in hosts if s.status == "up" and s.kind in INFERENCE_KINDS),
        hosts_total=len(hosts),
        blocks_used=totals.used if totals.total else None,
        blocks_total=totals.total or None,
        running=totals.running,
        waiting=totals.waiting,
        leaks=leaks.count("leak"),
        watches=leaks.count("watch"),
        judged=len(leaks) - leaks.count("warmup"),
        stalls=totals.stalls,
        saturated=totals.saturated,
        hit_rate=totals.hits / totals.lookups if totals.lookups else None,
        prompt_tps=totals.rates.get("prompt_tps"),
        generation_tps=totals.rates.get("generation_tps"),
        limits=limit_counts(engines),
    )


def _states_of(rows: list[FleetRow] | list[TargetState]) -> list[TargetState]:
    return [r.state if isinstance(r, FleetRow) else r for r in rows]


def _engines_of(rows: list[FleetRow] | list[TargetState]) -> list[EngineStats]:
    """The engines whose numbers count: those of servers that answered the last scrape (a
    stale server's last numbers are a minute old at most, but no longer the fleet's now)."""
    engines: list[EngineStats] = []
    for row in rows:
        if isinstance(row, FleetRow):
            if row.stats is not None and row.state.status == "up":
                engines.append(row.stats)
        elif row.status == "up":
            engines += row.engines
    return engines

