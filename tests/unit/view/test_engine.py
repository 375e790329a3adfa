"""The engine's panes without a terminal: the KV axis from 0 to the pool with the floor
drawn, plain-unit axes, gaps kept where a server was silent, sparklines in eighths, and
the verdict lines (LoRA names from outside written out)."""

from __future__ import annotations

import re

from kvtop.collect.reading import LoraInfo
from kvtop.collect.target import Target
from kvtop.derive.stats import EngineStats, Quantiles
from kvtop.derive.tracker import TargetState
from kvtop.derive.verdicts import LeakVerdict, StallVerdict
from kvtop.view.chart import Chart, Rule, Series, join_gaps, nice_ceiling, render
from kvtop.view.engine import (
    PANES_AFTER_KV,
    Growth,
    PaneView,
    baseline_rule,
    engine_view,
    floor_rule,
    hit_pane,
    kv_pane,
    leak_growth,
    lora_line,
    with_rules,
)
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


def test_the_kv_panes_latest_value_says_the_percent_once() -> None:
    """Blocks shown: the server's own percent beside them (worked out from the blocks when
    the server gives none); without blocks the cell is already the percent, said once."""
    def latest(**kv: float | int) -> list[tuple[str, str]]:
        stats = EngineStats("m", None, NOW, **kv)  # type: ignore[arg-type]
        return kv_pane(stats, [stats], NOW, SPAN).latest

    assert latest(blocks_total=1000, blocks_used=250, kv_usage=0.26) == [
        ("██▋░░░░░░░ 250/1000", ""), (" 26%", "")]
    assert latest(blocks_total=1000, blocks_used=250) == [
        ("██▌░░░░░░░ 250/1000", ""), (" 25%", "")]
    assert latest(kv_usage=0.25) == [("██▌░░░░░░░ 25%", "")]
    assert latest(blocks_used=250, kv_usage=0.25) == [("██▌░░░░░░░ 25%", "")]


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


def test_the_leak_line_says_each_figure_once_and_only_for_a_suspected_leak() -> None:
    from kvtop.view.engine import leak_line

    def line(verdict: LeakVerdict | None) -> list[tuple[str, str]]:
        return leak_line(EngineStats("m", "0", NOW, leak=verdict))

    assert line(None) == [("leak ", "key"), ("not judged for this server", "dim")]
    # an OK verdict's slope and time to full are not shown (the detector is not worried)
    assert line(LeakVerdict("ok", "nothing leaked", None, 10.0, 5.0)) == [
        ("leak ", "key"), ("OK", "ok"), ("  ", ""), ("nothing leaked", "")]
    assert line(LeakVerdict("warmup", "confirming", None, 10.0, None)) == [
        ("leak ", "key"), ("WARMUP", "dim"), ("  ", ""), ("confirming", "")]
    assert line(LeakVerdict("watch", "floor rose 2% in 1h", 30.0, 420.0, 2.5)) == [
        ("leak ", "key"), ("WATCH", "warn"), ("  ", ""), ("+420/h  ", "warn"),
        ("full in 2.5h  ", "bad"), ("~30 blocks leaked  ", ""), ("floor rose 2% in 1h", "")]
    # a slope of 0 and an unknown time to full say nothing; a count the reason names
    # is not said twice
    assert line(LeakVerdict("leak", "~30 blocks held by no request", 30.0, 0.0, None)) == [
        ("leak ", "key"), ("LEAK", "alarm"), ("  ", ""), ("~30 blocks held by no request", "")]
    assert line(LeakVerdict("leak", "held\x1b[2J", 1500.0, 1200.0, 0.5)) == [
        ("leak ", "key"), ("LEAK", "alarm"), ("  ", ""), ("+1.2k/h  ", "alarm"),
        ("full in 30m  ", "bad"), ("~1500 blocks leaked  ", ""), ("held\\x1b[2J", "")]
    assert line(LeakVerdict("watch", "rising", 0.0, 5.0, None)) == [  # no "~0 blocks leaked"
        ("leak ", "key"), ("WATCH", "warn"), ("  ", ""), ("+5/h  ", "warn"), ("rising", "")]


def test_the_stall_line_is_loud_for_stalled_a_warning_for_saturated_and_absent_else() -> None:
    from kvtop.view.engine import stall_line

    def line(verdict: StallVerdict | None) -> list[tuple[str, str]] | None:
        return stall_line(EngineStats("m", "0", NOW, stall=verdict))

    assert line(None) is None
    assert line(StallVerdict("ok", "making progress", None)) is None
    assert line(StallVerdict("stalled", "no token for 6s", NOW - 6)) == [
        ("stall ", "key"), ("STALLED", "alarm"), ("  ", ""), ("no token for 6s", "")]
    assert line(StallVerdict("saturated", "KV full\x07", None)) == [
        ("stall ", "key"), ("SATURATED", "warn"), ("  ", ""), ("KV full\\x07", "")]


def test_the_lora_line_counts_and_names_up_to_four_adapters_each_cut_to_40() -> None:
    assert lora_line(None) is None
    assert lora_line(LoraInfo(None)) == [("LoRA ", "key"), ("0 running", ""),
                                         ("  0 waiting", "")]
    assert lora_line(LoraInfo(2, ("a" * 41, "b", "c", "d"))) == [
        ("LoRA ", "key"), ("4 running", ""), (f" ({'a' * 39}…, b, c, d)", ""),
        ("  0 waiting", ""), ("  max 2 at once", "dim")]
    assert lora_line(LoraInfo(1, (), ("x", "y", "z", "w", "v", "u"))) == [
        ("LoRA ", "key"), ("0 running", ""), ("  6 waiting", "warn"), (" (x, y, z, w +2)", ""),
        ("  max 1 at once", "dim")]


def test_the_gpu_line_is_what_nvidia_smi_sees_or_that_no_gpu_was_found() -> None:
    from kvtop.view.engine import gpu_line

    assert gpu_line(None) == [("GPU ", "key"), ("no GPU found for this server", "dim")]
    assert gpu_line((3 * 2**30, 80 * 2**30)) == [
        ("GPU ", "key"), ("3.0/80.0 GiB  what nvidia-smi sees", "")]


def test_a_search_cut_to_60_cells_in_the_no_match_view() -> None:
    from kvtop.view.engine import EngineView, no_match_view

    assert no_match_view("q" * 61) == EngineView("no row matches the search", [[
        ("no row matches ", "dim"), (repr("q" * 59 + "…"), "warn"),
        (": the header still counts the whole fleet; escape clears the search", "dim")]],
        empty="")


def _scrapes() -> list[EngineStats]:
    """Three scrapes 5 s apart, the middle one with the running count alone."""
    return [
        EngineStats("m", "0", NOW - 10, blocks_total=1000, blocks_used=100, kv_usage=0.1,
                    running=2, waiting=0, hit_rate=0.25, hit_rate_scope="window",
                    prompt_tps=100.0, generation_tps=50.0, ttft=Quantiles(0.05, None, 0.2, 9),
                    itl=Quantiles(0.02, None, 0.04, 90)),
        EngineStats("m", "0", NOW - 5, running=3),
        EngineStats("m", "0", NOW, blocks_total=1000, blocks_used=300, kv_usage=0.3,
                    running=4, waiting=5, hit_rate=0.5, hit_rate_scope="window",
                    prompt_tps=2000.0, generation_tps=0.04, ttft=Quantiles(0.5, None, 1.5, 9),
                    itl=Quantiles(0.03, None, 0.05, 90), prefix_queries_total=100.0,
                    prefix_hits_total=40.0)]


def _pane(pane: PaneView) -> tuple[object, ...]:
    """Everything a pane holds, its chart's axis as the label it puts on 50."""
    chart = pane.chart
    drawn = None if chart is None else (chart.series, chart.now, chart.span_s, chart.top,
                                        chart.rules, chart.unit(50.0))
    return pane.key, pane.legend, pane.latest, pane.empty, pane.by_series, drawn


def test_each_pane_is_its_legend_latest_figures_and_series_over_the_span() -> None:
    history = _scrapes()
    stats = history[-1]
    times = [NOW - 10, NOW - 5, NOW]

    def points(*values: float | None) -> list[tuple[float, float | None]]:
        return list(zip(times, values, strict=True))

    assert [_pane(p) for p in (kv_pane(stats, history, NOW, SPAN),
                               *(pane(stats, history, NOW, SPAN) for pane in PANES_AFTER_KV))] == [
        ("kv", [("KV blocks of 1000", "title")], [("███░░░░░░░ 300/1000", ""), (" 30%", "")],
         "no data yet", {},
         ((Series("used", "s1", points(100, None, 300)),), NOW, SPAN, 1000.0, (), "50")),
        ("queue", [("requests", "title"), (" ━ ", "s1"), ("run", ""), (" ━ ", "s2"), ("wait", "")],
         [("run ", "key"), ("4", ""), ("  wait ", "key"), ("5", "warn")], "no data yet",
         {"run": [("4", "")], "wait": [("5", "warn")]},
         ((Series("run", "s1", points(2, 3, 4)), Series("wait", "s2", points(0, None, 5))),
          NOW, SPAN, None, (), "50")),
        ("hit", [("prefix hit % (window)", "title")], [("50%", ""), ("  lifetime 40%", "dim")],
         "no lookups yet", {},
         ((Series("window", "s1", points(25.0, None, 50.0), join_s=30.0),), NOW, SPAN, 100.0,
          (), "50%")),
        ("tps", [("tok/s", "title"), (" ━ ", "s1"), ("in", ""), (" ━ ", "s2"), ("out", "")],
         [("2000 in  <0.1 out", "")], "no data yet",
         {"out": [("<0.1", ""), (" out", "dim"), ("  2000 in", "dim")]},
         ((Series("in", "s1", points(100.0, None, 2000.0)),
           Series("out", "s2", points(50.0, None, 0.04))), NOW, SPAN, None, (), "50")),
        ("lat", [("TTFT", "title"), (" ━ ", "s1"), ("p50", ""), (" ━ ", "s2"), ("p99", ""),
                 (" ━ ", "s3"), ("ITL", "")],
         [("TTFT ", "key"), ("500ms/1.5s", ""), ("  ITL ", "key"), ("30ms", ""),
          ("  est.", "dim")],
         "no request finished yet", {"p99": [("500ms/1.5s", ""), (" p50/p99 est.", "dim")]},
         ((Series("p50", "s1", points(0.05, None, 0.5)),
           Series("p99", "s2", points(0.2, None, 1.5)),
           Series("ITL", "s3", points(0.02, None, 0.03))), NOW, SPAN, None, (), "50.0s")),
    ]


def test_a_pane_without_numbers_has_no_chart_and_says_why() -> None:
    # a lifetime latency is never drawn as the window's; an empty queue is not a warning
    blank = EngineStats("m", "0", NOW, prefix_caching=False, waiting=0.0,
                        ttft=Quantiles(0.5, None, 1.0, 9, scope="lifetime"))
    panes = [kv_pane(blank, [blank], NOW, SPAN),
             *(pane(blank, [blank], NOW, SPAN) for pane in PANES_AFTER_KV)]
    assert [_pane(p) for p in panes] == [
        ("kv", [("KV use %", "title")], [("–", "")], "no data yet", {}, None),
        ("queue", [("requests", "title"), (" ━ ", "s1"), ("run", ""), (" ━ ", "s2"), ("wait", "")],
         [("run ", "key"), ("–", ""), ("  wait ", "key"), ("0", "")], "no data yet",
         {"run": [("–", "")], "wait": [("0", "")]},
         ((Series("run", "s1", [(NOW, None)]), Series("wait", "s2", [(NOW, 0.0)])),
          NOW, SPAN, None, (), "50")),
        ("hit", [("prefix hit % (window)", "title")], [("–", ""), ("  lifetime –", "dim")],
         "prefix caching off", {}, None),
        ("tps", [("tok/s", "title"), (" ━ ", "s1"), ("in", ""), (" ━ ", "s2"), ("out", "")],
         [("– in  – out", "")], "no data yet",
         {"out": [("–", ""), (" out", "dim"), ("  – in", "dim")]}, None),
        ("lat", [("TTFT", "title"), (" ━ ", "s1"), ("p50", ""), (" ━ ", "s2"), ("p99", ""),
                 (" ━ ", "s3"), ("ITL", "")],
         [("TTFT ", "key"), ("–/–", ""), ("  ITL ", "key"), ("–", ""), ("  est.", "dim")],
         "no request finished yet", {"p99": [("–/–", ""), (" p50/p99 est.", "dim")]}, None),
    ]
    # prefix caching on, or not said: the window has had no lookup yet
    for caching in (True, None):
        quiet = EngineStats("m", "0", NOW, prefix_caching=caching)
        assert hit_pane(quiet, [quiet], NOW, SPAN).empty == "no lookups yet"


def test_without_a_pool_size_the_kv_pane_draws_percent_of_the_pool() -> None:
    stats = EngineStats("m", "0", NOW, kv_usage=0.25)
    assert _pane(kv_pane(stats, [stats], NOW, SPAN)) == (
        "kv", [("KV use %", "title")], [("██▌░░░░░░░ 25%", "")], "no data yet", {},
        ((Series("used", "s1", [(NOW, 25.0)]),), NOW, SPAN, 100.0, (), "50%"))


def test_the_kv_pane_names_the_leak_floor_and_the_baseline_in_its_legend() -> None:
    from kvtop.baseline.overlay import Band

    healthy = Band("healthy", 0.2, 0.5, 0.7, 1000, 4.0, 0.0, 0.4, 100.0, 50.0, 0.1, 0.3, 0.02)
    unknown = Band("blank", *[None] * 12)
    stats = EngineStats("m", "0", NOW, kv_usage=0.3, blocks_total=2000, blocks_used=600,
                        idle_floor_blocks=40, leak=LeakVerdict("watch", "w", 25.0, 100.0, None))
    floor = Rule("floor +25 leaked", "warn", 65.0)
    series = (Series("used", "s1", [(NOW, 600)]),)
    assert _pane(kv_pane(stats, [stats], NOW, SPAN, healthy)) == (
        "kv", [("KV blocks of 2000", "title"), (" ┄ ", "warn"), ("floor +25 leaked", ""),
               (" ┄ ", "base"), ("base p50 (healthy)", "")],
        [("███░░░░░░░ 600/2000", ""), (" 30%", ""), ("  base 50%", "base")], "no data yet", {},
        (series, NOW, SPAN, 2000.0, (floor, Rule("base p50 (healthy)", "base", 1000.0)), "50"))
    # a baseline without a KV median draws nothing and says nothing
    assert _pane(kv_pane(stats, [stats], NOW, SPAN, unknown)) == (
        "kv", [("KV blocks of 2000", "title"), (" ┄ ", "warn"), ("floor +25 leaked", "")],
        [("███░░░░░░░ 600/2000", ""), (" 30%", "")], "no data yet", {},
        (series, NOW, SPAN, 2000.0, (floor,), "50"))
    assert baseline_rule(unknown, 2000) is None and baseline_rule(None, 2000) is None
    assert baseline_rule(healthy, None) == Rule("base p50 (healthy)", "base", 500.0)


def test_the_floor_rule_is_the_idle_floor_plus_a_suspected_leak_and_none_at_zero() -> None:
    def rule(floor: int, verdict: LeakVerdict | None = None) -> Rule | None:
        return floor_rule(EngineStats("m", "0", NOW, idle_floor_blocks=floor, leak=verdict))

    assert rule(0) is None
    assert rule(1) == Rule("idle floor", "floor", 1.0)
    # an OK verdict's figure is not drawn; a WATCH is a warning, a LEAK bad
    assert rule(1, LeakVerdict("ok", "fine", 5.0, None, None)) == Rule("idle floor", "floor", 1.0)
    assert rule(0, LeakVerdict("ok", "fine", 5.0, None, None)) is None
    assert rule(0, LeakVerdict("watch", "w", 30.0, None, None)) == Rule(
        "floor +30 leaked", "warn", 30.0)
    assert rule(2, LeakVerdict("leak", "l", 30.0, None, None)) == Rule(
        "floor +30 leaked", "bad", 32.0)
    assert rule(2, LeakVerdict("watch", "w", 0.0, None, None)) == Rule("idle floor", "floor", 2.0)
    assert rule(2, LeakVerdict("warmup", "w", None, None, None)) == Rule(
        "idle floor", "floor", 2.0)


def test_more_reference_levels_join_a_panes_chart_and_legend() -> None:
    stats = EngineStats("m", "0", NOW, kv_usage=0.3, blocks_total=2000, blocks_used=600)
    pane = kv_pane(stats, [stats], NOW, SPAN)
    band = (Rule("p5", "base", 100.0), Rule("", "base", 900.0))
    wider = with_rules(pane, band)
    assert wider.chart is not None and pane.chart is not None
    assert (wider.chart.rules, wider.legend) == (
        band, [("KV blocks of 2000", "title"), (" ┄ ", "base"), ("p5", "")])
    assert (wider.chart.series, wider.latest) == (pane.chart.series, pane.latest)
    assert with_rules(wider, (Rule("p95", "base", 1900.0),)).legend == [
        ("KV blocks of 2000", "title"), (" ┄ ", "base"), ("p5", ""), (" ┄ ", "base"),
        ("p95", "")]
    assert with_rules(pane, ()) is pane
    blank = kv_pane(EngineStats("m", "0", NOW), [], NOW, SPAN)
    assert with_rules(blank, band) is blank  # no chart to draw them on


def test_leak_growth_is_told_over_a_minute_or_more_of_watch_or_leak() -> None:
    def scrape(t: float, state: str, leaked: float | None) -> EngineStats:
        return EngineStats("m", "0", t, blocks_total=1000,
                           leak=LeakVerdict(state, "r", leaked, None, None))  # type: ignore[arg-type]

    start = NOW - 600
    assert leak_growth([scrape(start, "watch", 10.0), scrape(start + 60, "leak", 70.0)]) == Growth(
        10.0, 70.0, 60.0, 1000)
    assert leak_growth([scrape(start, "watch", 10.0), scrape(start + 59.9, "leak", 70.0)]) is None
    assert leak_growth([scrape(start, "leak", 10.0), scrape(start + 60, "leak", 10.0)]) is None
    assert leak_growth([scrape(start, "leak", 10.0), scrape(start + 60, "leak", 9.0)]) is None
    assert leak_growth([scrape(start + 60, "leak", 70.0)]) is None
    assert leak_growth([]) is None
    # only WATCH and LEAK scrapes with an estimate count, the first and the last of them
    history = [scrape(start - 100, "ok", 0.0), scrape(start - 50, "warmup", 1.0),
               EngineStats("m", "0", start - 20), scrape(start, "watch", 10.0),
               scrape(start + 30, "leak", None), scrape(start + 60, "watch", 40.0),
               scrape(start + 120, "leak", 70.0), scrape(start + 200, "ok", 0.0)]
    growth = leak_growth(history)
    assert growth == Growth(10.0, 70.0, 120.0, 1000)
    assert (growth.per_hour, growth.hours_to_full) == (1800.0, 930 / 1800)


def test_each_figure_under_the_sparklines_has_its_key_and_an_unknown_is_a_dash() -> None:
    from kvtop.view.engine import fact_lines

    stats = EngineStats("m", "0", NOW, blocks_total=20000, block_size=16,
                        idle_floor_blocks=12000, prefix_caching=False, preemptions_per_s=0.0,
                        swapped=3.0, finished_per_s={"stop": 0.0, "length": 0.0},
                        e2e=Quantiles(2.0, None, 150.0, 5), prefix_queries_per_s=0.04,
                        prefix_queries_total=5e6, prefix_hits_total=1e6, prefix_unit="blocks",
                        window_s=120.0)
    never = TargetState(Target.from_spec("h:1"), "down", failure="down")
    assert fact_lines(never, stats, NOW) == [
        [("pool ", "key"), ("20.0k blocks", ""), (" × 16 tokens", ""), ("  idle floor ", "key"),
         ("12.0k", ""), ("  prefix caching ", "key"), ("off", "")],
        # requests end, but none in this window: 0/s and no reasons
        [("preempt ", "key"), ("0/s", ""), ("  swapped ", "key"), ("3", ""),
         ("  finished ", "key"), ("0/s", "")],
        [("TTFT ", "key"), ("–", ""), ("  ITL ", "key"), ("–", ""), ("  E2E ", "key"),
         ("2.0s/150s", ""), ("  p50/p99 est.", "dim")],
        [("prefix lookups ", "key"), ("<0.1/s", ""), ("  lifetime hit ", "key"), ("20%", ""),
         (" of 5.0M blocks", "dim")],
        [("server ", "key"), ("–", ""), ("  scraped ", "key"), ("never", ""),
         ("  rates over ", "key"), ("2m", "")],
        [("read from ", "key"), ("http://h:1/metrics", "")]]
    blank = EngineStats("m", "0", NOW)
    state = TargetState(Target.from_spec("h:1"), "up", kind="sglang", version="v0.4\x1b",
                        last_good_t=NOW - 2, restarted_at=NOW - 7200)
    assert fact_lines(state, blank, NOW) == [
        [("pool ", "key"), ("– blocks", ""), (" × – tokens", ""), ("  idle floor ", "key"),
         ("0", ""), ("  prefix caching ", "key"), ("–", "")],
        [("preempt ", "key"), ("–", ""), ("  swapped ", "key"), ("–", "")],
        [("TTFT ", "key"), ("–", ""), ("  ITL ", "key"), ("–", ""), ("  E2E ", "key"),
         ("–", ""), ("  p50/p99 est.", "dim")],
        [("prefix lookups ", "key"), ("–", ""), ("  lifetime hit ", "key"), ("–", ""),
         (" of –", "dim")],
        [("server ", "key"), ("sglang v0.4\\x1b", ""), ("  scraped ", "key"), ("2s ago", ""),
         ("  rates over ", "key"), ("–", ""), ("  restarted ", "key"), ("2h ago", "")],
        [("read from ", "key"), ("http://h:1/metrics", "")]]


def test_the_queue_facts_name_the_two_commonest_ways_requests_end() -> None:
    from kvtop.view.engine import fact_lines

    stats = EngineStats("m", "0", NOW, preemptions_per_s=1.5, swapped=0.0,
                        finished_per_s={"a" * 21: 3.0, "b": 1.0, "c": 2.0, "d": 0.0})
    state = TargetState(Target.from_spec("h:1"), "up", kind="vllm", last_good_t=NOW)
    assert fact_lines(state, stats, NOW)[1] == [
        ("preempt ", "key"), ("1.5/s", ""), ("  swapped ", "key"), ("0", ""),
        ("  finished ", "key"), ("6.0/s", ""), (f" ({'a' * 19}… 3.0, c 2.0)", "dim")]


def _engine_state(history: list[EngineStats]) -> TargetState:
    return TargetState(Target.from_spec("h:1"), "up", kind="vllm", version="0.9.1",
                       engines=[history[-1]], last_good_t=NOW)


def test_the_selected_engine_is_its_verdicts_then_its_panes_its_cache_and_its_figures() -> None:
    from kvtop.baseline.overlay import Band
    from kvtop.view.cache import cache_lines
    from kvtop.view.engine import fact_lines, latency_pane, queue_pane, throughput_pane
    from tests.scenarios.kv_cache import kv_event_stats

    history = _scrapes()
    stats = history[-1]
    history[0].kv_events = kv_event_stats(stored_per_s=3.0, removed_per_s=1.0)
    stats.kv_events = kv_event_stats(leak="evidence", leaked_blocks=31)
    stats.leak = LeakVerdict("watch", "floor rose", 30.0, 420.0, 2.5)
    stats.stall = StallVerdict("saturated", "KV full", None)
    stats.lora = LoraInfo(2, ("sql",), ())
    state = _engine_state(history)
    band = Band("healthy", 0.2, 0.5, 0.7, 1000, 4.0, 0.0, 0.4, 100.0, 50.0, 0.1, 0.3, 0.02)
    [row] = build_rows([state], NOW)
    view = engine_view(row, state, history, NOW, SPAN, gpu=(2**30, 2**31), with_gpu=True,
                       band=band)
    assert view.title == "h:1 · m"
    assert view.lines == [
        [("stall ", "key"), ("SATURATED", "warn"), ("  ", ""), ("KV full", "")],
        [("leak ", "key"), ("WATCH", "warn"), ("  ", ""), ("+420/h  ", "warn"),
         ("full in 2.5h  ", "bad"), ("~30 blocks leaked  ", ""), ("floor rose", "")],
        [("KV events ", "key"), ("EVIDENCE", "alarm"),
         (" 31 blocks unused 3+ turnovers (oldest 4.2)", "bad"),
         ("  (its own witness, not the leak verdict)", "dim")],
        [("LoRA ", "key"), ("1 running", ""), (" (sql)", ""), ("  0 waiting", ""),
         ("  max 2 at once", "dim")],
        [("GPU ", "key"), ("1.0/2.0 GiB  what nvidia-smi sees", "")]]
    assert view.panes[:5] == [kv_pane(stats, history, NOW, SPAN, band),
                              queue_pane(stats, history, NOW, SPAN),
                              hit_pane(stats, history, NOW, SPAN),
                              throughput_pane(stats, history, NOW, SPAN),
                              latency_pane(stats, history, NOW, SPAN)]
    assert view.panes[0].chart is not None and len(view.panes[0].chart.rules) == 2  # the band's
    times = [NOW - 10, NOW - 5, NOW]
    assert [_pane(p) for p in view.panes[5:]] == [(
        "cache", [("blocks/s", "title"), (" ━ ", "s1"), ("stored", ""), (" ━ ", "s2"),
                  ("removed", "")],
        [("+12", "s1"), (" −11 blk/s", "s2")], "no data yet", {},
        ((Series("stored", "s1", list(zip(times, (3.0, None, 12.5), strict=True))),
          Series("removed", "s2", list(zip(times, (1.0, None, 11.0), strict=True)))),
         NOW, SPAN, None, (), "50"))]
    assert view.facts == [
        [("cache ", "key"), ("reuse ", "key"), ("10% of chains", ""), ("  ", ""),
         ("exact ", "key"), ("EVIDENCE 31 blocks", "alarm")],
        *fact_lines(state, stats, NOW)]
    assert view.cache == cache_lines(stats, None) and view.empty == "no numbers from this server"
    # no GPU line unless asked for; asked for without a GPU found, it says so
    assert engine_view(row, state, history, NOW, SPAN).lines == view.lines[:4]
    assert engine_view(row, state, history, NOW, SPAN, with_gpu=True).lines[4] == [
        ("GPU ", "key"), ("no GPU found for this server", "dim")]


def test_an_engine_without_kv_events_has_no_cache_chart_and_no_cache_figure() -> None:
    from kvtop.view.engine import fact_lines

    history = _scrapes()
    state = _engine_state(history)
    [row] = build_rows([state], NOW)
    view = engine_view(row, state, history, NOW, SPAN)
    assert [p.key for p in view.panes] == ["kv", "queue", "hit", "tps", "lat"]
    assert view.facts == fact_lines(state, history[-1], NOW)


def test_the_panes_show_the_rows_numbers_whatever_the_history_holds() -> None:
    history = _scrapes()
    state = _engine_state(history)
    [row] = build_rows([state], NOW)
    older = engine_view(row, state, history[:1], NOW, SPAN)
    assert older.panes[0].latest == [("███░░░░░░░ 300/1000", ""), (" 30%", "")]
    assert [p.key for p in engine_view(row, state, [], NOW, SPAN).panes] == [
        "kv", "queue", "hit", "tps", "lat"]


def test_a_server_that_stopped_answering_keeps_its_last_numbers_under_its_status() -> None:
    history = _scrapes()
    history[-1].leak = LeakVerdict("ok", "nothing leaked", None, None, None)
    state = TargetState(Target.from_spec("h:1"), "down", kind="vllm", failure="down",
                        error="connection refused", last_good_t=NOW - 30)
    [row] = build_rows([state], NOW)
    view = engine_view(row, state, history, NOW, SPAN)
    assert view.title == "h:1 · connection refused"
    assert view.lines == [
        [("status ", "key"), ("down 30s", "bad"), ("  last good ", "key"), ("30s ago", ""),
         ("  ", ""), ("connection refused", "dim")],
        [("leak ", "key"), ("OK", "ok"), ("  ", ""), ("nothing leaked", "")]]
    assert view.panes[0].latest == [("███░░░░░░░ 300/1000", ""), (" 30%", "")]
    # two scrapes back is not the last: the newest of the history is shown
    assert engine_view(row, state, history[:2], NOW, SPAN).panes[1].latest == [
        ("run ", "key"), ("3", ""), ("  wait ", "key"), ("–", "")]


def test_without_a_row_or_its_state_nothing_is_selected() -> None:
    from kvtop.view.engine import EngineView

    state = _engine_state(_scrapes())
    [row] = build_rows([state], NOW)
    assert engine_view(None, None, [], NOW, SPAN) == EngineView("no engine selected")
    assert engine_view(row, None, [], NOW, SPAN) == EngineView("no engine selected")
    assert engine_view(None, state, [], NOW, SPAN) == EngineView("no engine selected")


def test_a_target_without_engines_says_why_once_and_hints_only_if_it_never_answered() -> None:
    def lines(state: TargetState) -> tuple[str, list[list[tuple[str, str]]]]:
        [row] = build_rows([state], NOW)
        view = engine_view(row, state, [], NOW, SPAN)
        assert view.panes == [] and view.facts == [] and view.cache == []
        return view.title, view.lines

    target = Target.from_spec("h:1")
    # a GPU exporter that timed out: the error in the status, what it is below
    assert lines(TargetState(target, "stale", kind="dcgm", failure="timeout",
                             error="timed out", last_good_t=NOW - 5)) == ("h:1 · dcgm: 0 GPUs", [
        [("status ", "key"), ("timeout 5s", "warn"), ("  last good ", "key"), ("5s ago", ""),
         ("  ", ""), ("timed out", "dim")],
        [("dcgm: 0 GPUs", "")]])
    # an error that is what the model column says is not said twice
    assert lines(TargetState(target, "down", failure="down", error="refused",
                             last_good_t=NOW - 5)) == ("h:1 · refused", [
        [("status ", "key"), ("down 5s", "bad"), ("  last good ", "key"), ("5s ago", ""),
         ("  ", ""), ("refused", "dim")]])
    # not yet read, or answering without engines: no "nothing answers" hints
    assert lines(TargetState(target, "pending")) == ("h:1 · –", [
        [("status ", "key"), ("…", "dim"), ("  last good ", "key"), ("never", "")],
        [("–", "dim")]])
    assert lines(TargetState(target, "up", kind="vllm")) == ("h:1 · vllm: no engine reported", [
        [("vllm: no engine reported", "warn")]])
    hints = [[("nothing answers at ", "dim"), ("http://h:1/metrics", ""), ("", "dim")],
             [("start the server, name others (", "dim"), ("kvtop HOST:PORT …", "key"),
              ("), or try ", "dim"), ("kvtop --demo", "key")],
             [("vLLM serves /metrics on its API port: ", "dim"),
              ("vllm serve MODEL --port 8000", "key")],
             [("SGLang with ", "dim"), ("--enable-metrics", "key")],
             [("llama.cpp with ", "dim"), ("--metrics", "key")],
             [("many servers, named and grouped, in ", "dim"),
              ("~/.config/kvtop/config.toml", "key")],
             [("a fleet Prometheus already scrapes: ", "dim"),
              ("kvtop --prometheus http://prom:9090", "key")],
             [("every key and column: ", "dim"), ("F1", "key")]]
    assert lines(TargetState(target, "down", failure="down")) == ("h:1 · –", [
        [("status ", "key"), ("down", "bad"), ("  last good ", "key"), ("never", "")],
        [("–", "dim")], *hints])


def test_a_status_line_only_when_the_numbers_are_not_live() -> None:
    from kvtop.view.engine import status_line

    def line(state: TargetState) -> list[tuple[str, str]] | None:
        [row] = build_rows([state], NOW)
        return status_line(row, state, NOW)

    target = Target.from_spec("h:1")
    assert line(TargetState(target, "up", kind="vllm", last_good_t=NOW)) is None
    # up, but not plainly: restarted a moment ago, or not an inference server
    assert line(TargetState(target, "up", kind="vllm", last_good_t=NOW,
                            restarted_at=NOW - 5)) == [("status ", "key"), ("restarted", "warn")]
    assert line(TargetState(target, "up", kind="unknown", last_good_t=NOW)) == [
        ("status ", "key"), ("unknown", "warn")]
    # an error from outside is written out and cut at 200 cells
    assert line(TargetState(target, "stale", failure="timeout", error="t\x1b" + "x" * 250,
                            last_good_t=NOW - 20)) == [
        ("status ", "key"), ("timeout 20s", "warn"), ("  last good ", "key"), ("20s ago", ""),
        ("  ", ""), ("t\\x1b" + "x" * 194 + "…", "dim")]


def test_a_group_shows_its_worst_member_under_a_line_that_says_so() -> None:
    from kvtop.view.engine import group_view
    from kvtop.view.groups import make_group

    history = _scrapes()
    state = _engine_state(history)
    rows = build_rows([state], NOW)
    member = engine_view(rows[0], state, history, NOW, SPAN)
    member.lines = [[("leak ", "key")]]
    member.empty = "quiet"
    group = make_group("model", "m", rows, False)
    view = group_view(group, member)
    assert (view.title, view.lines) == ("▾ m (1)", [
        [("group ", "key"), ("1/1 up", ""), ("  showing its worst: ", "dim"), ("h:1 · m", ""),
         ("  (enter folds, ← →)", "dim")],
        [("leak ", "key")]])
    assert (view.panes, view.cache, view.facts, view.empty) == (
        member.panes, member.cache, member.facts, "quiet")
    assert view.panes and view.cache and view.facts


def test_long_urls_and_versions_are_cut_where_the_panel_has_room() -> None:
    from kvtop.view.engine import fact_lines

    path = "p" * 300
    url = f"http://h:1/{path}"
    never = TargetState(Target.from_spec(f"h:1/{path}"), "down", failure="down")
    [row] = build_rows([never], NOW)
    assert engine_view(row, never, [], NOW, SPAN).lines[2][1] == (url[:119] + "…", "")
    state = TargetState(Target.from_spec(f"h:1/{path}"), "up", kind="vllm",
                        version="0.9.1+" + "g" * 40, last_good_t=NOW)
    facts = fact_lines(state, EngineStats("m", "0", NOW), NOW)
    assert facts[4][1] == ("vllm 0.9.1+" + "g" * 28 + "…", "")
    assert facts[5] == [("read from ", "key"), (url[:199] + "…", "")]


def test_a_silent_channel_is_the_first_figure_and_an_empty_queue_has_no_chart() -> None:
    from kvtop.collect.kv_endpoint import KvChannel, KvEventsEndpoint
    from kvtop.view.engine import queue_pane

    silent = EngineStats("m", "0", NOW)
    state = TargetState(Target.from_spec("h:1"), "up", kind="vllm", engines=[silent],
                        last_good_t=NOW, kv_channel=KvChannel(KvEventsEndpoint("tcp://h:5557")))
    [row] = build_rows([state], NOW)
    view = engine_view(row, state, [silent], NOW, SPAN)
    assert view.facts[0] == [("cache ", "key"), ("KV events: waiting for tcp://h:5557", "dim")]
    assert queue_pane(silent, [silent], NOW, SPAN).chart is None
