"""The detail view's text and charts without a terminal: no internal keys, numbers in plain
digits, a leak's growth said before the detector has a slope of its own, and the main
screen's charts (the KV axis to the pool) with every baseline level."""

from __future__ import annotations

from dataclasses import replace
from functools import partial
from pathlib import Path

from rich.text import Text
from textual.app import App, ComposeResult
from textual.pilot import Pilot
from textual.widgets import Static

import kvtop.ui
from kvtop.baseline.model import Baseline, EngineSummary, Figure, TargetSummary
from kvtop.baseline.overlay import Band, BaselineOverlay
from kvtop.collect.kv_endpoint import KvChannel, KvEventsEndpoint, RankStatus
from kvtop.collect.source import read_scrape
from kvtop.collect.target import Scrape, Target
from kvtop.derive.stats import EngineStats
from kvtop.derive.tracker import EngineKey, TargetState, TargetTracker
from kvtop.derive.verdicts import LeakVerdict, StallVerdict
from kvtop.ui.screens.detail import (
    PANE_KEYS,
    DetailScreen,
    DetailSource,
    config_lines,
    describe,
    detail_panes,
    leak_lines,
    references,
    stall_lines,
)
from kvtop.ui.widgets.panes import ChartPane
from kvtop.view.chart import Rule
from tests.scenarios.app import GATEWAY, HOST_A, HOST_B, T0
from tests.scenarios.bodies import vllm_body
from tests.support.paths import fixture_text

NOW = 10_000.0


def _leaking(leaked: float, t: float) -> EngineStats:
    verdict = LeakVerdict("leak", "blocks held with nothing running", leaked, None, None,
                          {"used": 1061.0, "pool": 1999.0, "floor_slope_per_h": 12345.678,
                           "turnover": 0.00001234})
    return EngineStats("m", "0", t, blocks_total=1999, blocks_used=leaked, leak=verdict,
                       cache_config={"block_size": "16", "_block_size_resolved": "16",
                                     "cache_dtype": "auto"})


def test_the_config_line_has_no_internal_key() -> None:
    lines = config_lines(_leaking(514.0, NOW))
    assert "_block_size_resolved" not in "".join(lines) and "cache_dtype auto" in lines[1]


def test_a_leak_s_growth_is_said_when_the_detector_has_no_slope_yet() -> None:
    history = [_leaking(514.0 + 547.0 * i / 4, NOW - 240 + 60 * i) for i in range(5)]
    lines = leak_lines(history[-1].leak, history)
    assert lines[1] == ("        leaked 514 → 1061 blocks in 4m: +8.2k/h here, full in 7m "
                        "at that pace")  # not "slope –, full in –"
    assert leak_lines(history[-1].leak, history[-1:])[1] == (
        "        leaked 1061 blocks  slope –  full in –")  # one point: nothing to say
    assert history[-1].leak is not None
    measured = replace(history[-1].leak, slope_blocks_per_hour=600.0, hours_to_full=1.5)
    assert leak_lines(measured, history)[1] == (  # the detector's own slope, once it has one
        "        leaked 1061 blocks  slope +600/h  full in 1.5h")
    evidence = " ".join(lines[2:])
    assert "floor_slope_per_h=12346" in evidence and "turnover=0" in evidence
    assert "e+" not in evidence and "e-" not in evidence  # never 1.235e+04


def test_the_detail_draws_the_main_screen_s_charts_with_every_baseline_level() -> None:
    history = [_leaking(514.0 + i, NOW - 60 + 5 * i) for i in range(13)]
    band = Band("healthy", 0.2, 0.5, 0.7, 1000, 4.0, 0.0, 0.4, 100.0, 50.0, 0.1, 0.3, 0.02)
    panes = {p.key: p for p in detail_panes(history[-1], history, NOW, 300.0, band)}
    kv = panes["kv"]
    assert kv.chart is not None and kv.chart.top == 1999  # the axis runs to the pool
    legend = "".join(piece for piece, _ in kv.legend)
    assert "base p50 (healthy)" in legend and "base p5-95" in legend
    assert sorted(r.value for r in kv.chart.rules if r.role == "base") == [
        0.2 * 1999, 0.5 * 1999, 0.7 * 1999]
    assert detail_panes(None, [], NOW, 300.0, band) == []


def test_describe_takes_the_history_for_the_growth() -> None:
    history = [_leaking(514.0 + 547.0 * i / 4, NOW - 240 + 60 * i) for i in range(5)]
    state = TargetState(Target.from_spec("h:1"), "up", kind="vllm", engines=[history[-1]],
                        last_good_t=NOW)
    assert "514 → 1061 blocks" in describe(state, history[-1], NOW, None, history).plain


# The screen itself, pushed in a small app with kvtop's stylesheet (Pilot), fed by real
# trackers over real scrapes (vLLM 0.10.1.1 twins: under load, then idle; a data-parallel
# body of two engines; an endpoint that is no inference server; one never scraped).
STYLESHEET = Path(kvtop.ui.__file__).parent / "kvtop.tcss"
LOADED, IDLE = "vllm-0.10.1.1-v1-twin-under-load.txt", "vllm-0.10.1.1-v1-twin-idle.txt"
KEY = ("twin-llama", "0")
SPAN_S = 300.0
CONFIG = [
    "config  num_gpu_blocks 600  block_size 16  kv_cache_size_tokens 9600  "
    "enable_prefix_caching True",
    "        cache_dtype auto  calculate_kv_scales False  cpu_kvcache_space_bytes 4294967296  "
    "cpu_offload_gb 0  gpu_memory_utilization 0.9  is_attention_free False  "
    "kv_sharing_fast_prefill False  mamba_cache_dtype auto  mamba_page_size_padded None  "
    "mamba_ssm_cache_dtype auto  num_cpu_blocks None  num_gpu_blocks_override None  "
    "prefix_caching_hash_algo builtin  sliding_window None  swap_space 4  "
    "swap_space_bytes 4294967296",
]
NOT_EXPORTED = [
    "waiting by reason not exported   KV fetch not exported   refused/s not exported   "
    "sleep not exported",
    "reuse   not exported (vLLM 0.16+: prompt tokens by source)",
    "resid.  not exported (vLLM 0.12+ with --kv-cache-metrics)",
    "events  KV events off (no kv_events endpoint)",
]
# under load, then idle: the window's rates and quantiles, and the baseline's line
BUSY = [
    "10.0.0.5:8000  http://10.0.0.5:8000/metrics",
    "server  vllm 0.9.2+",
    "status  up   last good 2s ago",
    "model   twin-llama   engine 0",
    "KV      ▏░░░░ 1/600  (0%)",
    *CONFIG,
    "leak    OK  pool drained to its idle floor: nothing leaked so far (idle floor 1 block "
    "assumed: server version not known exactly)",
    "evidence used=1  pool=600  units=blocks",
    "stall   OK  no requests",
    "         running=0  waiting=0  kv_usage=0.0017",
    "limit   nothing waits",
    *NOT_EXPORTED,
    "now     run 0  wait 0  preempt/s 6.3  hit 46% (window)  lifetime 46%",
    "tok/s   prompt 4870  gen 2353   window 10s",
    "TTFT    238ms/445ms/495ms   ITL 5ms/9ms/10ms   E2E 328ms/466ms/497ms",
    "base    KV p50 40% (p5-95 10%-80%)  TTFT p99 500ms  baseline healthy",
]


def _down_lines(status: str, ago: str) -> list[str]:
    """Idle, then under load (its counters went back: a restart), then refused: the last
    numbers stay, the quantiles over the lifetime (a restart leaves no window)."""
    return [
        "10.0.0.5:8001  http://10.0.0.5:8001/metrics",
        "server  vllm 0.9.2+",
        f"status  {status}   last good {ago} ago",
        "error   connection refused",
        f"restart {ago} ago",
        "model   twin-llama   engine 0",
        "KV      ████▉ 589/600  (98%)",
        *CONFIG,
        "leak    WARMUP  server restarted: evidence reset",
        "evidence used=589  pool=600  units=blocks",
        "stall   UNKNOWN  rates need another scrape",
        "limit   KV capacity  KV pool 98% used, 149 waiting",
        "        waiting=149  reasons=not exported: all waiting read as capacity  "
        "kv_usage=0.9817",
        *NOT_EXPORTED,
        "now     run 30  wait 149  preempt/s –  hit – (window)  lifetime 45%",
        "tok/s   prompt –  gen –   window –",
        "TTFT    1ms/420ms/492ms (lifetime)   ITL 5ms/9ms/10ms (lifetime)   "
        "E2E 242ms/448ms/495ms (lifetime)",
    ]


class FleetApp(App[None]):
    """The main screen the detail is pushed over."""

    CSS_PATH = STYLESHEET

    def compose(self) -> ComposeResult:
        yield Static("the fleet", id="fleet")


def _fed(target: Target, *scrapes: Scrape) -> TargetTracker:
    tracker = TargetTracker(target)
    for scrape in scrapes:
        tracker.update(read_scrape(scrape))
    return tracker


def _source(tracker: TargetTracker, key: EngineKey | None) -> DetailSource:
    """As the app's: the tracker's state and the engine's history, read at each redraw."""
    return lambda: (tracker.state, list(tracker.history.get(key, ())) if key else [], key)


def _band() -> Band | None:
    """A real baseline's band for HOST_A's engine; it knows no waiting count."""
    figures = {"kv_usage": Figure(0.40, (), {"p5": 0.1, "p95": 0.8}), "running": Figure(12.0),
               "hit_rate": Figure(0.3), "prompt_tps": Figure(4000.0),
               "generation_tps": Figure(2000.0), "ttft_p50": Figure(0.2),
               "ttft_p99": Figure(0.5), "itl_p50": Figure(0.02)}
    engine = EngineSummary(*KEY, config={"blocks_total": 599}, figures=figures)
    baseline = Baseline("healthy", "2026-12-01T00:00:00+00:00", "0", {"kind": "live"}, 10.0,
                        600.0, 60.0, targets=[TargetSummary(HOST_A.url, engines=[engine])])
    return BaselineOverlay({}, baseline).band(HOST_A.url, KEY)


def _busy() -> TargetTracker:
    return _fed(HOST_A, Scrape(HOST_A, T0, fixture_text(LOADED)),
                Scrape(HOST_A, T0 + 10, fixture_text(IDLE)))


def _info(screen: DetailScreen) -> list[str]:
    return str(screen.query_one("#detail-info", Static).render()).split("\n")


def _plots(screen: DetailScreen) -> dict[str, ChartPane]:
    return {key: screen.query_one(f"#plot-{key}", ChartPane) for key in PANE_KEYS}


def _titles(screen: DetailScreen) -> dict[str, str]:
    return {key: Text.from_markup(str(plot.border_title)).plain
            for key, plot in _plots(screen).items()}


async def _opened(app: App[None], pilot: Pilot[None], screen: DetailScreen) -> None:
    await app.push_screen(screen)
    await pilot.pause()


def test_the_baseline_s_levels_for_each_pane_at_the_pool_s_size_now() -> None:
    band = _band()
    assert references("kv", band, 600) == (Rule("base p5-95", "base", 60.0),
                                           Rule("", "base", 480.0))
    assert references("kv", band) == (Rule("base p5-95", "base", 0.1 * 599),
                                      Rule("", "base", 0.8 * 599))  # the baseline's pool
    assert references("queue", band) == (Rule("base run", "base", 12.0),)  # no waiting known
    assert references("hit", band) == (Rule("base hit", "base", 30.0),)  # a percentage
    assert references("tps", band) == (Rule("base in", "base", 4000.0),
                                       Rule("base out", "base", 2000.0))
    assert references("lat", band) == (Rule("base p50", "base", 0.2),
                                       Rule("base p99", "base", 0.5),
                                       Rule("base ITL", "base", 0.02))
    assert references("gpu", band) == () and references("kv", None, 600) == ()
    unknown = Band("bare", *[None] * 12)  # a baseline that knows nothing: no level at all
    assert [references(key, unknown, 600) for key in PANE_KEYS] == [()] * 5


async def test_a_busy_engine_every_line_and_the_charts_over_the_span_with_the_baseline(
        ) -> None:
    tracker, band = _busy(), _band()
    screen = DetailScreen(_source(tracker, KEY), clock=lambda: T0 + 12, span_s=SPAN_S,
                          charts=True, band=lambda: band)
    app = FleetApp()
    async with app.run_test(size=(200, 60)) as pilot:
        await _opened(app, pilot, screen)
        assert _info(screen) == BUSY
        history = list(tracker.history[KEY])
        want = {p.key: p for p in detail_panes(history[-1], history, T0 + 12, SPAN_S, band)}
        assert {key: plot._view for key, plot in _plots(screen).items()} == want
        assert _titles(screen) == {
            "kv": "KV blocks of 600 ┄ idle floor ┄ base p50 (healthy) ┄ base p5-95",
            "queue": "requests ━ run ━ wait ┄ base run",
            "hit": "prefix hit % (window) ┄ base hit",
            "tps": "tok/s ━ in ━ out ┄ base in ┄ base out",
            "lat": "TTFT ━ p50 ━ p99 ━ ITL ┄ base p50 ┄ base p99 ┄ base ITL"}
        # two plots a row (kvtop.tcss's .plot: 14 rows) under the 20 lines and their margin
        assert [tuple(plot.region) for plot in _plots(screen).values()] == [
            (1, 21, 97, 14), (100, 21, 97, 14), (1, 35, 97, 14), (100, 35, 97, 14),
            (1, 49, 97, 14)]
        # each a pane of kvtop.tcss: its chart inside a round border that carries the legend
        assert {key: (plot.styles.border_top[0], tuple(plot.content_size))
                for key, plot in _plots(screen).items()} == dict.fromkeys(PANE_KEYS,
                                                                         ("round", (95, 12)))
        kv = want["kv"].chart
        assert kv is not None and kv.span_s == SPAN_S and kv.now == T0 + 12
        assert [r.value for r in kv.rules if r.role == "base"] == [0.4 * 600, 60.0, 480.0]


async def test_an_engine_gone_with_its_server_keeps_its_last_numbers_at_each_redraw() -> None:
    tracker = _fed(HOST_B, Scrape(HOST_B, T0, fixture_text(IDLE)),
                   Scrape(HOST_B, T0 + 10, fixture_text(LOADED)),
                   Scrape(HOST_B, T0 + 20, failure="down", error="connection refused"))
    screen = DetailScreen(_source(tracker, KEY), clock=lambda: T0 + 22, span_s=SPAN_S,
                          charts=True)
    screen.show(T0 + 22)  # the app's redraw before the push: the mount fills it
    app = FleetApp()
    async with app.run_test(size=(200, 60)) as pilot:
        await _opened(app, pilot, screen)
        assert _info(screen) == _down_lines("down 12s", "12s")  # stale: engines kept
        tracker.update(Scrape(HOST_B, T0 + 100, failure="down", error="connection refused"))
        assert tracker.state.engines == []  # down long enough: the engines went
        screen.show(T0 + 102)
        await pilot.pause()
        assert _info(screen) == _down_lines("down 2m", "2m")  # from its history
        history = list(tracker.history[KEY])
        assert {key: plot._view for key, plot in _plots(screen).items()} == {
            p.key: p for p in detail_panes(history[-1], history, T0 + 102, SPAN_S, None)}
        assert "base" not in "".join(_titles(screen).values())  # no baseline: no level


def _two_engines() -> str:
    """One server, two data-parallel engines (engine 1 the busier)."""
    first = vllm_body(engine="0", running="3", usage="0.25")
    return first + vllm_body(engine="1", running="7", usage="0.75").split("\n", 1)[1]


async def test_the_engine_asked_for_among_two_and_servers_with_no_numbers() -> None:
    two = _fed(HOST_A, Scrape(HOST_A, T0, _two_engines()))
    two.state.kv_channel = KvChannel(KvEventsEndpoint("tcp://10.0.0.5:5557"),
                                     [RankStatus(0, "connected")])
    gateway = _fed(GATEWAY, Scrape(GATEWAY, T0, "# TYPE up gauge\nup 1\n"))
    screen = DetailScreen(_source(two, ("m", "1")), clock=lambda: T0 + 2, span_s=SPAN_S,
                          charts=True)
    app = FleetApp()
    async with app.run_test(size=(200, 60)) as pilot:
        await _opened(app, pilot, screen)
        assert _info(screen) == [
            "10.0.0.5:8000  http://10.0.0.5:8000/metrics",
            "server  vllm 0.9.2+",
            "status  up   last good 2s ago",
            "model   m   engine 1",
            "KV      ███▊░ 750/1000  (75%)",
            "config  num_gpu_blocks 1000  block_size 16  kv_cache_size_tokens 16.0k  "
            "enable_prefix_caching –",  # no other label, and never the engine's
            "leak    WARMUP  collecting data",
            "evidence used=750  pool=1000  units=blocks",
            "stall   UNKNOWN  rates need another scrape",
            "limit   token budget  KV pool 75% used and the running count moving, 1 waiting: "
            "the step's token budget",
            "        waiting=1  reasons=not exported: all waiting read as capacity  "
            "kv_usage=0.75",
            *NOT_EXPORTED[:3],
            "events  KV events: connected to tcp://10.0.0.5:5557, no batch yet",
            "now     run 7  wait 1  preempt/s –  hit – (window)  lifetime –",
            "tok/s   prompt –  gen –   window –",
            "TTFT    –   ITL –   E2E –"]
        for tracker, at, lines in (
                (gateway, T0 + 2, [
                    "gateway  http://gw.internal:9090/metrics", "server  unknown",
                    "status  unknown   last good 2s ago",
                    "note    no inference-server metrics found: not vLLM, SGLang, llama.cpp "
                    "or TRT-LLM (or vLLM started with --disable-log-stats)"]),
                (TargetTracker(HOST_B), T0 + 5, [  # never scraped yet
                    "10.0.0.5:8001  http://10.0.0.5:8001/metrics", "server  –",
                    "status  …   last good never"])):
            screen = DetailScreen(_source(tracker, None), clock=partial(float, at),
                                  span_s=SPAN_S, charts=True)
            await _opened(app, pilot, screen)
            assert _info(screen) == lines
            for plot in _plots(screen).values():
                assert plot._view is None and plot.border_title is None
                assert plot.render_line(0).text.rstrip() == "no numbers yet"


async def test_with_charts_off_the_screen_says_so_and_draws_none() -> None:
    screen = DetailScreen(_source(_busy(), KEY), clock=lambda: T0 + 12, span_s=SPAN_S,
                          charts=False, band=_band)
    app = FleetApp()
    async with app.run_test(size=(200, 60)) as pilot:
        await _opened(app, pilot, screen)
        assert _info(screen) == BUSY
        assert not screen.query(ChartPane)
        assert str(screen.query_one("#detail-nocharts", Static).render()) == (
            "charts off (--low-bandwidth)")


async def test_at_80x24_lines_end_in_an_ellipsis_the_body_scrolls_and_escape_goes_back(
        ) -> None:
    screen = DetailScreen(_source(_busy(), KEY), clock=lambda: T0 + 12, span_s=SPAN_S,
                          charts=True, band=_band)
    app = FleetApp()
    async with app.run_test(size=(80, 24)) as pilot:
        await _opened(app, pilot, screen)
        info = screen.query_one("#detail-info", Static)
        assert [info.render_line(y).text for y in (4, 5, 6, 7)] == [
            "KV      ▏░░░░ 1/600  (0%)",
            "config  num_gpu_blocks 600  block_size 16  kv_cache_size_tokens 9600  enabl…",
            "        cache_dtype auto  calculate_kv_scales False  cpu_kvcache_space_byte…",
            "leak    OK  pool drained to its idle floor: nothing leaked so far (idle flo…"]
        assert "Back" in app.export_screenshot()  # the footer names Escape's action
        body = screen.query_one("#detail-body")
        assert body.scroll_y == 0 and body.max_scroll_y > 0
        await pilot.press("end")
        assert body.scroll_y == body.max_scroll_y
        await pilot.press("escape")
        await pilot.pause()
        assert not isinstance(app.screen, DetailScreen) and len(app.screen_stack) == 1


async def test_outside_text_is_shown_as_written_never_read_as_markup() -> None:
    target = Target.from_spec("10.0.0.9:8000", name="[b]gw[/b]")
    tracker = _fed(target, Scrape(target, T0, failure="down", error="[red]no[/red]\nmore"))
    screen = DetailScreen(_source(tracker, None), clock=lambda: T0 + 1, span_s=SPAN_S,
                          charts=True)
    app = FleetApp()
    async with app.run_test(size=(120, 30)) as pilot:
        await _opened(app, pilot, screen)
        assert _info(screen) == ["[b]gw[/b]  http://10.0.0.9:8000/metrics", "server  –",
                                 "status  down   last good never",
                                 "error   [red]no[/red]\\x0amore"]  # one line
        info = screen.query_one("#detail-info", Static)
        assert info.render_line(0).text.startswith("[b]gw[/b]  http://10.0.0.9:8000/metrics")
        assert not describe(tracker.state, None, T0 + 1).spans  # one plain Text


def test_the_text_is_cut_never_wrapped() -> None:
    text = describe(_busy().state, None, T0 + 12)
    assert text.no_wrap is True and text.overflow == "ellipsis"


def test_a_server_that_names_no_model_nor_labels_its_pool_gets_what_was_derived() -> None:
    said = {}
    for name in ("llamacpp-2025-build-zh-doc.txt", "trtllm-triton-inflight-batcher-readme.txt",
                 "sglang-0.3.x-docs-production-metrics.txt"):
        tracker = _fed(HOST_A, Scrape(HOST_A, T0, fixture_text(name)))
        [stats] = tracker.state.engines
        said[name.split("-")[0]] = [line for line in describe(tracker.state, stats, T0).plain
                                    .split("\n") if line.startswith(("model", "KV", "config"))]
    assert said == {
        "llamacpp": ["model   –   engine –", "KV      –  (–)",  # nothing said of the pool
                     "config  num_gpu_blocks –  block_size –  kv_cache_size_tokens –  "
                     "enable_prefix_caching –"],
        "trtllm": ["model   tensorrt_llm   engine –", "KV      ▏░░░░ 1/6239  (0%)",
                   "config  num_gpu_blocks 6239  block_size 64  kv_cache_size_tokens 399.3k  "
                   "enable_prefix_caching –"],
        "sglang": ["model   meta-llama/Llama-3.1-8B-Instruct   engine –",
                   "KV      █▍░░░ 28%  (28%)",  # a usage, no blocks
                   "config  num_gpu_blocks –  block_size –  kv_cache_size_tokens –  "
                   "enable_prefix_caching –"]}
    derived = EngineStats("m", "0", NOW, blocks_total=1999, block_size=16, tokens_total=31984,
                          prefix_caching=False)
    assert config_lines(derived) == ["config  num_gpu_blocks 1999  block_size 16  "
                                     "kv_cache_size_tokens 32.0k  enable_prefix_caching False"]
    assert config_lines(_leaking(514.0, NOW)) == [  # the label wins; "_" keys are kvtop's
        "config  num_gpu_blocks 1999  block_size 16  kv_cache_size_tokens –  "
        "enable_prefix_caching –", "        cache_dtype auto"]


def _verdict(state: str, evidence: int) -> LeakVerdict:
    return LeakVerdict(state, "why", 827.0, 120.0, 1.5,  # type: ignore[arg-type]
                       {f"e{i}": float(i) for i in range(evidence)})


def test_the_leak_s_figures_only_when_watched_and_four_evidence_items_a_line() -> None:
    assert leak_lines(None) == ["leak    not judged for this server"]
    assert leak_lines(_verdict("ok", 4)) == ["leak    OK  why", "evidence e0=0  e1=1  e2=2  e3=3"]
    assert leak_lines(_verdict("warmup", 5)) == [
        "leak    WARMUP  why", "evidence e0=0  e1=1  e2=2  e3=3", "         e4=4"]
    figures = "        leaked 827 blocks  slope +120/h  full in 1.5h"
    assert leak_lines(_verdict("watch", 0)) == ["leak    WATCH  why", figures]
    assert leak_lines(_verdict("leak", 9)) == [
        "leak    LEAK  why", figures, "evidence e0=0  e1=1  e2=2  e3=3",
        "         e4=4  e5=5  e6=6  e7=7", "         e8=8"]


def test_the_stall_s_numbers_in_plain_digits_at_most_four_decimals() -> None:
    assert stall_lines(None) == []
    assert stall_lines(StallVerdict("stalled", "no progress", T0)) == [
        "stall   STALLED  no progress"]
    evidence: dict[str, float | str] = {
        "big": 100.4, "neg": -100.4, "under": 99.99, "negunder": -99.99, "tiny": 0.00001,
        "zero": 0.0, "half": 12.5, "count": 3, "word": "a\nb", "huge": 1.5e7}
    assert stall_lines(StallVerdict("ok", "moving", T0, evidence)) == [
        "stall   OK  moving",
        "         big=100  neg=-100  under=99.99  negunder=-99.99  tiny=0  zero=0  half=12.5  "
        "count=3  word=a\\x0ab  huge=15000000"]


async def test_the_screen_hands_the_history_to_the_leak_s_growth() -> None:
    history = [_leaking(514.0 + 547.0 * i / 4, NOW - 240 + 60 * i) for i in range(5)]
    state = TargetState(Target.from_spec("h:1"), "up", kind="vllm", engines=[history[-1]],
                        last_good_t=NOW)
    screen = DetailScreen(lambda: (state, history, ("m", "0")), clock=lambda: NOW,
                          span_s=SPAN_S, charts=False)
    app = FleetApp()
    async with app.run_test(size=(120, 40)) as pilot:
        await _opened(app, pilot, screen)
        assert _info(screen)[7:9] == [
            "leak    LEAK  blocks held with nothing running",
            "        leaked 514 → 1061 blocks in 4m: +8.2k/h here, full in 7m at that pace"]
