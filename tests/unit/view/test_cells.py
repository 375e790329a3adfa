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


# -- each cell's text and level, exactly ------------------------------------------------------


def _state(status: str, **changes: object) -> TargetState:
    return replace(TargetState(Target.from_spec("h:1"), status), **changes)  # type: ignore[arg-type]


def test_the_status_cell_in_each_state_and_the_restart_badge_at_five_minutes() -> None:
    from kvtop.view.cells import status_cell

    assert status_cell(_state("pending"), NOW) == Cell("…", "dim")
    assert status_cell(_state("up", kind="vllm"), NOW) == Cell("up", "ok")
    assert status_cell(_state("up", kind="unknown"), NOW) == Cell("unknown", "warn")
    badge_since = NOW - 300.0  # a restart stays flagged for five minutes
    assert status_cell(_state("up", kind="vllm", restarted_at=badge_since), NOW) == Cell(
        "restarted", "warn")
    assert status_cell(_state("up", kind="vllm", restarted_at=badge_since - 0.001), NOW) == (
        Cell("up", "ok"))
    assert status_cell(_state("down", last_good_t=NOW - 300), NOW) == Cell("down 5m", "bad")
    assert status_cell(_state("stale", failure="auth", last_good_t=NOW - 30), NOW) == Cell(
        "auth 30s", "warn")
    assert status_cell(_state("timeout"), NOW) == Cell("timeout", "bad")


def test_a_status_without_a_failure_word_reads_as_itself() -> None:
    from kvtop.view.cells import failure_label

    assert failure_label(_state("pending")) == "pending"
    assert failure_label(_state("stale")) == "down"  # stale without a failure: it went away
    assert failure_label(_state("bad_payload")) == "bad data"


def test_kv_use_turns_amber_at_80_and_red_at_95_percent() -> None:
    from kvtop.view.cells import engine_cells

    def kv(usage: float | None) -> Cell:
        return engine_cells(EngineStats("m", None, NOW, kv_usage=usage))["kv"]

    assert kv(None) == Cell(fmt.DASH, None, short=fmt.DASH)
    assert kv(0.7999).level is None
    assert kv(0.8).level == "warn"
    assert kv(0.9499).level == "warn"
    assert kv(0.95) == Cell("████▊ 95%", "bad", short="██▉ 95%")


def test_an_engine_s_cells_all_at_once() -> None:
    from kvtop.view.cells import engine_cells

    stats = EngineStats("m\x1b[2J", None, NOW, kv_usage=0.5, blocks_used=10, blocks_total=100,
                        running=4, waiting=3, preemptions_per_s=0.5, prompt_tps=1200.0,
                        generation_tps=300.0, hit_rate=0.42, hit_rate_scope="window",
                        ttft=Quantiles(0.05, 0.1, 0.2, 5, "window"))
    expected = {
        "kv": Cell("██▌░░ 10/100", short="█▌░ 10/100"),  # the pool's own usage, not 10/100
        "running": Cell("4"), "waiting": Cell("3", "warn"), "limit": Cell(fmt.DASH, "dim"),
        "preempt": Cell("0.5", "bad"), "hit": Cell("42%"), "prompt": Cell("1200"),
        "gen": Cell("300"), "ttft": Cell("50ms/200ms"), "model": Cell("m\\x1b[2J"),
        "leak": Cell(fmt.DASH, "dim")}
    assert engine_cells(stats) == expected
    dimmed = {key: Cell(cell.text, "dim") for key, cell in expected.items()}
    assert engine_cells(stats, live=False) == {**dimmed, "model": Cell("m\\x1b[2J")}
    calm = engine_cells(EngineStats("", None, NOW, waiting=0, preemptions_per_s=0.0))
    assert (calm["waiting"], calm["preempt"], calm["model"]) == (
        Cell("0"), Cell("0"), Cell(fmt.DASH))


def test_a_saturated_pool_under_a_leak_shows_the_leak_and_an_unjudged_engine_a_dim_dash() -> None:
    from kvtop.view.cells import limit_cell

    saturated = StallVerdict("saturated", "pinned full", NOW)
    assert leak_cell(LEAKING, saturated) == Cell("LEAK +4.2k/h", "alarm", short="LEAK")
    assert leak_cell(None) == Cell(fmt.DASH, "dim")
    assert limit_cell(EngineStats("m", None, NOW)) == Cell(fmt.DASH, "dim")


def test_the_slope_is_shown_only_once_the_floor_rises() -> None:
    assert leak_cell(replace(WATCHING, slope_blocks_per_hour=0.0)) == Cell("WATCH", "warn")
    assert leak_cell(replace(WATCHING, slope_blocks_per_hour=1.0)) == Cell(
        "WATCH +1/h", "warn", short="WATCH")


def test_the_lifetime_hit_rate_from_the_counters_else_as_reported() -> None:
    from kvtop.view.cells import lifetime_hit

    counted = EngineStats("m", None, NOW, prefix_queries_total=200.0, prefix_hits_total=50.0,
                          hit_rate=0.9, hit_rate_scope="window")
    assert lifetime_hit(counted) == 0.25
    for scope, rate in [("lifetime", 0.38), ("reported", 0.38), ("window", None)]:
        no_lookups = EngineStats("m", None, NOW, prefix_queries_total=0.0,
                                 prefix_hits_total=0.0, hit_rate=0.38, hit_rate_scope=scope)
        assert lifetime_hit(no_lookups) == rate
    no_hits = EngineStats("m", None, NOW, prefix_queries_total=200.0, hit_rate=0.38,
                          hit_rate_scope="lifetime")
    assert lifetime_hit(no_hits) == 0.38


def test_the_baseline_cell_red_on_a_worse_figure_green_on_a_better_one() -> None:
    from kvtop.baseline.overlay import Delta
    from kvtop.view.cells import NO_DELTA, delta_cell

    assert delta_cell(None) == NO_DELTA == Cell(fmt.DASH, "dim")
    moved = Delta(0.5, 0.007, 0.2, 0.006)  # +0.7 points, +0.6 %: both round up
    assert delta_cell(moved) == Cell("+1pt +1%")
    assert delta_cell(replace(moved, kv_worse=True, ttft_better=True)) == Cell("+1pt +1%", "bad")
    assert delta_cell(replace(moved, ttft_worse=True)) == Cell("+1pt +1%", "bad")
    assert delta_cell(replace(moved, kv_better=True)) == Cell("+1pt +1%", "ok")
    assert delta_cell(replace(moved, ttft_better=True)) == Cell("+1pt +1%", "ok")
    assert delta_cell(Delta(None, None, None, None)) == Cell(f"{fmt.DASH} {fmt.DASH}")
    assert delta_cell(Delta(0.5, -0.12, 0.2, 0.4)) == Cell("-12pt +40%")
    assert delta_cell(Delta(0.9, 0.7, 0.2, 0.9)) == Cell("+70pt +90%")  # x100, not x101


def test_an_engineless_target_says_why() -> None:
    from kvtop.collect.gpu import GpuReading
    from kvtop.ui.widgets.fleet_table import cell_text
    from kvtop.view.cells import empty_cells

    gpu = GpuReading(0, "NVIDIA H100", "GPU-0", None, None, None, None, None)
    assert empty_cells(_state("up", kind="dcgm", gpus=[gpu]))["model"] == Cell("dcgm: 1 GPU")
    assert empty_cells(_state("stale", kind="nvidia_gpu_exporter", gpus=[gpu, gpu]))[
        "model"] == Cell("nvidia_gpu_exporter: 2 GPUs")
    assert empty_cells(_state("up", kind="dcgm"))["model"] == Cell("dcgm: 0 GPUs")
    up = empty_cells(_state("up", kind="vllm", gpus=[gpu]))
    assert up["model"] == Cell("vllm: no engine reported", "warn")
    assert up["kv"] == up["gpu"] == up["delta"] == Cell(fmt.DASH, "dim")
    not_llm = empty_cells(_state("up", kind="unknown"))["kv"]
    assert not_llm == Cell("not LLM server?", "warn")
    assert cell_text(not_llm, 9) == "not LLM …"  # cut at its end: only a DP suffix is kept
    assert empty_cells(_state("down", error="refused"))["model"] == Cell("refused", "dim")
    assert empty_cells(_state("pending"))["model"] == Cell(fmt.DASH, "dim")
    # targets down for one reason share one dict, whatever GPUs a server's last scrape saw
    assert empty_cells(_state("down", kind="vllm", error="refused", gpus=[gpu])) is (
        empty_cells(_state("down", kind="vllm", error="refused")))


def test_the_gpu_column_follows_kv_and_the_baseline_column_follows_leak() -> None:
    keys = [c.key for c in visible_columns(220, gpu=True, delta=True)]
    assert keys == ["name", "model", "status", "kv", "gpu", "leak", "delta", "running",
                    "waiting", "limit", "preempt", "hit", "prompt", "gen", "ttft"]
    assert [c.key for c in visible_columns(220, gpu=True)][3:6] == ["kv", "gpu", "leak"]
    assert [c.key for c in visible_columns(220, delta=True)][3:6] == ["kv", "leak", "delta"]
    assert [(c.key, c.priority) for c in visible_columns(79)] == [
        ("name", 0), ("status", 0), ("kv", 0), ("leak", 0), ("running", 1), ("waiting", 1),
        ("hit", 2), ("gen", 2)]
