"""A row's cells without a terminal: columns by width, labels, ages, dashes, verdicts."""

from __future__ import annotations

from dataclasses import replace

from kvtop.collect.target import Target
from kvtop.derive.stats import EngineStats, Quantiles
from kvtop.derive.tracker import TargetState
from kvtop.derive.verdicts import LeakVerdict, StallVerdict
from kvtop.view import format as fmt
from kvtop.view.cells import Cell, leak_cell, visible_columns
from kvtop.view.fleet import build_rows, order_rows
from kvtop.view.fleet_summary import summarise
from tests.scenarios.app import LEAKING, QUIET

NOW = 1000.0


def _up(spec: str, *engines: EngineStats) -> TargetState:
    return TargetState(Target.from_spec(spec), "up", kind="vllm", engines=list(engines),
                       last_good_t=NOW)


def _cells_of(state: TargetState) -> dict[str, Cell]:
    return build_rows([state], NOW)[0].cells


def test_narrow_terminal_keeps_the_essential_columns() -> None:
    # 80 columns less the scrollbar: names whole, the verdict, the queue, the hit rate and
    # tokens/s, in narrowed columns one space apart (a cell a hair less and HIT goes first)
    at_80 = visible_columns(79)
    assert [c.key for c in at_80] == ["name", "status", "kv", "leak", "running", "waiting",
                                      "hit", "gen"]
    assert [(c.width, c.label) for c in at_80] == [
        (16, "NAME"), (11, "STATUS"), (15, "KV BLOCKS"), (9, "LEAK"), (4, "RUN"),
        (4, "WAIT"), (5, "HIT"), (5, "GEN/s")]
    assert {c.pad for c in at_80} == {1} and sum(c.width + c.pad for c in at_80) == 77
    assert len(visible_columns(77)) == 8
    assert [c.key for c in visible_columns(76)] == [
        "name", "status", "kv", "leak", "running", "waiting", "gen"]
    # where every column kept fits at full width, none is narrowed
    assert [c.width for c in visible_columns(130)] == [16, 11, 17, 12, 4, 4, 8, 5, 5, 6, 7, 11]
    assert {c.pad for c in visible_columns(122)} == {2}  # PP t/s gone, the rest at full width
    assert [c.width for c in visible_columns(121)][:4] == [16, 11, 15, 9]  # a hair narrower
    assert {c.pad for c in visible_columns(121)} == {1}
    assert len(visible_columns(220)) == 13
    assert [c.key for c in visible_columns(10)] == ["name", "status", "kv", "leak"]


def test_a_narrowed_column_shows_the_short_form_not_a_cut() -> None:
    from kvtop.ui.widgets.fleet_table import cell_text, header_text

    stats = EngineStats("m", None, NOW, kv_usage=0.5, blocks_total=20184, blocks_used=10092,
                        leak=LEAKING)
    cells = _cells_of(_up("h:1", stats))
    assert cell_text(cells["kv"], 17).rstrip() == "██▌░░ 10.1k/20.2k"
    assert cell_text(cells["kv"], 15).rstrip() == "█▌░ 10.1k/20.2k"
    assert cells["leak"].text == "LEAK +4.2k/h"
    assert cell_text(cells["leak"], 12) == "LEAK +4.2k/h"
    assert cell_text(cells["leak"], 9) == "LEAK     "  # the state, not "LEAK +4.…"

    # the sort marker survives a label cut to make room for it
    assert header_text(visible_columns(79), "gen", True).rstrip().endswith("GEN/▲")


def test_unknown_values_are_dashes_never_zero() -> None:
    [row] = build_rows([_up("h:1", EngineStats("m", None, NOW))], NOW)
    for key in ("kv", "leak", "running", "waiting", "limit", "preempt", "hit", "prompt", "gen",
                "ttft"):
        assert row.cells[key].text == fmt.DASH


def test_status_ages() -> None:
    target = Target.from_spec("h:1")
    stale = TargetState(target, "stale", last_good_t=NOW - 12)
    down = TargetState(target, "timeout", last_good_t=NOW - 300)
    never = TargetState(target, "auth", error="401: token rejected")
    cells = [build_rows([s], NOW)[0].cells for s in (stale, down, never)]
    # a failed scrape says so at once ("down"), with the age of the last good one
    assert [c["status"].text for c in cells] == ["down 12s", "timeout 5m", "auth"]
    assert cells[2]["model"].text == "401: token rejected"


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


def test_leak_cell_says_state_and_slope() -> None:
    assert leak_cell(LEAKING).text == "LEAK +4.2k/h"
    assert leak_cell(LEAKING).level == "alarm"
    assert leak_cell(replace(LEAKING, slope_blocks_per_hour=420.0)).text == "LEAK +420/h"
    assert leak_cell(replace(LEAKING, slope_blocks_per_hour=None)).text == "LEAK"
    assert (leak_cell(WATCHING).text, leak_cell(WATCHING).level) == ("WATCH +1.2k/h", "warn")
    assert (leak_cell(QUIET).text, leak_cell(QUIET).level) == ("OK", "ok")
    # one name per state on every screen: WARMUP, as the table, the panes and the detail say
    assert (leak_cell(WARMUP).text, leak_cell(WARMUP).level) == ("WARMUP", "dim")
    assert leak_cell(None).text == fmt.DASH  # a server the detector does not judge
    assert len(leak_cell(replace(WATCHING, slope_blocks_per_hour=123_456.0)).text) <= 13


def test_the_limit_column_says_what_holds_the_queue_loudly_and_the_rest_quietly() -> None:
    from kvtop.derive.verdicts import LimitVerdict
    from kvtop.view.cells import limit_cell

    def cell(limit: str) -> Cell:
        return limit_cell(EngineStats("m", "0", NOW, limit=LimitVerdict(limit, "why")))  # type: ignore[arg-type]

    assert cell("kv_capacity") == Cell("KV cap", "warn")
    assert cell("max_sequences") == Cell("max seqs", "warn")
    assert cell("token_budget") == Cell("budget", "warn")
    assert cell("kv_transfer") == Cell("KV xfer", "warn")
    assert cell("sleeping") == Cell("asleep", "warn")
    assert cell("none") == Cell("none", "dim")  # known: nothing waits
    assert cell("unknown") == Cell("unknown", "dim")  # no waiting count: said, not hidden
    assert all(len(cell(word).text) <= 8 for word in ("deferred", "kv_capacity", "unknown"))


def test_the_limit_column_needs_86_cells_and_sits_after_the_queue_it_explains() -> None:
    """Dropped before HIT and GEN t/s (80 columns keep the rates), shown narrowed as soon as
    it fits, before PRE/s and TTFT."""
    assert "limit" not in [c.key for c in visible_columns(85)]
    assert [c.key for c in visible_columns(86)] == [
        "name", "status", "kv", "leak", "running", "waiting", "limit", "hit", "gen"]
