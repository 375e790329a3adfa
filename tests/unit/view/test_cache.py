"""The KV cache for a person without a terminal (view/cache.py): the header's count of what
holds engines back, the cache pane's lines (each family's absence said as such, never as
0), the exact leak evidence told apart from the leak verdict, the channel's state while no
batch has come, the one-line form and the blocks-a-second chart of a small terminal."""

from __future__ import annotations

from dataclasses import replace

from kvtop.collect.kv_endpoint import KvChannel, KvEventsEndpoint, RankStatus
from kvtop.derive.stats import EngineStats, Quantiles, Residency, Reuse
from kvtop.derive.verdicts import LimitVerdict
from kvtop.view.cache import (
    blocks_line,
    cache_lines,
    cache_pane,
    cache_summary_line,
    exact_evidence_line,
    exact_line,
    limit_counts,
    limits_text,
    residency_lines,
    reuse_line,
    stored_tail,
    waiting_line,
)
from tests.scenarios.kv_cache import kv_event_stats as events

NOW = 10_000.0
ENDPOINT = KvEventsEndpoint("tcp://gpu-1:5557")


def text(line: list[tuple[str, str]] | None) -> str:
    assert line is not None
    return "".join(piece for piece, _ in line)


def roles(line: list[tuple[str, str]]) -> dict[str, str]:
    return {piece.strip(): role for piece, role in line}


def stats(**changes: object) -> EngineStats:
    return replace(EngineStats("m", "0", NOW), **changes)  # type: ignore[arg-type]


def test_the_header_counts_each_limit_that_holds_engines_back_in_one_order() -> None:
    engines = [stats(limit=LimitVerdict(limit, "why"))  # type: ignore[arg-type]
               for limit in ("token_budget", "kv_capacity", "none", "kv_capacity", "unknown",
                             "sleeping")]
    counts = limit_counts([*engines, stats()])
    assert counts == (("KV", 2), ("budget", 1), ("asleep", 1))  # none/unknown/no verdict: not
    assert limits_text(counts) == "KV 2 budget 1 asleep 1"
    assert limit_counts([stats(limit=LimitVerdict("none", "nothing waits"))]) == ()


def test_every_family_a_server_lacks_is_said_not_zeroed() -> None:
    lines = [text(line) for line in cache_lines(stats(), None)]
    assert lines == ["limit  not judged",
                     "blocks KV events off (no kv_events endpoint)",
                     "reuse  not exported",
                     "life   residency not exported"]
    assert text(residency_lines(stats(residency=Residency("off")))[0]) == (
        "life   residency off (vLLM --kv-cache-metrics)")


def test_the_limit_line_says_the_word_and_the_numbers_behind_it_once() -> None:
    held = stats(limit=LimitVerdict("kv_capacity", "3 wait for capacity, pool 96% used"))
    line = cache_lines(held, None)[0]
    assert text(line) == "limit  KV capacity  3 wait for capacity, pool 96% used"
    assert roles(line)["KV capacity"] == "warn"
    quiet = cache_lines(stats(limit=LimitVerdict("none", "nothing waits")), None)[0]
    assert text(quiet) == "limit  nothing waits"  # the reason says no more than the word


def test_why_requests_wait_as_the_server_says_it() -> None:
    assert waiting_line(stats(waiting_by_reason={"capacity": 0.0, "deferred": 0.0})) is None
    line = waiting_line(stats(waiting_by_reason={"deferred": 2.0, "capacity": 3.0},
                              kv_fetch_by_stage={"waiting_for_remote_kvs": 2.0},
                              admission_rejections_per_s={"max_num_queued_reqs": 0.5}))
    assert text(line) == "wait   capacity 3  deferred 2  KV fetch 2  refused 0.5/s"


def test_blocks_come_from_the_kv_events_or_the_channel_says_why_not() -> None:
    assert text(blocks_line(events(), None)) == "blocks +12 −11/s  100 cached"
    channel = KvChannel(ENDPOINT, [RankStatus(0, "connecting")])
    assert text(blocks_line(None, channel)) == "blocks KV events: waiting for tcp://gpu-1:5557"
    channel.ranks[0].state = "connected"
    assert text(blocks_line(None, channel)) == (
        "blocks KV events: connected to tcp://gpu-1:5557, no batch yet")
    channel.error = "Address already\x1b[2J in use"  # outside text: made safe
    line = blocks_line(None, channel)
    assert "\x1b" not in text(line) and roles(line)[text(line)[7:].strip()] == "bad"


def test_reuse_by_tier_from_the_metrics_else_the_events_share() -> None:
    reuse = Reuse("window", 1000.0, {"local_cache_hit": 0.4}, {"device": 0.3, "host": 0.1,
                                                              "disk": 0.0}, 0.4, 0.25)
    assert text(reuse_line(stats(reuse=reuse))) == (
        "reuse  40% of prompt  device 30%  host 10%  connector hits 25%")
    assert text(reuse_line(stats(kv_events=events()))) == "reuse  10% of chains  (KV events)"


def test_residency_from_vllm_else_the_age_at_eviction_the_events_measure() -> None:
    lifetime = Quantiles(2.0, 8.0, 30.0, 40, "window")
    on = stats(residency=Residency("on", lifetime, None, Quantiles(0.5, 1, 2, 9, "lifetime")))
    assert [text(line) for line in residency_lines(on)] == [
        "life   p50 2.0s p99 30.0s", "idle   no block evicted yet  reuse gap p50 500ms"]
    aged = stats(kv_events=events(age_at_eviction=Quantiles(1.0, 2.0, 3.0, 5, "lifetime")))
    assert text(residency_lines(aged)[0]) == "life   p50 1.0s p99 3.0s (since start)  (KV events)"


def test_the_exact_evidence_is_its_own_loud_line_beside_the_leak_verdict() -> None:
    found = events(leak="evidence", leaked_blocks=31, turnovers=3.5, leaked_sample=(7,))
    line = exact_line(found)
    assert text(line) == "exact  EVIDENCE 31 blocks unused 3+ turnovers (oldest 3.5)"
    assert roles(line)["EVIDENCE"] == "alarm"
    head = exact_evidence_line(stats(kv_events=found))
    assert text(head).startswith("KV events EVIDENCE 31 blocks")
    assert "its own witness, not the leak verdict" in text(head)
    assert exact_evidence_line(stats(kv_events=events())) is None  # no row for "no leak"
    assert text(exact_line(events())) == "exact  no leak  4.2 turnovers seen"
    assert text(exact_line(events(leak="too_early", turnovers=1.25))) == (
        "exact  too early: 1.2 of 3 turnovers seen")
    assert text(exact_line(events(leak="unknown", turnovers=None))) == "exact  no pool size yet"


def test_what_the_channel_lost_is_told_the_evidence_being_partial() -> None:
    partial = events(lost_batches=3, restarts=1, index_dropped=12_000)
    channel = KvChannel(ENDPOINT, [RankStatus(0, "connected", gaps=2, recovered=2)])
    assert text(cache_lines(stats(kv_events=partial), channel)[-1]) == (
        "events 3 lost · 1 restarts · 12.0k dropped")
    # gaps replay filled are no loss: no row for them
    assert text(cache_lines(stats(kv_events=events()), channel)[-1]).startswith("exact")
    channel.ranks[0].state = "disconnected"
    assert text(cache_lines(stats(kv_events=events()), channel)[-1]) == (
        "events KV events: tcp://gpu-1:5557 went away")


def test_a_small_terminal_folds_the_pane_into_one_line() -> None:
    assert cache_summary_line(stats(), None) is None  # nothing known: no row
    held = stats(limit=LimitVerdict("max_sequences", "at 64"),
                 kv_events=events(leak="evidence", leaked_blocks=8))
    assert text(cache_summary_line(held, None)) == (
        "cache limit max seqs  reuse 10% of chains  exact EVIDENCE 8 blocks")
    waiting = cache_summary_line(stats(), KvChannel(ENDPOINT))
    assert text(waiting) == "cache KV events: waiting for tcp://gpu-1:5557"


def test_the_blocks_chart_needs_a_scrape_that_carried_events() -> None:
    history = [stats(t=NOW - 10), stats(t=NOW - 5, kv_events=events()), stats(t=NOW)]
    chart = cache_pane(history, NOW, 300.0)
    assert chart is not None
    stored, removed = chart.series
    assert [v for _, v in stored.points] == [None, 12.5, None]  # a gap, never a 0
    assert [v for _, v in removed.points] == [None, 11.0, None]
    assert cache_pane([stats()], NOW, 300.0) is None


# -- every piece with its role: the pane's colours are part of what it says ---------------

URL_60 = "tcp://" + "g" * 49 + ":5557"  # as long as the channel's URL may show whole


def test_an_empty_engine_s_pane_says_each_absence_dimmed_under_its_key() -> None:
    assert cache_lines(stats(), None) == [
        [("limit  ", "key"), ("not judged", "dim")],
        [("blocks ", "key"), ("KV events off (no kv_events endpoint)", "dim")],
        [("reuse  ", "key"), ("not exported", "dim")],
        [("life   ", "key"), ("residency not exported", "dim")]]
    assert residency_lines(stats(residency=Residency("off"))) == [
        [("life   ", "key"), ("residency off (vLLM --kv-cache-metrics)", "dim")]]


def test_the_limit_word_takes_the_column_s_level_and_its_reason_is_dimmed() -> None:
    held = stats(limit=LimitVerdict("kv_capacity", "3 wait"))
    assert cache_lines(held, None)[0] == [
        ("limit  ", "key"), ("KV capacity", "warn"), ("  3 wait", "dim")]
    quiet = stats(limit=LimitVerdict("none", "nothing waits"))
    assert cache_lines(quiet, None)[0] == [
        ("limit  ", "key"), ("nothing waits", "dim"), ("", "dim")]


def test_the_pane_with_events_has_every_line_in_order() -> None:
    engine = stats(waiting_by_reason={"capacity": 3.0}, kv_events=events(lost_batches=2))
    assert cache_lines(engine, None) == [
        [("limit  ", "key"), ("not judged", "dim")],
        [("wait   ", "key"), ("capacity 3", "")],
        [("blocks ", "key"), ("+12", "s1"), (" −11/s", "s2"), ("  100 cached", "")],
        [("reuse  ", "key"), ("10% of chains", ""), ("  (KV events)", "dim")],
        [("life   ", "key"), ("residency not exported", "dim")],
        [("exact  ", "key"), ("no leak", "ok"), ("  4.2 turnovers seen", "dim")],
        [("events ", "key"), ("2 lost", "warn")]]


def test_a_waiting_reason_is_cut_at_20_characters() -> None:
    whole, cut = "r" * 20, "r" * 21
    assert waiting_line(stats(waiting_by_reason={whole: 1.0})) == [
        ("wait   ", "key"), (f"{whole} 1", "")]
    assert waiting_line(stats(waiting_by_reason={cut: 1.0})) == [
        ("wait   ", "key"), ("r" * 19 + "… 1", "")]


def test_the_channel_s_state_has_its_level_and_cuts_outside_text() -> None:
    channel = KvChannel(KvEventsEndpoint(URL_60), [RankStatus(0, "connecting")])
    assert blocks_line(None, channel) == [
        ("blocks ", "key"), (f"KV events: waiting for {URL_60}", "dim")]
    channel.ranks[0].state = "connected"
    assert blocks_line(None, channel)[1] == (
        f"KV events: connected to {URL_60}, no batch yet", "dim")
    channel.ranks[0].state = "disconnected"
    assert blocks_line(None, channel)[1] == (f"KV events: {URL_60} went away", "warn")
    longer = KvChannel(KvEventsEndpoint(URL_60 + "7"), [RankStatus(0, "connecting")])
    assert blocks_line(None, longer)[1] == (f"KV events: waiting for {URL_60[:59]}…", "dim")
    channel.error = "e" * 80
    assert blocks_line(None, channel)[1] == (f"KV events failed: {'e' * 80}", "bad")
    channel.error = "e" * 81
    assert blocks_line(None, channel)[1] == (f"KV events failed: {'e' * 79}…", "bad")


def test_reuse_tiers_biggest_first_at_most_four_each_name_cut_at_12() -> None:
    tiers = {"a": 0.05, "b": 0.1, "c": 0.2, "d": 0.3, "twelve_chars": 0.4, "thirteen_char": 0.01}
    reuse = Reuse("window", 1000.0, None, tiers, 0.5, None)
    assert reuse_line(stats(reuse=reuse)) == [
        ("reuse  ", "key"), ("50% of prompt", ""),
        ("  twelve_chars 40%  d 30%  c 20%  b 10%", "dim")]
    cut = Reuse("window", 1000.0, None, {"thirteen_char": 0.2}, 0.5, None)
    assert reuse_line(stats(reuse=cut))[2] == ("  thirteen_ch… 20%", "dim")
    bare = Reuse("window", 1000.0, None, None, 0.5, None)
    assert reuse_line(stats(reuse=bare))[2] == ("", "dim")  # no tier, no connector: nothing
    assert reuse_line(stats(kv_events=events())) == [
        ("reuse  ", "key"), ("10% of chains", ""), ("  (KV events)", "dim")]


def test_residency_lines_with_their_roles_and_an_unknown_reuse_gap() -> None:
    on = stats(residency=Residency("on", Quantiles(2.0, 8.0, 30.0, 40, "window"),
                                   Quantiles(1.0, 2.0, 4.0, 40, "window"), None))
    assert residency_lines(on) == [
        [("life   ", "key"), ("p50 2.0s p99 30.0s", "")],
        [("idle   ", "key"), ("p50 1.0s p99 4.0s", ""), ("  reuse gap p50 –", "dim")]]
    aged = stats(kv_events=events(age_at_eviction=Quantiles(1.0, 2.0, 3.0, 5, "window")))
    assert residency_lines(aged) == [
        [("life   ", "key"), ("p50 1.0s p99 3.0s", ""), ("  (KV events)", "dim")]]


def test_the_exact_line_in_each_state_with_its_roles() -> None:
    assert exact_line(events(leak="evidence", leaked_blocks=31, turnovers=3.5)) == [
        ("exact  ", "key"), ("EVIDENCE", "alarm"),
        (" 31 blocks unused 3+ turnovers (oldest 3.5)", "bad")]
    assert exact_line(events(leak="evidence", leaked_blocks=31, turnovers=None))[2] == (
        " 31 blocks unused 3+ turnovers", "bad")  # no pool turnover known: no "oldest"
    assert exact_line(events(leak="none", turnovers=None)) == [
        ("exact  ", "key"), ("no leak", "ok"), ("  0.0 turnovers seen", "dim")]
    assert exact_line(events(leak="too_early", turnovers=1.25)) == [
        ("exact  ", "key"), ("too early: 1.2 of 3 turnovers seen", "dim")]
    assert exact_line(events(leak="unknown", turnovers=2.0)) == [
        ("exact  ", "key"), ("no pool size yet", "dim")]


def test_a_failed_channel_leads_what_it_lost() -> None:
    partial = events(lost_batches=3, malformed=2)
    channel = KvChannel(ENDPOINT, [RankStatus(0, "disconnected")])
    assert cache_lines(stats(kv_events=partial), channel)[-1] == [
        ("events ", "key"),
        ("KV events: tcp://gpu-1:5557 went away · 3 lost · 2 malformed", "warn")]
    channel.error = "refused"
    assert cache_lines(stats(kv_events=partial), channel)[-1][1] == (
        "KV events failed: refused · 3 lost · 2 malformed", "warn")


def test_the_evidence_over_the_charts_is_the_exact_line_said_as_its_own_witness() -> None:
    found = events(leak="evidence", leaked_blocks=8, turnovers=None)
    assert exact_evidence_line(stats(kv_events=found)) == [
        ("KV events ", "key"), ("EVIDENCE", "alarm"), (" 8 blocks unused 3+ turnovers", "bad"),
        ("  (its own witness, not the leak verdict)", "dim")]


def test_the_one_line_form_with_everything_known() -> None:
    engine = stats(limit=LimitVerdict("kv_capacity", "3 wait"),
                   reuse=Reuse("window", 1000.0, None, None, 0.5, None),
                   residency=Residency("on", Quantiles(2.0, 8.0, 30.0, 40, "window"), None, None),
                   kv_events=events())
    assert cache_summary_line(engine, KvChannel(ENDPOINT)) == [
        ("cache ", "key"), ("limit ", "key"), ("KV cap", "warn"), ("  ", ""),
        ("reuse ", "key"), ("50% of prompt", ""), ("  ", ""),
        ("life ", "key"), ("p50 2.0s p99 30.0s", ""), ("  ", ""),
        ("exact ", "key"), ("no leak", "ok")]
    # a limit that holds nothing back, and a dimmed (unknown) reuse and life: left out
    quiet = stats(limit=LimitVerdict("none", "nothing waits"), residency=Residency("off"),
                  kv_events=events(leak="evidence", leaked_blocks=8))
    assert cache_summary_line(quiet, None) == [
        ("cache ", "key"), ("reuse ", "key"), ("10% of chains", ""), ("  ", ""),
        ("exact ", "key"), ("EVIDENCE 8 blocks", "alarm")]


def test_the_one_line_form_s_exact_witness_before_it_can_judge() -> None:
    def short(**changes: object) -> tuple[str, str]:
        line = cache_summary_line(stats(kv_events=events(**changes)), None)
        assert line is not None
        return line[-1]

    assert short(leak="too_early", turnovers=1.25) == ("1.2/3 turnovers", "dim")
    assert short(leak="unknown", turnovers=None) == ("no pool size yet", "dim")
    assert short(leak="none", turnovers=None) == ("no leak", "ok")


def test_the_blocks_chart_s_series_and_span() -> None:
    chart = cache_pane([stats(kv_events=events())], NOW, 300.0)
    assert chart is not None
    assert (chart.now, chart.span_s) == (NOW, 300.0)
    assert [(s.label, s.role, list(s.points)) for s in chart.series] == [
        ("stored", "s1", [(NOW, 12.5)]), ("removed", "s2", [(NOW, 11.0)])]


def test_the_blocks_tail_beside_the_sparkline() -> None:
    assert stored_tail(stats()) == [("–", "dim")]
    assert stored_tail(stats(kv_events=events())) == [("+12", "s1"), (" −11 blk/s", "s2")]
