"""The cache's own numbers from two readings of one engine: where prompt tokens' KV came
from (reuse by tier), how long blocks stay (vLLM's residency histograms), what waits and
why. Rules and versions: docs/kv-anatomy.md.

A family the server does not export stays None: a share is never made 0 by a missing
counter, and residency that is switched off reads "off", not an empty histogram.
"""

from __future__ import annotations

from typing import Literal

from kvtop.collect.reading import EngineReading, Histogram
from kvtop.derive.quantiles import quantiles
from kvtop.derive.stats import EngineStats, Quantiles, Residency, Reuse

COMPUTED = "local_compute"  # vLLM's prompt_tokens_by_source label for KV computed afresh


def _delta(now: float | None, before: float | None) -> float | None:
    if now is None or before is None:
        return None
    return max(0.0, now - before)


def _by_label_delta(now: dict[str, float] | None,
                    before: dict[str, float] | None) -> dict[str, float] | None:
    if now is None or before is None:
        return None
    return {name: max(0.0, value - before.get(name, 0.0)) for name, value in now.items()}


def _shares(values: dict[str, float] | None, total: float) -> dict[str, float] | None:
    """Each value's share of ``total`` (above 0: _reuse_from returns before a total of 0)."""
    if values is None:
        return None
    return {name: value / total for name, value in values.items()}


def _prompt_total(by_source: dict[str, float] | None, lengths: Histogram | None,
                  prompt_counter: float | None) -> float | None:
    """Prompt tokens: the by-source counters add up to them exactly (vLLM's invariant);
    else the prompt-length histogram's sum, else the prompt counter."""
    if by_source is not None:
        return sum(by_source.values())
    if lengths is not None and lengths.sum is not None:
        return lengths.sum
    return prompt_counter


def _reuse_from(prompts: float, by_source: dict[str, float] | None,
                by_tier: dict[str, float] | None, computed: float | None,
                external: tuple[float | None, float | None],
                scope: Literal["window", "lifetime"]) -> Reuse | None:
    if prompts <= 0:
        return None
    if by_source is not None and COMPUTED in by_source:
        computed = by_source[COMPUTED]
    reuse = None if computed is None else max(0.0, 1.0 - computed / prompts)
    hits, queries = external
    external_rate = hits / queries if hits is not None and queries else None
    return Reuse(scope, prompts, _shares(by_source, prompts), _shares(by_tier, prompts),
                 reuse, external_rate)


def reuse(now: EngineReading, before: EngineReading | None) -> Reuse | None:
    """Reuse over the window between the readings; since the server started without one
    (or with no prompt in it). None when nothing says where prompt KV came from."""
    if (now.prompt_tokens_by_source_total is None and now.cached_tokens_by_tier_total is None
            and now.kv_computed is None):
        return None
    if before is not None:
        by_source = _by_label_delta(now.prompt_tokens_by_source_total,
                                    before.prompt_tokens_by_source_total)
        lengths = _histogram_delta(now.prompt_lengths, before.prompt_lengths)
        prompts = _prompt_total(by_source, lengths,
                                _delta(now.prompt_tokens_total, before.prompt_tokens_total))
        if prompts:
            computed = _histogram_delta(now.kv_computed, before.kv_computed)
            return _reuse_from(
                prompts, by_source,
                _by_label_delta(now.cached_tokens_by_tier_total,
                                before.cached_tokens_by_tier_total),
                None if computed is None else computed.sum,
                (_delta(now.external_hits_total, before.external_hits_total),
                 _delta(now.external_queries_total, before.external_queries_total)), "window")
    prompts = _prompt_total(now.prompt_tokens_by_source_total, now.prompt_lengths,
                            now.prompt_tokens_total)
    return _reuse_from(prompts or 0.0, now.prompt_tokens_by_source_total,
                       now.cached_tokens_by_tier_total,
                       None if now.kv_computed is None else now.kv_computed.sum,
                       (now.external_hits_total, now.external_queries_total), "lifetime")


def _histogram_delta(now: Histogram | None, before: Histogram | None) -> Histogram | None:
    """Count and sum over the window (the buckets are not needed here)."""
    if now is None or before is None or now.sum is None or before.sum is None:
        return None
    return Histogram((), _delta(now.count, before.count), max(0.0, now.sum - before.sum))


def residency(now: EngineReading, before: EngineReading | None) -> Residency | None:
    """Quantiles of the blocks evicted in the window; since start when the window evicted
    none of the sampled blocks (or has no earlier reading, or buckets that do not line up)."""
    if now.residency is None:
        return None
    if now.residency == "off":
        return Residency("off")

    def of(name: str) -> Quantiles | None:
        histogram = getattr(now, name)
        earlier = getattr(before, name) if before is not None else None
        window = quantiles(histogram, earlier, "window") if earlier is not None else None
        return window or quantiles(histogram, None, "lifetime")

    return Residency("on", of("block_lifetime"), of("block_idle"), of("block_reuse_gap"))


def mean_prompt(now: EngineReading, before: EngineReading | None) -> float | None:
    """Tokens per prompt over the window, else since start."""
    lengths = now.prompt_lengths
    if lengths is None or lengths.sum is None:
        return None
    window = _histogram_delta(lengths, before.prompt_lengths) if before is not None else None
    if window is not None and window.count:
        return window.sum / window.count  # type: ignore[operator]
    return lengths.sum / lengths.count if lengths.count else None


def add_cache_numbers(stats: EngineStats, now: EngineReading, before: EngineReading | None,
                      dt: float | None) -> None:
    """Fill ``stats``'s cache fields from two readings ``dt`` seconds apart (``before``
    None: the first scrape, or the one after a restart)."""
    stats.waiting_by_reason = now.waiting_by_reason
    stats.kv_fetch_by_stage = now.kv_fetch_by_stage
    stats.sleep_state = now.sleep_state
    stats.reuse = reuse(now, before)
    stats.residency = residency(now, before)
    stats.mean_prompt_tokens = mean_prompt(now, before)
    if before is None or dt is None or dt <= 0:
        return
    rejections = _by_label_delta(now.admission_rejections_total,
                                 before.admission_rejections_total)
    if rejections is not None:
        stats.admission_rejections_per_s = {k: v / dt for k, v in rejections.items()}
    evicted = _delta(now.evicted_tokens_total, before.evicted_tokens_total)
    if evicted is not None:
        stats.evicted_tokens_per_s = evicted / dt
