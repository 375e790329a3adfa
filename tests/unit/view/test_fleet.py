"""The fleet view's rules without a terminal: columns by width, labels, summary, dashes."""

from __future__ import annotations

import dataclasses
from dataclasses import replace

from kvtop.collect.target import Target
from kvtop.derive.stats import EngineStats, Quantiles
from kvtop.derive.tracker import TargetState
from kvtop.derive.verdicts import LeakVerdict, StallVerdict
from kvtop.ui.widgets.engine_panel import kv_points
from kvtop.ui.widgets.fleet_table import fit
from kvtop.view import format as fmt
from kvtop.view.fleet import (
    Cell,
    RowCache,
    build_rows,
    filter_rows,
    leak_cell,
    leak_changes,
    order_rows,
    summarise,
    visible_columns,
)
from tests.scenarios.app import LEAKING, QUIET

NOW = 1000.0


def _up(spec: str, *engines: EngineStats) -> TargetState:
    return TargetState(Target.from_spec(spec), "up", kind="vllm", engines=list(engines),
                       last_good_t=NOW)


def test_narrow_terminal_keeps_the_essential_columns() -> None:
    assert [c.key for c in visible_columns(78)] == [
        "name", "status", "kv", "leak", "running", "waiting"
    ]
    assert len(visible_columns(220)) == 12
    assert [c.key for c in visible_columns(10)] == ["name", "status", "kv", "leak"]


def test_unknown_values_are_dashes_never_zero() -> None:
    [row] = build_rows([_up("h:1", EngineStats("m", None, NOW))], NOW)
    for key in ("kv", "leak", "running", "waiting", "preempt", "hit", "prompt", "gen", "ttft"):
        assert row.cells[key].text == fmt.DASH


def test_several_engines_are_named_apart() -> None:
    state = _up("h:1", EngineStats("m", "0", NOW), EngineStats("m", "1", NOW))
    assert [r.name for r in build_rows([state], NOW)] == ["h:1 e0", "h:1 e1"]


def test_status_ages() -> None:
    target = Target.from_spec("h:1")
    stale = TargetState(target, "stale", last_good_t=NOW - 12)
    down = TargetState(target, "timeout", last_good_t=NOW - 300)
    never = TargetState(target, "auth", error="401: token rejected")
    cells = [build_rows([s], NOW)[0].cells for s in (stale, down, never)]
    # a failed scrape says so at once ("down"), with the age of the last good one
    assert [c["status"].text for c in cells] == ["down 12s", "timeout 5m", "auth"]
    assert cells[2]["model"].text == "401: token rejected"


def test_summary_weights_kv_by_capacity() -> None:
    big = EngineStats("m", None, NOW, kv_usage=0.5, blocks_total=1000, blocks_used=500, running=3)
    small = EngineStats("m", None, NOW, kv_usage=1.0, blocks_total=100, blocks_used=100, waiting=4)
    down = TargetState(Target.from_spec("h:3"), "down")
    summary = summarise([_up("h:1", big), _up("h:2", small), down])
    assert (summary.hosts_up, summary.hosts_total) == (2, 3)
    assert summary.kv_usage == 600 / 1100
    assert (summary.running, summary.waiting) == (3, 4)


def test_sort_and_filter() -> None:
    rows = build_rows([
        _up("a:1", EngineStats("llama", None, NOW, kv_usage=0.2)),
        _up("b:1", EngineStats("qwen", None, NOW, kv_usage=0.9)),
        _up("c:1", EngineStats("qwen", None, NOW)),
    ], NOW)
    assert [r.name for r in order_rows(rows, "kv")] == ["b:1", "a:1", "c:1"]
    assert [r.name for r in filter_rows(rows, "QWEN c:1")] == ["c:1"]


def test_worst_first_leaks_then_trouble_then_fullest() -> None:
    def judged(state: str, usage: float) -> EngineStats:
        verdict = LeakVerdict(state, "why", None, None, None)
        return EngineStats("m", None, NOW, kv_usage=usage, leak=verdict)

    rows = build_rows([
        _up("full:1", EngineStats("m", None, NOW, kv_usage=0.9)),
        _up("low:1", EngineStats("m", None, NOW, kv_usage=0.2)),
        TargetState(Target.from_spec("down:1"), "down", last_good_t=NOW - 60),
        TargetState(Target.from_spec("stale:1"), "stale", last_good_t=NOW - 20,
                    engines=[EngineStats("m", None, NOW - 20, kv_usage=0.5)]),
        _up("watch:1", judged("watch", 0.1)),
        _up("leak:1", judged("leak", 0.05)),
        _up("fuller-leak:1", judged("leak", 0.6)),
        TargetState(Target.from_spec("new:1")),
    ], NOW)
    assert [r.name for r in order_rows(rows, "worst")] == [
        "fuller-leak:1", "leak:1", "watch:1", "stale:1", "down:1", "full:1", "low:1", "new:1",
    ]


def test_row_cache_rebuilds_only_what_changed() -> None:
    quiet = _up("a:1", EngineStats("m", None, NOW, kv_usage=0.2))
    busy = _up("b:1", EngineStats("m", None, NOW, kv_usage=0.4))
    stale = TargetState(Target.from_spec("c:1"), "stale", last_good_t=NOW - 5,
                        engines=[EngineStats("m", None, NOW - 5, kv_usage=0.3)])
    cache = RowCache()
    first = cache.rows([quiet, busy, stale], NOW)
    busy.engines = [dataclasses.replace(busy.engines[0], kv_usage=0.7)]  # a new scrape
    busy.last_good_t = NOW + 1
    second = cache.rows([quiet, busy, stale], NOW + 1)
    assert second[0] is first[0]  # nothing new: the same row, not even re-formatted
    assert second[1] is not first[1] and second[1].cells["kv"].text.endswith(" 70%")
    assert second[2].cells["status"].text == "down 6s"  # its age keeps counting
    assert [r.cells for r in second] == [r.cells for r in build_rows([quiet, busy, stale],
                                                                     NOW + 1)]


def test_bar_has_eighth_cell_resolution_never_hides_use_or_claims_full() -> None:
    assert fmt.bar(0.01) == "▏░░░░"
    assert fmt.bar(0.98) == "████▉" != fmt.bar(0.75) == "███▊░"  # 98 % never looks like 75 %
    assert fmt.bar(0.999) == "████▉"  # only a full pool fills every cell
    assert fmt.bar(1.0) == "█████"
    assert fmt.bar(0.5, 20) == "█" * 10 + "░" * 10
    assert fmt.kv_cell(None, None, None) == fmt.DASH


def _cells_of(state: TargetState) -> dict[str, Cell]:
    return build_rows([state], NOW)[0].cells


def test_a_404_reads_not_found_and_never_answered_has_no_age() -> None:
    target = Target.from_spec("h:1")
    missing = TargetState(target, "bad_payload", failure="bad_payload",
                          error="HTTP 404: no /metrics here; is this an inference server?")
    garbage = TargetState(target, "bad_payload", failure="bad_payload", last_good_t=NOW - 5,
                          error="not Prometheus text: it starts with '<'")
    assert _cells_of(missing)["status"] == Cell("not found", "bad")
    assert _cells_of(garbage)["status"].text == "bad data 5s"


def test_a_failed_scrape_dims_the_last_numbers_at_once() -> None:
    stats = EngineStats("m", None, NOW - 3, kv_usage=0.5, blocks_total=100, blocks_used=50,
                        running=4, waiting=2, generation_tps=300.0)
    live = _up("h:1", stats)
    stale = TargetState(Target.from_spec("h:1"), "stale", failure="timeout", kind="vllm",
                        engines=[stats], last_good_t=NOW - 3)
    live_cells, stale_cells = _cells_of(live), _cells_of(stale)
    assert stale_cells["status"] == Cell("timeout 3s", "warn")
    for key in ("kv", "running", "waiting", "gen"):
        assert stale_cells[key].text == live_cells[key].text  # the last good values...
        assert stale_cells[key].level == "dim" != live_cells[key].level  # ...dimmed


def test_hit_is_the_window_s_and_lifetime_is_labelled() -> None:
    window = EngineStats("m", None, NOW, hit_rate=0.42, hit_rate_scope="window")
    lifetime = EngineStats("m", None, NOW, hit_rate=0.38, hit_rate_scope="lifetime")
    assert _cells_of(_up("h:1", window))["hit"] == Cell("42%")
    assert _cells_of(_up("h:1", lifetime))["hit"] == Cell("(38%)", "dim")


def test_lifetime_latency_is_never_shown_as_current() -> None:
    first = EngineStats("m", None, NOW, ttft=Quantiles(0.2, 0.4, 0.9, 50, "lifetime"))
    later = EngineStats("m", None, NOW, ttft=Quantiles(0.05, 0.1, 0.2, 5, "window"))
    assert _cells_of(_up("h:1", first))["ttft"].text == fmt.DASH
    assert _cells_of(_up("h:1", later))["ttft"].text == "50ms/200ms"


def test_data_parallel_suffix_survives_a_cut_name() -> None:
    state = _up("a-very-long-host-name.example:8000", EngineStats("m", "0", NOW),
                EngineStats("m", "1", NOW))
    names = [r.cells["name"] for r in build_rows([state], NOW)]
    assert [fit(c.text, 16, c.keep) for c in names] == ["a-very-long-… e0", "a-very-long-… e1"]


def test_the_summary_counts_inference_servers_and_weighs_the_hit_rate() -> None:
    busy = EngineStats("m", None, NOW, hit_rate=0.9, hit_rate_scope="window",
                       prefix_queries_per_s=900.0, generation_tps=100.0)
    quiet = EngineStats("m", None, NOW, hit_rate=0.0, hit_rate_scope="window",
                        prefix_queries_per_s=100.0, generation_tps=50.0)
    gateway = TargetState(Target.from_spec("gw:1"), "up", kind="unknown", last_good_t=NOW)
    exporter = TargetState(Target.from_spec("gpu:9400"), "up", kind="dcgm", last_good_t=NOW)
    rows = build_rows([_up("a:1", busy), _up("b:1", quiet), gateway, exporter], NOW)
    summary = summarise(rows)
    assert (summary.hosts_up, summary.hosts_total) == (2, 3)  # not the gateway, nor a GPU
    assert summary.hit_rate == 0.81  # 810 hits of 1000 lookups, not the mean of 90 % and 0 %
    assert summary.generation_tps == 150.0
    assert summarise(filter_rows(rows, "a:1")).hosts_total == 1  # the header follows a filter


def test_sort_either_way_keeps_unknowns_last() -> None:
    rows = build_rows([
        _up("a:1", EngineStats("m", None, NOW, running=3)),
        _up("b:1", EngineStats("m", None, NOW, running=9)),
        _up("c:1", EngineStats("m", None, NOW)),
    ], NOW)
    assert [r.name for r in order_rows(rows, "running")] == ["b:1", "a:1", "c:1"]
    assert [r.name for r in order_rows(rows, "running", reverse=True)] == ["a:1", "b:1", "c:1"]
    assert [r.name for r in order_rows(rows, "name", reverse=True)] == ["c:1", "b:1", "a:1"]


def _stalling(spec: str, stall: str, leak: str | None = "warmup") -> TargetState:
    verdict = None if leak is None else LeakVerdict(leak, "why", None, None, None)
    return _up(spec, EngineStats("m", None, NOW, kv_usage=0.99, running=0, waiting=33,
                                 leak=verdict, stall=StallVerdict(stall, "no token", NOW - 6)))


def test_stalled_shows_at_once_and_saturated_as_such() -> None:
    rows = build_rows([_stalling("wedged:1", "stalled"), _stalling("full:1", "saturated"),
                       _stalling("leaking:1", "stalled", "leak"),
                       _stalling("watched:1", "saturated", "watch"),
                       _stalling("moving:1", "ok", "ok")], NOW)
    leak = {r.name: (r.cells["leak"].text, r.cells["leak"].level) for r in rows}
    assert leak["wedged:1"] == ("STALL", "alarm")  # the leak detector still warming up
    assert leak["full:1"] == ("SATURATED", "warn")
    assert leak["leaking:1"] == ("LEAK", "alarm")  # a leak explains the stall
    assert leak["watched:1"] == ("WATCH", "warn")  # a rising floor says more than full
    assert leak["moving:1"] == ("OK", "ok")
    summary = summarise(rows)
    assert (summary.stalls, summary.saturated, summary.leaks) == (2, 2, 1)
    assert [r.name for r in order_rows(rows, "worst")][:2] == ["leaking:1", "wedged:1"]


WARMUP = LeakVerdict("warmup", "collecting data", None, None, None)


WATCHING = LeakVerdict("watch", "floor rising", 80.0, 1234.0, 9.0)


def _state(spec: str, verdict: LeakVerdict | None) -> TargetState:
    stats = EngineStats("m", None, NOW, blocks_used=10, blocks_total=100, leak=verdict)
    return TargetState(Target.from_spec(spec), "up", kind="vllm", engines=[stats],
                       last_good_t=NOW)


def test_leak_cell_says_state_and_slope() -> None:
    assert leak_cell(LEAKING).text == "LEAK +4.2k/h"
    assert leak_cell(LEAKING).level == "alarm"
    assert leak_cell(replace(LEAKING, slope_blocks_per_hour=420.0)).text == "LEAK +420/h"
    assert leak_cell(replace(LEAKING, slope_blocks_per_hour=None)).text == "LEAK"
    assert (leak_cell(WATCHING).text, leak_cell(WATCHING).level) == ("WATCH +1.2k/h", "warn")
    assert (leak_cell(QUIET).text, leak_cell(QUIET).level) == ("OK", "ok")
    assert (leak_cell(WARMUP).text, leak_cell(WARMUP).level) == ("…", "dim")
    assert leak_cell(None).text == fmt.DASH  # a server the detector does not judge
    assert len(leak_cell(replace(WATCHING, slope_blocks_per_hour=123_456.0)).text) <= 13


def test_summary_counts_and_sort_puts_leaks_first() -> None:
    states = [_state("a:1", QUIET), _state("b:1", LEAKING), _state("c:1", WATCHING),
              _state("d:1", WARMUP)]
    summary = summarise(states)
    assert (summary.leaks, summary.watches, summary.judged) == (1, 1, 3)
    names = [r.name for r in order_rows(build_rows(states, NOW), "leak")]
    assert names[:2] == ["b:1", "c:1"]


def test_a_state_change_is_told_once() -> None:
    seen: dict[str, str] = {}
    told = []
    for verdict in (WARMUP, QUIET, QUIET, WATCHING, LEAKING, LEAKING, LEAKING, QUIET, QUIET):
        changes, seen = leak_changes([_state("a:1", verdict)], seen)
        told += [c.verdict.state for c in changes]
    assert told == ["watch", "leak", "ok"]  # warmup -> OK is not news


def test_sparkline_points_are_bucketed_and_unknown_is_blank() -> None:
    history = [EngineStats("m", None, t, blocks_used=t - 900) for t in (915.0, 990.0, 999.0)]
    points = kv_points(history, 999.5, span_s=100.0, cells=10)
    assert points[-1] == 94.5  # 990 and 999 share the last 10 s cell
    assert points[1] == 15.0
    assert points[0] is None and points[5] is None  # no data: blank, not zero
    assert fmt.sparkline([0.0, None, 50.0, 100.0], 100.0) == "▁ ▅█"
