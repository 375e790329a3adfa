"""The engine's panes without a terminal: the KV axis from 0 to the pool with the floor
drawn, plain-unit axes, gaps kept where a server was silent, sparklines in eighths, and
the verdict lines (LoRA names from outside written out)."""

from __future__ import annotations

import re

from kvtop.collect.reading import LoraInfo
from kvtop.collect.target import Target
from kvtop.derive.stats import EngineStats
from kvtop.derive.tracker import TargetState
from kvtop.derive.verdicts import LeakVerdict, StallVerdict
from kvtop.view.chart import Chart, Series, join_gaps, nice_ceiling, render
from kvtop.view.engine import engine_view, kv_pane, lora_line
from kvtop.view.fleet import build_rows

NOW = 10_000.0
SPAN = 300.0


def _text(rows: list) -> list[str]:
    return ["".join(piece for piece, _ in row) for row in rows]


def _history(pool: int, used: list[float], step: float = 5.0) -> list[EngineStats]:
    start = NOW - step * (len(used) - 1)
    return [EngineStats("m", "0", start + i * step, blocks_total=pool, blocks_used=u,
                        kv_usage=u / pool) for i, u in enumerate(used)]


def test_the_kv_axis_runs_from_0_to_the_pool_with_the_floor_drawn() -> None:
    verdict = LeakVerdict("leak", "floor rose", 300.0, 900.0, 2.0)
    history = _history(1999, [400.0 + i for i in range(60)])
    history[-1].leak = verdict
    history[-1].idle_floor_blocks = 1
    pane = kv_pane(history[-1], history, NOW, SPAN)
    assert pane.chart is not None and pane.chart.top == 1999
    [rule] = pane.chart.rules
    assert rule.value == 301 and rule.role == "bad"  # idle floor + the leaked blocks
    lines = _text(render(pane.chart, 60, 12))
    assert lines[0].startswith("1999┤") and lines[-2].startswith("   0┤")
    assert any(line.startswith(" 301┤") for line in lines)  # the floor's level on the axis
    assert lines[-1].rstrip().endswith("now")
    assert "floor +300 leaked" in "".join(piece for piece, _ in pane.legend)


def test_axes_are_plain_units_never_exponents() -> None:
    for top in (1300.0, 13_000.0, 1_300_000.0, 0.0013):
        chart = Chart((Series("x", "s1", [(NOW - 10, top), (NOW, top / 2)]),), NOW, SPAN)
        text = "\n".join(_text(render(chart, 40, 8)))
        assert not re.search(r"\d[eE][+-]?\d", text), text
    assert nice_ceiling(1300.0) == 1500.0 and nice_ceiling(0.0) == 1.0


def test_without_block_counts_the_kv_pane_is_a_percentage() -> None:
    stats = EngineStats("m", None, NOW, kv_usage=0.31)
    pane = kv_pane(stats, [stats], NOW, SPAN)
    assert pane.chart is not None and pane.chart.top == 100.0
    assert _text(render(pane.chart, 30, 6))[0].startswith("100%┤")


def test_a_silence_stays_a_gap_while_scrape_spacing_is_joined() -> None:
    assert join_gaps([1.0, None, None, 4.0], most=3) == [1.0, 2.0, 3.0, 4.0]
    assert join_gaps([1.0, None, None, None, None, 6.0], most=3) == [
        1.0, None, None, None, None, 6.0]


def test_lora_names_from_outside_are_written_out() -> None:
    line = lora_line(LoraInfo(2, ("sql\x1b]52;c;x\x07",), ("a", "b", "c", "d", "e")))
    assert line is not None
    text = "".join(piece for piece, _ in line)
    assert "\x1b" not in text and "sql\\x1b]52" in text
    assert "5 waiting (a, b, c, d +1)" in text and "max 2 at once" in text


def test_a_server_that_never_answered_says_never() -> None:
    state = TargetState(Target.from_spec("h:1"), "down", failure="down",
                        error="connection refused")
    [row] = build_rows([state], NOW)
    view = engine_view(row, state, [], NOW, SPAN)
    text = ["".join(piece for piece, _ in line) for line in view.lines]
    assert text[:3] == ["status down  last good never  connection refused",
                        "nothing answers at http://h:1/metrics",
                        "start the server, name others (kvtop HOST:PORT …), or try kvtop --demo"]
    assert "vLLM serves /metrics on its API port: vllm serve MODEL --port 8000" in text
    assert "a fleet Prometheus already scrapes: kvtop --prometheus http://prom:9090" in text
    assert view.panes == []
    # with the interval known it says how often it tries; once it answered, no hint
    view = engine_view(row, state, [], NOW, SPAN, interval_s=2.0)
    assert _text(view.lines)[1] == "nothing answers at http://h:1/metrics, trying every 2s"
    state.last_good_t = NOW - 60
    [row] = build_rows([state], NOW)
    assert len(engine_view(row, state, [], NOW, SPAN).lines) == 1


def test_stalled_is_the_first_line_of_the_pane_and_ok_takes_no_line() -> None:
    wedged = StallVerdict("stalled", "KV pool 100% full with 33 requests waiting", NOW - 6)
    stats = EngineStats("m", "0", NOW, kv_usage=1.0, blocks_total=100, blocks_used=100,
                        waiting=33, stall=wedged,
                        leak=LeakVerdict("warmup", "confirming", None, None, None))
    state = TargetState(Target.from_spec("h:1"), "up", kind="vllm", engines=[stats],
                        last_good_t=NOW)
    [row] = build_rows([state], NOW)
    lines = _text(engine_view(row, state, [stats], NOW, SPAN).lines)
    assert lines[0] == "stall STALLED  KV pool 100% full with 33 requests waiting"
    assert lines[1].startswith("leak WARMUP")  # the leak line never reads STALL
    stats.stall = StallVerdict("ok", "making progress", None)
    [row] = build_rows([state], NOW)
    assert not any(line.startswith("stall") for line in
                   _text(engine_view(row, state, [stats], NOW, SPAN).lines))


def test_a_baseline_is_a_dim_level_at_its_median_on_the_pool_now() -> None:
    from kvtop.baseline.overlay import Band

    band = Band("healthy", 0.2, 0.5, 0.7, 1000, 4.0, 0.0, 0.4, 100.0, 50.0, 0.1, 0.3, 0.02)
    history = _history(2000, [400.0 + i for i in range(60)])
    pane = kv_pane(history[-1], history, NOW, SPAN, band)
    assert pane.chart is not None
    (rule,) = pane.chart.rules
    assert (rule.value, rule.role) == (1000.0, "base")  # 50 % of the pool now, not of 1000
    assert any(line.startswith("1000┤") for line in _text(render(pane.chart, 60, 12)))
    assert "base p50 (healthy)" in "".join(piece for piece, _ in pane.legend)
    assert ("  base 50%", "base") in pane.latest
    assert kv_pane(history[-1], history, NOW, SPAN).chart.rules == ()


def test_the_cache_goes_beside_the_charts_and_its_evidence_over_them() -> None:
    """The exact leak evidence is its own line after the leak verdict's (never merged into
    it); the cache pane's lines, its blocks-a-second chart and its one-line form come with
    the view; the channel of a target whose engine has sent nothing says so."""
    from kvtop.collect.kv_endpoint import KvChannel, KvEventsEndpoint
    from tests.scenarios.kv_cache import kv_event_stats

    found = kv_event_stats(leak="evidence", leaked_blocks=31, turnovers=3.5)
    stats = EngineStats("m", "0", NOW, kv_usage=0.2, blocks_total=999, blocks_used=200,
                        leak=LeakVerdict("ok", "nothing leaked", None, None, None),
                        kv_events=found)
    state = TargetState(Target.from_spec("h:1"), "up", kind="vllm", engines=[stats],
                        last_good_t=NOW)
    [row] = build_rows([state], NOW)
    view = engine_view(row, state, [stats], NOW, SPAN)
    lines = _text(view.lines)
    at = next(i for i, line in enumerate(lines) if line.startswith("leak OK"))
    assert lines[at + 1].startswith("KV events EVIDENCE 31 blocks")  # beside OK, not in it
    assert _text(view.cache)[0] == "limit  not judged"
    assert [p.key for p in view.panes][-1] == "cache"
    assert _text(view.facts)[0] == "cache reuse 10% of chains  exact EVIDENCE 31 blocks"
    state.kv_channel = KvChannel(KvEventsEndpoint("tcp://h:5557"))
    silent = EngineStats("m", "0", NOW, kv_usage=0.2)
    state.engines = [silent]
    [row] = build_rows([state], NOW)
    view = engine_view(row, state, [silent], NOW, SPAN)
    assert "blocks KV events: waiting for tcp://h:5557" in _text(view.cache)
    assert "cache" not in [p.key for p in view.panes]  # no sparkline row without events


def test_the_figures_under_the_sparklines_say_what_their_numbers_leave_out() -> None:
    from kvtop.derive.stats import Quantiles
    from kvtop.view.engine import fact_lines

    stats = EngineStats("m", "0", NOW, blocks_total=1999, block_size=16, idle_floor_blocks=3,
                        prefix_caching=True, preemptions_per_s=0.4,
                        finished_per_s={"stop": 2.5, "length": 0.5, "abort": 0.0},
                        ttft=Quantiles(0.05, None, 0.2, 9), itl=Quantiles(0.021, None, 0.05, 90),
                        prefix_queries_per_s=2000.0, prefix_queries_total=1e6,
                        prefix_hits_total=3.4e5, prefix_unit="tokens", window_s=5.0)
    state = TargetState(Target.from_spec("h:1"), "up", kind="vllm", version="0.33.0",
                        engines=[stats], last_good_t=NOW - 1, restarted_at=NOW - 180)
    assert _text(fact_lines(state, stats, NOW)) == [
        "pool 1999 blocks × 16 tokens  idle floor 3  prefix caching on",
        "preempt 0.4/s  swapped –  finished 3.0/s (stop 2.5, length 0.5)",
        "TTFT 50ms/200ms  ITL 21ms/50ms  E2E –  p50/p99 est.",
        "prefix lookups 2000/s  lifetime hit 34% of 1.0M tokens",
        "server vllm 0.33.0  scraped 1s ago  rates over 5s  restarted 3m ago",
        "read from http://h:1/metrics"]
    # a lifetime figure is never shown as this window's; a reason from outside is written out
    stats.ttft = Quantiles(0.05, None, 0.2, 9, scope="lifetime")
    stats.finished_per_s = {"st\x1bop": 1.0}
    lines = _text(fact_lines(state, stats, NOW))
    assert lines[2].startswith("TTFT –  ") and "(st\\x1bop 1.0)" in lines[1]


def test_a_search_that_leaves_no_row_says_so_and_how_to_get_the_fleet_back() -> None:
    from kvtop.view.engine import no_match_view

    view = no_match_view("qwen\x1b[2J")
    assert _text(view.lines) == ["no row matches 'qwen\\\\x1b[2J': the header still counts the "
                                 "whole fleet; escape clears the search"]
    assert view.panes == [] and view.empty == ""  # no "no numbers from this server"
