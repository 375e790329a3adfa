"""The detail view's KV cache lines (docs/kv-anatomy.md): what limits the engine and the
numbers behind it, why requests wait, reuse by source and tier, vLLM's residency quantiles,
and, from its KV events, block traffic, ages at eviction, the hottest prefixes (as block
hashes and token counts, never token text), the exact leak evidence with the blocks it
names (a witness of its own: the leak verdict above never counts it), and the channel.

Plain strings, as the rest of the detail's text; outside text through display_text.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from kvtop.derive.worst import block_hash_text
from kvtop.safe_text import display_text as shown
from kvtop.view import format as fmt
from kvtop.view.cache import LIMIT_WORDS, channel_state, quantiles_text

if TYPE_CHECKING:
    from collections.abc import Callable

    from kvtop.collect.kv_endpoint import KvChannel
    from kvtop.derive.stats import EngineStats, KvEventStats, Quantiles, Residency, Reuse

MAX_LABELS = 8  # names of one family on a line (the adapters keep at most 8 per engine)
LEAKED_SHOWN = 4  # block hashes of the exact evidence named


def cache_detail_lines(stats: EngineStats, channel: KvChannel | None) -> list[str]:
    return [*limit_lines(stats), *reuse_lines(stats.reuse), *residency_lines(stats.residency),
            *event_lines(stats.kv_events, channel)]


def _evidence(evidence: dict[str, float | str]) -> str:
    return "  ".join(f"{shown(k)}={v:.4g}" if isinstance(v, float) else f"{shown(k)}={shown(v)}"
                     for k, v in evidence.items())


def _labels(values: dict[str, float] | None, form: Callable[[float], str] = fmt.count) -> str:
    """Names biggest first, each with its value in ``form`` (a count, a rate, a share)."""
    if values is None:
        return "not exported"
    items = sorted(values.items(), key=lambda item: -item[1])[:MAX_LABELS]
    return "  ".join(f"{shown(name, 24)} {form(v)}" for name, v in items) or "none"


def limit_lines(stats: EngineStats) -> list[str]:
    verdict = stats.limit
    if verdict is None:
        return ["limit   not judged for this server"]
    word, reason = LIMIT_WORDS[verdict.limit], shown(verdict.reason)
    lines = [f"limit   {word}" + ("" if reason == word else f"  {reason}")]
    if verdict.evidence and verdict.limit != "none":
        lines.append(f"        {_evidence(verdict.evidence)}")
    lines.append(f"waiting by reason {_labels(stats.waiting_by_reason)}"
                 f"   KV fetch {_labels(stats.kv_fetch_by_stage)}"
                 f"   refused/s {_labels(stats.admission_rejections_per_s, fmt.rate)}"
                 f"   sleep {shown(stats.sleep_state or 'not exported')}")
    return lines


def reuse_lines(reuse: Reuse | None) -> list[str]:
    if reuse is None:
        return ["reuse   not exported (vLLM 0.16+: prompt tokens by source)"]
    scope = "window" if reuse.scope == "window" else "since start"
    external = ("" if reuse.external_hit_rate is None
                else f"   connector hits {fmt.percent(reuse.external_hit_rate)}")
    return [f"reuse   {fmt.percent(reuse.reuse_share)} of {fmt.count(reuse.prompt_tokens)} "
            f"prompt tokens not computed ({scope})   by source "
            f"{_labels(reuse.by_source, fmt.percent)}",
            f"        by tier {_labels(reuse.cached_by_tier, fmt.percent)}{external}"]


def _q3(q: Quantiles | None) -> str:
    if q is None:
        return "none evicted yet"
    text = "/".join(fmt.seconds(getattr(q, p)) for p in ("p50", "p90", "p99"))
    return text if q.scope == "window" else f"{text} (since start)"


def residency_lines(residency: Residency | None) -> list[str]:
    if residency is None:
        return ["resid.  not exported (vLLM 0.12+ with --kv-cache-metrics)"]
    if residency.state == "off":
        return ["resid.  off: start vLLM with --kv-cache-metrics"]
    return [f"resid.  p50/p90/p99  lifetime {_q3(residency.lifetime)}   idle before evict "
            f"{_q3(residency.idle)}   reuse gap {_q3(residency.reuse_gap)}"]


def event_lines(events: KvEventStats | None, channel: KvChannel | None) -> list[str]:
    if events is None:
        return [f"events  {channel_state(channel)[0]}"]
    hot = "  ".join(f"{block_hash_text(h.block_hash)} {fmt.count(h.tokens)} tok ×{h.reuses}"
                    for h in events.hot) or "none yet"
    media = "  ".join(f"{shown(name, 12)} +{fmt.count(s)}/−{fmt.count(r)}"
                      for name, (s, r) in events.by_medium.items())
    return [
        f"events  stored {fmt.count(events.stored_total)} (+{fmt.rate(events.stored_per_s)}/s)"
        f"  removed {fmt.count(events.removed_total)} (−{fmt.rate(events.removed_per_s)}/s)"
        f"  cached {fmt.count(events.population)}  reuses {fmt.count(events.reuses)}"
        f" ({fmt.percent(events.reuse_share)} of chains)  cleared {events.cleared}",
        f"        age at eviction {quantiles_text(events.age_at_eviction)}   media {media}",
        f"        hot prefixes {hot}",
        *exact_lines(events),
        channel_line(events, channel),
    ]


def exact_lines(events: KvEventStats) -> list[str]:
    """The exact leak evidence, said as its own witness."""
    head = {"evidence": "EVIDENCE", "none": "none", "too_early": "too early",
            "unknown": "unknown"}[events.leak]
    lines = [f"exact   {head}  {shown(events.leak_reason)}   pool "
             f"{fmt.count(events.pool_blocks)}   turnovers "
             f"{'–' if events.turnovers is None else f'{events.turnovers:.2f}'}"]
    if events.leak == "evidence":
        named = "  ".join(block_hash_text(k) for k in events.leaked_sample[:LEAKED_SHOWN])
        lines.append(f"        longest unused {named}   (its own witness: the leak verdict "
                     "above does not count it)")
    return lines


def channel_line(events: KvEventStats, channel: KvChannel | None) -> str:
    seen = (f"seq {events.last_seq} (first {events.first_seq})  lost {events.lost_batches}"
            f"  malformed {events.malformed}  unknown events {events.unknown_events}"
            f"  restarts {events.restarts}  index dropped {fmt.count(events.index_dropped)}"
            f"  removed unknown {fmt.count(events.removed_unknown)}")
    if channel is None:
        return f"channel {seen}"
    return (f"channel {shown(channel.endpoint.url, 60)} {channel.state}  {seen}  gaps "
            f"{channel.total('gaps')} recovered {channel.total('recovered')}  bad frames "
            f"{channel.total('bad_frames')}")
