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
    from kvtop.derive.verdicts import KvLeakState, LeakVerdict, LimitVerdict, StallVerdict


QuantileScope = Literal["window", "lifetime"]  # between two scrapes, or since the server began


@dataclass(frozen=True, slots=True)
class Quantiles:
    """Latency quantiles in seconds, estimated from histogram bucket deltas."""

    p50: float | None
    p90: float | None
    p99: float | None
    samples: float  # observations behind the estimate
    scope: QuantileScope = "window"


@dataclass(frozen=True, slots=True)
class Residency:
    """vLLM's sampled block residency (--kv-cache-metrics), seconds: ``state`` "on" with the
    quantiles of the blocks evicted (None where none were), "off" where the server's version
    has the histograms and the flag is not set, None where the version is not known to."""

    state: Literal["on", "off"] | None
    lifetime: Quantiles | None = None  # allocation to eviction
    idle: Quantiles | None = None  # last use to eviction
    reuse_gap: Quantiles | None = None  # between two uses


@dataclass(frozen=True, slots=True)
class Reuse:
    """Where prompt tokens' KV came from, over the window (``scope`` "window") or since the
    server started ("lifetime": one scrape, or no prompt in the window). Shares are of the
    prompt tokens; a dict is None where the server does not export its family."""

    scope: Literal["window", "lifetime"]
    prompt_tokens: float  # prompt tokens behind the shares
    by_source: dict[str, float] | None  # share per source: local_compute, local_cache_hit…
    cached_by_tier: dict[str, float] | None  # share of the prompt tokens per cache tier
    reuse_share: float | None  # prompt tokens not computed (found cached anywhere)
    external_hit_rate: float | None  # a KV connector's hits / its lookups (tokens)


@dataclass(frozen=True, slots=True)
class HotPrefix:
    """A cached block many chains grew from: the end of a prefix that requests reuse."""

    block_hash: int  # kvtop's 64-bit key (docs/kv-anatomy.md); never token ids or text
    tokens: int | None  # the prefix's length up to and including it, as far as kvtop saw
    reuses: int  # chains grown from it after the first


@dataclass(frozen=True, slots=True)
class KvEventStats:
    """One engine's KV events folded (derive/kv_anatomy.py): counts since kvtop began to
    listen, rates over the window since the last scrape, and the exact leak evidence, a
    witness of its own beside the leak detector's verdict (never merged into it)."""

    batches: int
    stored_total: int  # blocks stored (a hash stored twice counts twice)
    removed_total: int  # blocks removed
    cleared: int  # AllBlocksCleared: the prefix cache reset (sleep, reset_prefix_cache)
    population: int  # blocks kvtop knows are cached now
    index_dropped: int  # entries the index dropped at its cap (the evidence is partial)
    removed_unknown: int  # removals of blocks stored before kvtop listened (or dropped)
    reuses: int  # stored blocks whose parent had already been extended: a prefix reused
    stored_events: int  # BlockStored events (chains written), the reuse share's base
    stored_per_s: float | None
    removed_per_s: float | None
    reuses_per_s: float | None
    age_at_eviction: Quantiles | None  # seconds from stored to removed
    hot: tuple[HotPrefix, ...]
    leak: KvLeakState
    leak_reason: str
    leaked_blocks: int | None  # blocks unused for leak_turnovers full turnovers of the pool
    leaked_sample: tuple[int, ...]  # the longest unused of them
    turnovers: float | None  # full pool turnovers kvtop has seen since its index began
    pool_blocks: int | None  # the pool a turnover is counted against
    lost_batches: int  # batches neither the stream nor replay delivered
    malformed: int  # batches that could not be read
    unknown_events: int  # events of types kvtop does not read
    restarts: int  # the publisher's sequence went back
    last_seq: int | None
    first_seq: int | None  # the first sequence kvtop read (> 0: joined late)
    by_medium: dict[str, tuple[int, int]]  # stored, removed per medium (GPU, CPU…)

    @property
    def reuse_share(self) -> float | None:
        return self.reuses / self.stored_events if self.stored_events else None


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
    # KV anatomy (docs/kv-anatomy.md); None: not exported by this server or version
    waiting_by_reason: dict[str, float] | None = None
    kv_fetch_by_stage: dict[str, float] | None = None
    sleep_state: str | None = None
    admission_rejections_per_s: dict[str, float] | None = None
    evicted_tokens_per_s: float | None = None  # SGLang's radix cache
    mean_prompt_tokens: float | None = None  # over the window, else since start
    reuse: Reuse | None = None
    residency: Residency | None = None
    limit: LimitVerdict | None = None  # what holds the queue back, after this scrape
    kv_events: KvEventStats | None = None  # from the engine's KV events, when subscribed

    @property
    def usage(self) -> float | None:
        """How full the pool is: the server's own figure, else blocks used over the pool."""
        if self.kv_usage is not None:
            return self.kv_usage
        if self.blocks_used is not None and self.blocks_total:
            return self.blocks_used / self.blocks_total
        return None
