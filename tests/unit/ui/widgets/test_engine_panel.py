"""The engine panel: at 80x24 without a terminal, a row per sparkline with its number and
unit, then as many figures as the rows left hold; then mounted in a small app with kvtop's
stylesheet (Pilot): each row in its role's style, the line to the panel's edge, never read as
markup, drawn again at each resize and repainted only when it changes."""

from __future__ import annotations

from pathlib import Path

from rich.style import Style
from rich.text import Text
from textual.app import App, ComposeResult

import kvtop.ui
from kvtop.collect.target import Target
from kvtop.derive.stats import EngineStats
from kvtop.derive.tracker import TargetState
from kvtop.ui.widgets.engine_panel import EnginePanel, Spark, panel_lines, sparks
from kvtop.view.chart import Chart, Series
from kvtop.view.engine import EngineView, PaneView, engine_view
from kvtop.view.fleet import build_rows

NOW = 10_000.0
GIB = 1 << 30
STYLESHEET = Path(kvtop.ui.__file__).parent / "kvtop.tcss"


def _view():
    history = [EngineStats("m", "0", NOW - 5 * i, blocks_total=1999, blocks_used=100.0 + i,
                           kv_usage=(100 + i) / 1999, running=3, waiting=0,
                           prompt_tps=398.0, generation_tps=138.0) for i in range(12)][::-1]
    state = TargetState(Target.from_spec("h:1"), "up", kind="vllm", engines=[history[-1]],
                        last_good_t=NOW)
    [row] = build_rows([state], NOW)
    return engine_view(row, state, history, NOW, 300.0)


def test_every_sparkline_says_its_number_with_its_unit() -> None:
    items = sparks(_view(), (), None)
    assert [s.label for s in items] == ["KV", "run", "wait", "hit", "tok/s", "TTFT"]
    tails = {s.label: "".join(piece for piece, _ in s.tail) for s in items}
    assert tails["tok/s"] == "138 out  398 in"  # not "398 in 138 out" beside a "gen" line
    assert tails["run"] == "3" and tails["KV"].endswith("100/1999 5%")


def test_the_rows_under_the_verdicts_go_to_sparklines_then_figures() -> None:
    view = _view()
    items = sparks(view, (), None)
    verdicts, figures = len(view.lines), len(view.facts)
    # 80x24 with four hosts: 14 rows under the panel's border
    assert panel_lines(view, items, 14) == (6, min(figures, 14 - verdicts - 6))
    assert panel_lines(view, items, verdicts + 3) == (3, 0)  # a crowded fleet: sparklines first
    assert panel_lines(view, items, 40) == (6, figures)
    assert panel_lines(view, items, 0) == (0, 0)


# The panel's parts from a view built by hand: each rule at its edge, each number exact.

def _pane(key: str, latest: str, chart: Chart | None, **by_series: str) -> PaneView:
    return PaneView(key, [], [(latest, "")], chart,
                    by_series={label: [(text, "")] for label, text in by_series.items()})


def _chart(*series: Series, top: float | None = None) -> Chart:
    return Chart(series, NOW, 60.0, top=top)


FULL = [(NOW - 60 + i, 8.0) for i in range(61)]  # at its chart's top the whole minute
HALF = [(NOW - 60 + i, 4.0) for i in range(61)]


def _hand_view() -> EngineView:
    kv = _pane("kv", "8/8 100%", _chart(Series("used", "s2", FULL), Series("x", "s3", HALF),
                                        top=8.0))
    queue = _pane("queue", "both", _chart(Series("run", "s1", HALF), Series("wait", "s3", FULL)),
                  run="4")  # wait has none of its own: the pane's
    hit = _pane("hit", "no hits yet", None)  # no chart yet: a blank line, its number
    tps = _pane("tps", "9 out", _chart(Series("in", "s1", FULL)))  # no "out": no line
    return EngineView("h:1 [b]x[/b]", lines=[[("LEAK ", "alarm"), ("[red]grows[/]", "")]],
                      panes=[tps, hit, queue, kv],
                      facts=[[("pool ", "key"), ("8 blocks", "")], [("lat ", "key"), ("1s", "")]])


def test_each_sparkline_its_series_scale_colour_and_number() -> None:
    assert sparks(_hand_view(), (), None) == [
        Spark("KV", FULL, 8.0, [("8/8 100%", "")], "s2"),
        Spark("run", HALF, 8.0, [("4", "")], "s1"),  # its own number, the pane's scale
        Spark("wait", FULL, 8.0, [("both", "")], "s3"),
        Spark("hit", (), 1.0, [("no hits yet", "")])]


def test_the_gpu_sparkline_follows_kv_only_where_the_server_s_gpus_are_known() -> None:
    series = [(NOW - 1, 3 * GIB, 80 * GIB), (NOW, None, 80 * GIB)]
    tail = [(" 0.0/80.0 GiB  what nvidia-smi sees", "")]
    gpu = Spark("GPU", [(NOW - 1, 3 * GIB), (NOW, None)], 80.0 * GIB, tail)
    assert sparks(_hand_view(), series, (0, 80 * GIB))[:2] == [
        sparks(_hand_view(), (), None)[0], gpu]
    assert [s.label for s in sparks(_hand_view(), series, None)] == ["KV", "run", "wait", "hit"]
    # no total known: the largest use seen is the full scale
    assert sparks(_hand_view(), series, (0, None))[1].top == 3.0 * GIB


def test_a_series_join_carries_to_its_sparkline() -> None:
    kv = _pane("kv", "1", _chart(Series("used", "s1", FULL, join_s=30.0)))
    assert sparks(EngineView("t", panes=[kv]), (), None)[0].join_s == 30.0


def test_the_rows_go_to_verdicts_then_sparklines_then_figures_at_each_edge() -> None:
    view = _hand_view()  # 1 verdict, 4 sparklines, 2 figures
    items = sparks(view, (), None)
    assert panel_lines(view, items, 0) == (0, 0)  # fewer rows than verdicts: nothing below
    assert panel_lines(view, items, 1) == (0, 0)
    assert panel_lines(view, items, 2) == (1, 0)
    assert panel_lines(view, items, 5) == (4, 0)
    assert panel_lines(view, items, 6) == (4, 1)
    assert panel_lines(view, items, 7) == (4, 2)
    assert panel_lines(view, items, 8) == (4, 2)


class CountingPanel(EnginePanel):
    """Counts its repaints (a redraw that changes nothing must not repaint) and remembers
    whether each refresh asked for a layout (the panel's height is fixed: it never should)."""

    updates = 0
    layouts: list[bool]

    def update(self, *args: object, **kwargs: object) -> None:
        self.updates += 1
        super().update(*args, **kwargs)  # type: ignore[arg-type]

    def refresh(self, *args: object, layout: bool = False, **kwargs: object) -> CountingPanel:
        self.layouts = [*getattr(self, "layouts", []), layout]
        return super().refresh(*args, layout=layout, **kwargs)  # type: ignore[arg-type]


class PanelApp(App[None]):
    CSS_PATH = STYLESHEET

    def compose(self) -> ComposeResult:
        yield CountingPanel(id="engine", classes="small")


def _styled(panel: EnginePanel, text: Text) -> list[tuple[str, Style | str | None]]:
    """Each styled run of ``text`` and its style."""
    return [(text.plain[s.start:s.end], s.style) for s in text.spans]


def _roles(panel: EnginePanel, *runs: tuple[str, str]) -> list[tuple[str, Style]]:
    """Each run in its role's style in kvtop.tcss."""
    return [(run, panel.get_component_rich_style(f"pane--{role}")) for run, role in runs]


async def test_the_panel_draws_verdicts_sparklines_to_its_edge_then_figures() -> None:
    # 40x8: 38 cells between the padding, 7 rows under the border
    async with PanelApp().run_test(size=(40, 8)) as pilot:
        panel = pilot.app.query_one(CountingPanel)
        panel.show(_hand_view(), now=NOW, span_s=60.0)
        shown = panel.content
        assert isinstance(shown, Text)
        # the longest number "no hits yet" and a space end at the edge: 20 cells of line
        assert shown.plain == "\n".join([
            "LEAK [red]grows[/]",
            "KV    " + "█" * 20 + " 8/8 100%",
            "run   " + "▄" * 20 + " 4",
            "wait  " + "█" * 20 + " both",
            "hit   " + " " * 20 + " no hits yet",
            "pool 8 blocks",
            "lat 1s"])
        assert _styled(panel, shown) == _roles(
            panel, ("LEAK ", "alarm"), ("KV    ", "key"), ("█" * 20, "s2"), ("run   ", "key"),
            ("▄" * 20, "s1"), ("wait  ", "key"), ("█" * 20, "s3"), ("hit   ", "key"),
            (" " * 20, "s1"), ("pool ", "key"), ("lat ", "key"))
        assert panel.border_title == r"h:1 \[b]x\[/b]"  # a name, never markup
        assert panel.classes == {"small"}
        await pilot.pause()
        assert str(panel.render()).splitlines()[0] == "LEAK [red]grows[/]"


async def test_without_sparklines_the_numbers_follow_their_labels() -> None:
    async with PanelApp().run_test(size=(40, 8)) as pilot:
        panel = pilot.app.query_one(CountingPanel)
        panel.show(_hand_view(), now=NOW, span_s=60.0, charts=False)
        assert isinstance(panel.content, Text)
        assert panel.content.plain.splitlines()[1:5] == [
            "KV    8/8 100%", "run   4", "wait  both", "hit   no hits yet"]


async def test_a_resize_redraws_for_the_new_size_and_only_a_change_repaints() -> None:
    async with PanelApp().run_test(size=(40, 8)) as pilot:
        panel = pilot.app.query_one(CountingPanel)
        await pilot.pause()
        assert panel.updates == 0 and str(panel.render()) == ""  # nothing handed: nothing drawn
        panel.layouts = []
        panel.show(_hand_view(), now=NOW, span_s=60.0)
        panel.show(_hand_view(), now=NOW, span_s=60.0)
        assert panel.updates == 1
        assert panel.layouts and True not in panel.layouts  # repaints, never a layout
        # 40 cells, 4 rows: the last sparkline goes, and its number no longer sets the width
        await pilot.resize_terminal(42, 5)
        await pilot.pause()
        assert isinstance(panel.content, Text)
        assert panel.content.plain.splitlines() == [
            "LEAK [red]grows[/]", "KV    " + "█" * 25 + " 8/8 100%",
            "run   " + "▄" * 25 + " 4", "wait  " + "█" * 25 + " both"]
        assert panel.updates == 2


async def test_a_panel_narrower_than_its_labels_and_numbers_draws_no_line() -> None:
    async with PanelApp().run_test(size=(12, 8)) as pilot:
        panel = pilot.app.query_one(CountingPanel)
        panel.show(_hand_view(), now=NOW, span_s=60.0)
        assert isinstance(panel.content, Text)
        assert panel.content.plain.splitlines()[1] == "KV     8/8 100%"


async def test_a_silence_no_longer_than_its_series_join_is_drawn_as_a_line() -> None:
    gap = [point for point in FULL if not NOW - 40 < point[0] < NOW - 5]  # 35 s of silence
    kv = _pane("kv", "8", _chart(Series("used", "s1", gap, join_s=35.0), top=8.0))
    cut = _pane("queue", "8", _chart(Series("run", "s1", gap), top=8.0))
    async with PanelApp().run_test(size=(30, 8)) as pilot:  # 20 cells of line: 3 s a cell
        panel = pilot.app.query_one(CountingPanel)
        panel.show(EngineView("t", panes=[kv, cut]), now=NOW, span_s=60.0)
        assert isinstance(panel.content, Text)
        assert panel.content.plain.splitlines() == [
            "KV    " + "█" * 20 + " 8", "run   " + "█" * 7 + " " * 10 + "███ 8"]


async def test_a_view_without_charts_is_its_verdicts_and_figures_alone() -> None:
    view = EngineView("no engine selected", lines=[[("down ", "bad"), ("refused", "")]],
                      facts=[[("server ", "key"), ("vllm", "")]])
    async with PanelApp().run_test(size=(40, 8)) as pilot:
        panel = pilot.app.query_one(CountingPanel)
        panel.show(view, now=NOW, span_s=60.0)
        assert isinstance(panel.content, Text)
        assert panel.content.plain == "down refused\nserver vllm"
