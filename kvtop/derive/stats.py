"""Numbers derived from successive readings of one engine.

:class:`EngineStats` is what the views (table, TUI, JSON) show for one engine: the latest
gauges, KV blocks used, and rates and latency quantiles over the window between two
scrapes. ``None`` always means "not known" (not exported, or not enough scrapes yet).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Literal

if TYPE_CHECKING:
    from kvtop.collect.reading import LoraInfo
    from kvtop.derive.verdicts import LeakVerdict, StallVerdict


QuantileScope = Literal["window", "lifetime"]  # between two scrapes, or since the server began


@dataclass(frozen=True, slots=True)
class Quantiles:
    """Latency quantiles in seconds, estimated from histogram bucket deltas."""

    p50: float | None
    p90: float | None
    p99: float | None
    samples: float  # observations behind the estimate
    scope: QuantileScope = "window"


@dataclass(slots=True)
class EngineStats:
    model: str | None
    engine: str | None
    t: float  # unix seconds of the scrape these numbers describe
    kv_usage: float | None = None
    cpu_kv_usage: float | None = None  # vLLM V0 swap space
    blocks_total: int | None = None
    blocks_used: float | None = None
    block_size: int | None = None
    tokens_total: int | None = None
    tokens_used: float | None = None
    running: float | None = None
    waiting: float | None = None
    waiting_deferred: float | None = None  # waiting for a KV transfer or the LoRA budget
    tokens_in_flight: float | None = None  # context of the requests in flight, from counters
    swapped: float | None = None
    preemptions_total: float | None = None
    prefix_queries_total: float | None = None
    prefix_hits_total: float | None = None
    prefix_unit: Literal["tokens", "blocks"] | None = None
    hit_rate: float | None = None
    hit_rate_scope: Literal["window", "lifetime", "reported"] | None = None
    prompt_tps: float | None = None
    generation_tps: float | None = None
    preemptions_per_s: float | None = None
    prefix_queries_per_s: float | None = None  # weighs a fleet's hit rate by its lookups
    finished_per_s: dict[str, float] = field(default_factory=dict)
    ttft: Quantiles | None = None
    itl: Quantiles | None = None
    e2e: Quantiles | None = None
    window_s: float | None = None  # seconds between the two scrapes behind the rates
    restarted: bool = False  # a counter went backwards: the server restarted
    idle_floor_blocks: int = 0
    idle_floor_exact: bool = True  # False: assumed (the larger floor the version may have)
    prefix_caching: bool | None = None  # None: the server does not say
    cache_config: dict[str, str] = field(default_factory=dict)  # vLLM cache_config_info labels
    lora: LoraInfo | None = None  # LoRA adapters with requests running / waiting
    leak: LeakVerdict | None = None  # the leak detector's verdict after this scrape
    stall: StallVerdict | None = None  # the stall verdict after this scrape

    @property
    def usage(self) -> float | None:
        """How full the pool is: the server's own figure, else blocks used over the pool."""
        if self.kv_usage is not None:
            return self.kv_usage
        if self.blocks_used is not None and self.blocks_total:
            return self.blocks_used / self.blocks_total
        return None
