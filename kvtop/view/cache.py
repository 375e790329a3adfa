"""The KV cache's own numbers for a person (docs/kv-anatomy.md): what limits each engine
(the LIMIT column and the header's count), the cache pane's lines (what limits it, block
traffic from its KV events, reuse by tier, residency, the exact leak evidence, the channel),
its sparkline of blocks stored a second, and the one-line forms a small terminal shows.

Unknown, absent and disabled are said as such, never as 0: a family the server does not
export reads "not exported", residency without vLLM's --kv-cache-metrics "off", a target
without a kv_events endpoint "KV events off". The exact leak evidence is its own witness,
shown apart from the leak verdict and never merged into it. Outside text (a channel's
error, tier and reason labels from the server) goes through display_text here.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import TYPE_CHECKING

from kvtop.safe_text import display_text
from kvtop.view import format as fmt
from kvtop.view.cells import HEADER_LIMITS, LIMIT_CELL, limit_cell
from kvtop.view.chart import Chart, Series

if TYPE_CHECKING:
    from kvtop.collect.kv_endpoint import KvChannel
    from kvtop.derive.stats import EngineStats, KvEventStats, Quantiles, Reuse

Piece = tuple[str, str]
Line = list[Piece]

LIMIT_WORDS: dict[str, str] = {
    "kv_capacity": "KV capacity", "max_sequences": "max sequences",
    "token_budget": "token budget", "deferred": "deferred", "kv_transfer": "KV transfer",
    "sleeping": "sleeping", "none": "nothing waits", "unknown": "unknown"}
EXACT_TURNOVERS = 3  # AnatomyParams.leak_turnovers: full pool turnovers a block goes unused
MAX_TIERS = 4  # cache tiers named on one line


# -- the header's count ------------------------------------------------------------------


def limit_counts(engines: Iterable[EngineStats]) -> tuple[tuple[str, int], ...]:
    """(header word, engines) for each limit that holds some engine back, in header order."""
    counts: dict[str, int] = {}
    for stats in engines:
        if stats.limit is not None and stats.limit.limit in HEADER_LIMITS:
            counts[stats.limit.limit] = counts.get(stats.limit.limit, 0) + 1
    return tuple((word, counts[limit]) for limit, word in HEADER_LIMITS.items()
                 if limit in counts)


def limits_text(counts: Sequence[tuple[str, int]]) -> str:
    return " ".join(f"{word} {count}" for word, count in counts)


# -- the cache pane -----------------------------------------------------------------------


def cache_lines(stats: EngineStats, channel: KvChannel | None) -> list[Line]:
    """The pane's lines, most telling first (a short pane keeps the first)."""
    lines = [limit_line(stats)]
    waiting = waiting_line(stats)
    if waiting is not None:
        lines.append(waiting)
    lines += [blocks_line(stats.kv_events, channel), reuse_line(stats),
              *residency_lines(stats)]
    events = stats.kv_events
    if events is not None:
        lines.append(exact_line(events))
        trouble = channel_trouble(events, channel)
        if trouble is not None:
            lines.append([("events ", "key"), (trouble, "warn")])
    return lines


def limit_line(stats: EngineStats) -> Line:
    verdict = stats.limit
    if verdict is None:
        return [("limit  ", "key"), ("not judged", "dim")]
    cell, word = limit_cell(stats), LIMIT_WORDS[verdict.limit]
    reason = display_text(verdict.reason)
    return [("limit  ", "key"), (word, cell.level or ""),
            ("" if reason == word else f"  {reason}", "dim")]


def waiting_line(stats: EngineStats) -> Line | None:
    """Why requests wait, as the server says (vLLM 0.20+), and KV fetches and admissions
    refused; None when it says none of it or nothing waits."""
    parts = [f"{display_text(reason, 20)} {fmt.count(count)}"
             for reason, count in sorted((stats.waiting_by_reason or {}).items()) if count]
    fetching = sum((stats.kv_fetch_by_stage or {}).values())
    if fetching:
        parts.append(f"KV fetch {fmt.count(fetching)}")
    refused = sum((stats.admission_rejections_per_s or {}).values())
    if refused:
        parts.append(f"refused {fmt.rate(refused)}/s")
    return [("wait   ", "key"), ("  ".join(parts), "")] if parts else None


def blocks_line(events: KvEventStats | None, channel: KvChannel | None) -> Line:
    """Blocks stored and removed a second and cached now, from the KV events; else why
    there are none."""
    if events is not None:
        return [("blocks ", "key"), (f"+{fmt.rate(events.stored_per_s)}", "s1"),
                (f" −{fmt.rate(events.removed_per_s)}/s", "s2"),
                (f"  {fmt.count(events.population)} cached", "")]
    return [("blocks ", "key"), channel_state(channel)]


def channel_state(channel: KvChannel | None) -> Piece:
    """What a target's KV event channel says while no batch has come for an engine."""
    if channel is None:
        return "KV events off (no kv_events endpoint)", "dim"
    where = display_text(channel.endpoint.url, 60)
    state = channel.state
    if state == "failed":
        return f"KV events failed: {display_text(channel.error, 80)}", "bad"
    if state == "connected":
        return f"KV events: connected to {where}, no batch yet", "dim"
    if state == "disconnected":
        return f"KV events: {where} went away", "warn"
    return f"KV events: waiting for {where}", "dim"


def reuse_line(stats: EngineStats) -> Line:
    """Prompt KV found cached (vLLM's by-source counters) and the tiers it came from; else
    the KV events' share of chains grown from a cached prefix."""
    reuse = stats.reuse
    if reuse is not None and reuse.reuse_share is not None:
        return [("reuse  ", "key"), (f"{fmt.percent(reuse.reuse_share)} of prompt", ""),
                (tiers_text(reuse), "dim")]
    events = stats.kv_events
    if events is not None and events.reuse_share is not None:
        return [("reuse  ", "key"), (f"{fmt.percent(events.reuse_share)} of chains", ""),
                ("  (KV events)", "dim")]
    return [("reuse  ", "key"), ("not exported", "dim")]


def tiers_text(reuse: Reuse) -> str:
    tiers = sorted((reuse.cached_by_tier or {}).items(), key=lambda item: -item[1])
    shown = "  ".join(f"{display_text(name, 12)} {fmt.percent(share)}"
                      for name, share in tiers[:MAX_TIERS] if share)
    external = reuse.external_hit_rate
    if external is not None:
        shown += f"  connector hits {fmt.percent(external)}"
    return f"  {shown}" if shown else ""


def quantiles_text(q: Quantiles | None) -> str:
    if q is None:
        return "no block evicted yet"
    text = f"p50 {fmt.seconds(q.p50)} p99 {fmt.seconds(q.p99)}"
    return text if q.scope == "window" else f"{text} (since start)"


def residency_lines(stats: EngineStats) -> list[Line]:
    """vLLM's sampled residency (--kv-cache-metrics); else the age at eviction the KV
    events measure; else why neither is known."""
    residency, events = stats.residency, stats.kv_events
    if residency is not None and residency.state == "on":
        return [[("life   ", "key"), (quantiles_text(residency.lifetime), "")],
                [("idle   ", "key"), (quantiles_text(residency.idle), ""),
                 (f"  reuse gap p50 {fmt.seconds(_p50(residency.reuse_gap))}", "dim")]]
    if events is not None and events.age_at_eviction is not None:
        return [[("life   ", "key"), (quantiles_text(events.age_at_eviction), ""),
                 ("  (KV events)", "dim")]]
    if residency is not None:  # "off": the server has the histograms, not switched on
        return [[("life   ", "key"), ("residency off (vLLM --kv-cache-metrics)", "dim")]]
    return [[("life   ", "key"), ("residency not exported", "dim")]]


def _p50(q: Quantiles | None) -> float | None:
    return None if q is None else q.p50


def exact_line(events: KvEventStats) -> Line:
    """The KV events' own leak witness: blocks unused for 3+ full turnovers of the pool."""
    if events.leak == "evidence":
        oldest = f" (oldest {events.turnovers:.1f})" if events.turnovers is not None else ""
        return [("exact  ", "key"), ("EVIDENCE", "alarm"),
                (f" {fmt.count(events.leaked_blocks)} blocks unused {EXACT_TURNOVERS}+ "
                 f"turnovers{oldest}", "bad")]
    if events.leak == "none":
        return [("exact  ", "key"), ("no leak", "ok"),
                (f"  {events.turnovers or 0:.1f} turnovers seen", "dim")]
    if events.leak == "too_early" and events.turnovers is not None:
        return [("exact  ", "key"), (f"too early: {events.turnovers:.1f} of "
                                     f"{EXACT_TURNOVERS} turnovers seen", "dim")]
    return [("exact  ", "key"), ("no pool size yet", "dim")]


def channel_trouble(events: KvEventStats, channel: KvChannel | None) -> str | None:
    """What the channel lost or could not read, when it did: the evidence is partial (a gap
    replay filled is no loss: the detail counts those)."""
    counts = [("lost", events.lost_batches), ("malformed", events.malformed),
              ("restarts", events.restarts), ("dropped", events.index_dropped)]
    told = [f"{fmt.count(n)} {name}" for name, n in counts if n]
    if channel is not None and channel.state in ("failed", "disconnected"):
        told.insert(0, channel_state(channel)[0])
    return " · ".join(told) or None


# -- a small terminal: a line and a sparkline --------------------------------------------


def exact_evidence_line(stats: EngineStats) -> Line | None:
    """The exact leak evidence over the charts, only when there is some: a witness of its
    own beside the leak verdict's line."""
    events = stats.kv_events
    if events is None or events.leak != "evidence":
        return None
    return [("KV events ", "key"), *exact_line(events)[1:],
            ("  (its own witness, not the leak verdict)", "dim")]


def cache_summary_line(stats: EngineStats, channel: KvChannel | None) -> Line | None:
    """The cache pane in one line: limit, reuse, lifetime, and the exact witness or the
    channel's state; None when none of it is known."""
    line: Line = []
    if stats.limit is not None and stats.limit.limit in HEADER_LIMITS:
        line += [("limit ", "key"), (LIMIT_CELL[stats.limit.limit], "warn"), ("  ", "")]
    reuse = reuse_line(stats)
    if reuse[1][1] != "dim":
        line += [("reuse ", "key"), reuse[1], ("  ", "")]
    life = residency_lines(stats)[0]
    if life[1][1] != "dim":
        line += [("life ", "key"), life[1], ("  ", "")]
    events = stats.kv_events
    if events is not None:
        line += [("exact ", "key"), _exact_short(events)]
    elif channel is not None:
        line.append(channel_state(channel))
    return [("cache ", "key"), *line] if line else None


def _exact_short(events: KvEventStats) -> Piece:
    if events.leak == "evidence":
        return f"EVIDENCE {fmt.count(events.leaked_blocks)} blocks", "alarm"
    if events.leak == "none":
        return "no leak", "ok"
    if events.turnovers is not None:
        return f"{events.turnovers:.1f}/{EXACT_TURNOVERS} turnovers", "dim"
    return "no pool size yet", "dim"


def cache_pane(history: Sequence[EngineStats], now: float, span_s: float) -> Chart | None:
    """Blocks stored and removed a second over the history (the small terminal's "blk"
    sparkline); None when no scrape in it carried KV events."""
    def rate(name: str) -> list[tuple[float, float | None]]:
        return [(s.t, getattr(s.kv_events, name) if s.kv_events is not None else None)
                for s in history]

    stored, removed = rate("stored_per_s"), rate("removed_per_s")
    if all(v is None for _, v in stored):
        return None
    return Chart((Series("stored", "s1", stored), Series("removed", "s2", removed)), now,
                 span_s)


def stored_tail(stats: EngineStats) -> Line:
    events = stats.kv_events
    if events is None:
        return [(fmt.DASH, "dim")]
    return [(f"+{fmt.rate(events.stored_per_s)}", "s1"),
            (f" −{fmt.rate(events.removed_per_s)} blk/s", "s2")]
