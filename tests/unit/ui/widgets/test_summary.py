"""The header's second line at 80 columns: the fleet's load, hit rate and tokens/s stay;
the view's settings go first, and a GPU that can't be read is a note that goes before any
of them."""

from __future__ import annotations

from dataclasses import replace
from itertools import pairwise
from pathlib import Path
from typing import Any

from rich.style import Style
from rich.text import Text
from textual.app import App, ComposeResult

import kvtop.ui
from kvtop.ui.widgets.summary import SummaryBar, _fit, _load_parts, _with_note
from kvtop.view import format as fmt
from kvtop.view.fleet_summary import FleetSummary

SUMMARY = FleetSummary(hosts_up=4, hosts_total=4, blocks_used=771, blocks_total=7996,
                       running=11, waiting=1, hit_rate=0.76, prompt_tps=12_200.0,
                       generation_tps=2060.0)
SETTINGS = [(4, [("every ", "key"), ("1s", "")]), (3, [("sort ", "key"), ("name ▲", "")])]
NVML = ("no NVML", "NVML: NVML Shared Library Not Found")


def _line(parts: list) -> str:
    return "  ".join("".join(piece for piece, _ in pieces) for _, pieces in parts)


def test_at_80_columns_a_missing_gpu_never_pushes_the_fleet_s_numbers_off() -> None:
    line = _line(_with_note([*_load_parts(SUMMARY), *SETTINGS], NVML, 78))
    assert line == "run 11  wait 1  hit 76%  tok/s 12.2k in 2060 out  every 1s  sort name ▲"
    # the settings fit with nothing to spare: the note, short or long, is the first to go
    assert "GPU" not in line


def test_the_gpu_note_is_short_where_it_fits_and_whole_where_there_is_room() -> None:
    parts = [*_load_parts(SUMMARY), *SETTINGS]
    width = len(_line(parts)) + len("  GPU no NVML")
    assert _line(_with_note(parts, NVML, width)).endswith("  GPU no NVML")
    assert "GPU" not in _line(_with_note(parts, NVML, width - 1))  # a hair narrower: none
    assert _line(_with_note(parts, NVML, 200)).endswith("GPU NVML: NVML Shared Library Not Found")


def test_settings_go_before_the_fleet_s_load() -> None:
    parts = [*_load_parts(SUMMARY), *SETTINGS]
    assert _line(_fit(parts, 50)) == "run 11  wait 1  hit 76%  tok/s 12.2k in 2060 out"


# -- the bar mounted in a small app with kvtop's stylesheet (Pilot) ------------------------

STYLESHEET = Path(kvtop.ui.__file__).parent / "kvtop.tcss"
FIXED: dict[str, Any] = {"interval_s": 1.0, "sort_label": "name ▲", "filter_text": "",
                         "paused": False}
RIGHT = [("hosts ", "key"), ("4/4", ""), (" up", "key"), ("  ", ""), ("LEAK 0", "key"),
         (" ", ""), ("WATCH 0", "key"), (" ", ""), ("STALL 0", "key")]
LOAD = [("run ", "key"), ("11", ""), ("  ", ""), ("wait ", "key"), ("1", "warn"), ("  ", ""),
        ("hit ", "key"), ("76%", ""), ("  ", ""), ("tok/s ", "key"), ("12.2k in 2060 out", "")]
EVERY_SORT = [("  ", ""), ("every ", "key"), ("1s", ""), ("  ", ""), ("sort ", "key"),
              ("name ▲", "")]


class CountingBar(SummaryBar):
    """Counts its updates (most refreshes repeat: an unchanged header must not repaint) and
    the styles it looks up (each role once, and only roles kvtop.tcss has)."""

    updates = 0
    looked_up: list[str]

    def get_component_rich_style(self, *names: str, partial: bool = False) -> Style:
        self.looked_up = [*getattr(self, "looked_up", []), *names]
        return super().get_component_rich_style(*names, partial=partial)

    def update(self, *args: object, **kwargs: object) -> None:
        self.updates += 1
        super().update(*args, **kwargs)  # type: ignore[arg-type]


class BarApp(App[None]):
    CSS_PATH = STYLESHEET

    def compose(self) -> ComposeResult:
        yield CountingBar(id="summary")


def expected(bar: SummaryBar, *lines: list[tuple[str, str]]) -> Text:
    """The lines' pieces, each in its role's style in kvtop.tcss."""
    text = Text()
    for number, pieces in enumerate(lines):
        if number:
            text.append("\n")
        for piece, role in pieces:
            text.append(piece, bar.get_component_rich_style(f"summary--{role}")
                        if role else None)
    return text


def meter(cells: int, usage_role: str, blocks: str, fraction: float | None) -> list:
    bar = fmt.bar(fraction, cells)
    filled = bar.rstrip("░·")
    return [("KV ", "key"), ("[", "key"), (filled, usage_role), (bar[len(filled):], "track"),
            ("]", "key"), (blocks, ""), ("  ", ""), *RIGHT]


def shown(bar: SummaryBar) -> Text:
    text = bar.content
    assert isinstance(text, Text)
    assert (text.no_wrap, text.overflow) == (True, "ellipsis")
    return text


async def test_both_lines_exactly_in_their_roles_styles_filling_the_width() -> None:
    async with BarApp().run_test(size=(102, 4)) as pilot:
        bar = pilot.app.query_one(CountingBar)
        assert bar.content_size.width == 100
        bar.show(SUMMARY, **FIXED)
        # the bar takes what the rest leaves: 100 - 63 cells of text around it
        want = expected(bar, meter(37, "bar", " 771/7996 blocks 10%", 771 / 7996),
                        [*LOAD, *EVERY_SORT])
        assert shown(bar) == want
        assert len(want.plain.split("\n")[0]) == 100
        await pilot.pause()
        assert str(bar.render()).split("\n")[0] == want.plain.split("\n")[0]


async def test_the_bar_keeps_ten_cells_at_least_and_sixty_at_most() -> None:
    async with BarApp().run_test(size=(75, 4)) as pilot:  # 73 cells: exactly ten for the bar
        bar = pilot.app.query_one(CountingBar)
        bar.show(SUMMARY, **FIXED)
        assert shown(bar).plain.split("\n")[0] == _line_of(
            meter(10, "bar", " 771/7996 blocks 10%", 771 / 7996))
        await pilot.resize_terminal(74, 4)  # a cell narrower: still ten, drawn again at once
        await pilot.pause()
        assert shown(bar).plain.split("\n")[0] == _line_of(
            meter(10, "bar", " 771/7996 blocks 10%", 771 / 7996))  # the terminal cuts it
        await pilot.resize_terminal(76, 4)
        await pilot.pause()
        assert shown(bar).plain.split("\n")[0] == _line_of(
            meter(11, "bar", " 771/7996 blocks 10%", 771 / 7996))
        await pilot.resize_terminal(125, 4)  # 123 cells: exactly sixty
        await pilot.pause()
        assert shown(bar).plain.split("\n")[0] == _line_of(
            meter(60, "bar", " 771/7996 blocks 10%", 771 / 7996))
        await pilot.resize_terminal(126, 4)  # wider: still sixty
        await pilot.pause()
        assert shown(bar).plain.split("\n")[0] == _line_of(
            meter(60, "bar", " 771/7996 blocks 10%", 771 / 7996))


def _line_of(pieces: list[tuple[str, str]]) -> str:
    return "".join(piece for piece, _ in pieces)


async def test_the_filled_bar_warns_from_80_percent_and_is_bad_from_95() -> None:
    async with BarApp().run_test(size=(102, 4)) as pilot:
        bar = pilot.app.query_one(CountingBar)
        for used, role, blocks in ((7999, "bar", " 7999/10.0k blocks 80%"),
                                   (8000, "warn", " 8000/10.0k blocks 80%"),
                                   (9499, "warn", " 9499/10.0k blocks 95%"),
                                   (9500, "bad", " 9500/10.0k blocks 95%")):
            summary = replace(SUMMARY, blocks_used=used, blocks_total=10_000)
            bar.show(summary, **FIXED)
            cells = 100 - 63 - (len(blocks) - 20)
            assert shown(bar) == expected(bar, meter(cells, role, blocks, used / 10_000),
                                          [*LOAD, *EVERY_SORT]), used


async def test_no_blocks_known_is_a_dotted_track_and_a_dash() -> None:
    async with BarApp().run_test(size=(102, 4)) as pilot:
        bar = pilot.app.query_one(CountingBar)
        bar.show(replace(SUMMARY, blocks_used=None), **FIXED)
        assert shown(bar) == expected(bar, meter(55, "bar", " –", None),
                                      [*LOAD, *EVERY_SORT])


async def test_hosts_down_verdicts_and_saturation_loud_only_when_not_zero() -> None:
    async with BarApp().run_test(size=(142, 4)) as pilot:
        bar = pilot.app.query_one(CountingBar)
        summary = replace(SUMMARY, hosts_up=3, leaks=1, watches=2, stalls=3, saturated=4,
                          waiting=0, limits=(("blocks", 2), ("seqs", 1)))
        bar.show(summary, **FIXED)
        right = [("hosts ", "key"), ("3/4", "bad"), (" up", "key"), ("  ", ""),
                 ("LEAK 1", "flag"), (" ", ""), ("WATCH 2", "warn"), (" ", ""),
                 ("STALL 3", "flag"), (" ", ""), ("SATURATED 4", "warn")]
        blocks = " 771/7996 blocks 10%"
        plain = fmt.bar(771 / 7996, 60)
        filled = plain.rstrip("░")
        load = [("run ", "key"), ("11", ""), ("  ", ""), ("wait ", "key"), ("0", ""),
                ("  ", ""), ("held by ", "key"), ("blocks 2 seqs 1", "warn"), *LOAD[5:]]
        assert shown(bar) == expected(
            bar, [("KV ", "key"), ("[", "key"), (filled, "bar"), (plain[len(filled):], "track"),
                  ("]", "key"), (blocks, ""), ("  ", ""), *right], [*load, *EVERY_SORT])
        assert len(shown(bar).plain.split("\n")[0]) == 4 + 60 + 1 + 20 + 2 + 12 + 2 + 34


async def test_every_setting_said_with_its_role_and_search_text_never_markup() -> None:
    async with BarApp().run_test(size=(202, 4)) as pilot:
        bar = pilot.app.query_one(CountingBar)
        bar.show(SUMMARY, interval_s=0.5, sort_label="KV use ▼", filter_text="[b]x",
                 paused=True, shown=(3, 40), recording="disk full", group_label="model")
        second = [*LOAD, ("  ", ""), ("every ", "key"), ("0.5s", ""), ("  ", ""),
                  ("sort ", "key"), ("KV use ▼", ""), ("  ", ""), ("groups ", "key"),
                  ("model", ""), ("  ", ""), ("filter ", "key"), ("'[b]x'", "warn"),
                  (" 3 of 40 shown", "key"), ("  ", ""), ("PAUSED", "flag"), ("  ", ""),
                  ("REC ", "bad"), ("disk full", "bad")]
        assert shown(bar).split("\n")[1] == expected(bar, second)
        bar.show(SUMMARY, **{**FIXED, "filter_text": "llama"}, recording="")
        assert shown(bar).split("\n")[1] == expected(
            bar, [*LOAD, *EVERY_SORT, ("  ", ""), ("filter ", "key"), ("'llama'", "warn"),
                  ("", "key"), ("  ", ""), ("REC", "key")])


async def test_each_role_looked_up_once_and_only_the_stylesheet_s_roles() -> None:
    async with BarApp().run_test(size=(202, 4)) as pilot:
        bar = pilot.app.query_one(CountingBar)
        bar.looked_up = []
        summary = replace(SUMMARY, hosts_up=3, leaks=1, saturated=1, waiting=0,
                          limits=(("blocks", 2),))
        for hosts_up in (3, 4, 3):  # down, then all up: "bad", then no style
            bar.show(replace(summary, hosts_up=hosts_up), interval_s=1.0, sort_label="name",
                     filter_text="x", paused=True, recording="disk full",
                     group_label="model", gpu_note=NVML)
        assert sorted(bar.looked_up) == sorted(
            f"summary--{role}" for role in ("key", "bar", "track", "bad", "flag", "warn"))
        assert shown(bar).plain.split("\n")[1].endswith("GPU NVML: NVML Shared Library Not Found")
        text = shown(bar)
        assert [(text.plain[span.start:span.end], span.style) for span in text.spans[-2:]] == [
            ("GPU ", bar.get_component_rich_style("summary--key")),
            ("NVML: NVML Shared Library Not Found", bar.get_component_rich_style("summary--warn"))]


async def test_on_a_tiny_terminal_the_fleet_s_load_and_alarms_stay_whole() -> None:
    async with BarApp().run_test(size=(22, 4)) as pilot:
        bar = pilot.app.query_one(CountingBar)
        bar.show(SUMMARY, interval_s=1.0, sort_label="name", filter_text="x", shown=(3, 40),
                 paused=True, recording="disk full", group_label="model", gpu_note=NVML)
        assert shown(bar).plain.split("\n") == [
            _line_of(meter(10, "bar", " 771/7996 blocks 10%", 771 / 7996)),
            "run 11  wait 1  filter 'x' 3 of 40 shown  PAUSED  REC disk full"]


async def test_the_groups_go_before_what_holds_the_fleet_back() -> None:
    summary = replace(SUMMARY, limits=(("blocks", 2), ("seqs", 1)))
    held = f"{_line_of(LOAD[:5])}  held by blocks 2 seqs 1  {_line_of(LOAD[6:])}"
    async with BarApp().run_test(size=(len(held) + 2, 4)) as pilot:
        bar = pilot.app.query_one(CountingBar)
        bar.show(summary, **FIXED, group_label="model")
        assert shown(bar).plain.split("\n")[1] == held


async def test_the_settings_go_in_their_order_as_the_line_narrows() -> None:
    async with BarApp().run_test(size=(202, 4)) as pilot:
        bar = pilot.app.query_one(CountingBar)
        settings = {**FIXED, "recording": "", "group_label": "model", "paused": True}
        load = _line_of(LOAD)
        full = f"{load}  every 1s  sort name ▲  groups model  PAUSED  REC"
        # each width is exactly what is left: a cell fewer drops the next part
        steps = [full, f"{load}  sort name ▲  groups model  PAUSED  REC",
                 f"{load}  groups model  PAUSED  REC", f"{load}  groups model  PAUSED",
                 f"{load}  PAUSED"]
        for longer, shorter in pairwise(steps):
            await pilot.resize_terminal(len(longer) + 2, 4)
            await pilot.pause()
            bar.show(SUMMARY, **settings)
            assert shown(bar).plain.split("\n")[1] == longer
            await pilot.resize_terminal(len(longer) + 1, 4)
            await pilot.pause()
            assert shown(bar).plain.split("\n")[1] == shorter


async def test_an_unchanged_header_is_not_repainted_and_a_changed_one_is() -> None:
    async with BarApp().run_test(size=(102, 4)) as pilot:
        bar = pilot.app.query_one(CountingBar)
        bar.show(SUMMARY, **FIXED)
        bar.show(SUMMARY, **FIXED)
        assert bar.updates == 1
        bar.show(replace(SUMMARY, running=12), **FIXED)
        assert bar.updates == 2
        assert shown(bar).plain.split("\n")[1].startswith("run 12  ")


async def test_a_new_theme_restyles_the_header() -> None:
    async with BarApp().run_test(size=(102, 4)) as pilot:
        bar = pilot.app.query_one(CountingBar)
        bar.show(SUMMARY, **FIXED)
        pilot.app.theme = "textual-light" if pilot.app.theme != "textual-light" else "nord"
        await pilot.pause()
        bar.show(replace(SUMMARY, running=12), **FIXED)
        assert shown(bar).spans == expected(
            bar, meter(37, "bar", " 771/7996 blocks 10%", 771 / 7996),
            [("run ", "key"), ("12", ""), *LOAD[2:], *EVERY_SORT]).spans


async def test_a_bar_not_yet_laid_out_draws_for_200_cells() -> None:
    async with BarApp().run_test(size=(102, 4)) as pilot:
        bar = SummaryBar()
        await pilot.app.mount(bar)
        assert bar.content_size.width == 0
        bar.show(SUMMARY, **FIXED)
        assert shown(bar).plain.split("\n")[0] == _line_of(
            meter(60, "", " 771/7996 blocks 10%", 771 / 7996))
        # a second line of 201 cells is a cell too long: its least part goes
        settings = f"  sort name ▲  filter '{'x' * 200}'"
        pad = 201 - len(_line_of([*LOAD, *EVERY_SORT[:3]]) + settings)
        bar.show(SUMMARY, **{**FIXED, "filter_text": "x" * (200 + pad)})
        assert shown(bar).plain.split("\n")[1] == (
            _line_of(LOAD) + f"  sort name ▲  filter '{'x' * (200 + pad)}'")
