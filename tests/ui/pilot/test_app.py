"""Pilot tests of the app over real /metrics bodies, a hand-driven source and fake NVML."""

from __future__ import annotations

import functools
import json
from collections.abc import Callable
from pathlib import Path

import pytest

from kvtop.collect.target import Scrape, Target
from kvtop.ui.app import AppConfig, KvtopApp
from kvtop.ui.gpu_watch import GPU_MIN_PERIOD_S
from kvtop.ui.screens.detail import DetailScreen
from kvtop.ui.widgets.gpu_pane import GpuPane
from tests.fakes.fake_nvml import FakeGpuReader
from tests.fakes.fake_source import FakeSource
from tests.scenarios.app import (
    GATEWAY,
    HOST_A,
    HOST_B,
    LEAKING_IDLE,
    T0,
    TOKEN,
    UNDER_LOAD,
    live_app,
    live_data_shown,
    screen_shows,
    table_rows,
    until,
)
from tests.support.paths import fixture_text
from tests.support.waiting import eventually

WIDE = (200, 40)  # every column fits beside the GPU pane


def _by_name(app: KvtopApp) -> dict[str, dict[str, str]]:
    return {row["name"]: row for row in table_rows(app)}


# The leaking-idle 0.10.1.1 scrape: 172 of 1000 blocks free (fixtures' INDEX.md)
LEAKING_IDLE_KV = " 828/1000"


def _draws(app: KvtopApp, monkeypatch: pytest.MonkeyPatch) -> list[bool]:
    """Every call of the app's draw from now on, paused or not (its ``force`` flag): the
    redraw timer's ticks, as events a test can wait for."""
    calls: list[bool] = []
    real = app._draw

    def draw(*, force: bool = False) -> None:
        calls.append(force)
        real(force=force)

    monkeypatch.setattr(app, "_draw", draw)
    return calls


def _names(app: KvtopApp) -> list[str]:
    return [row["name"] for row in table_rows(app)]


async def test_rows_show_what_the_servers_serve(tmp_path: Path) -> None:
    app, _ = live_app(tmp_path)
    async with app.run_test(size=WIDE) as pilot:
        assert await live_data_shown(pilot)
        rows = _by_name(app)
        # two hosts on one machine are told apart by port
        assert set(rows) == {"10.0.0.5:8000", "10.0.0.5:8001", "gateway"}
        host = rows["10.0.0.5:8000"]
        # vllm-0.33.0 under load: 588 of 599 blocks, 30 running, 149 waiting
        assert host["status"] == "up"
        assert (host["kv"], host["running"], host["waiting"]) == ("████▉ 588/599", "30", "149")
        assert host["model"] == "twin-llama"
        # only one scrape: no rate yet, shown as a dash rather than 0
        assert host["gen"] == host["prompt"] == "–"
        gateway = rows["gateway"]
        assert gateway["model"] == "not an inference server?"
        assert gateway["status"] == "unknown"
        assert not any(v.startswith("0") for v in gateway.values())
        # an endpoint that is not an inference server is no host up
        assert "hosts 2/3 up" in str(app.query_one("#summary").render())


async def test_compact_layout_keeps_the_key_columns(tmp_path: Path) -> None:
    app, _ = live_app(tmp_path)
    async with app.run_test(size=(80, 24)) as pilot:
        assert await live_data_shown(pilot)
        # the verdict, the queue, and the hit rate and tokens/s beside them (narrowed)
        assert list(table_rows(app)[0]) == [
            "name", "status", "kv", "leak", "running", "waiting", "hit", "gen"
        ]
        assert app.has_class("compact")


async def test_selection_and_detail(tmp_path: Path) -> None:
    app, _ = live_app(tmp_path)
    async with app.run_test(size=WIDE) as pilot:
        assert await live_data_shown(pilot)
        await pilot.press("j", "enter")
        assert await until(pilot, lambda: isinstance(app.screen, DetailScreen))
        await eventually(lambda: app.screen.is_mounted, "the detail screen composed",
                         pause=pilot.pause)
        info = str(app.screen.query_one("#detail-info").render())
        assert "10.0.0.5:8001" in info
        assert "num_gpu_blocks 1000" in info
        await pilot.press("escape")
        assert await until(pilot, lambda: not isinstance(app.screen, DetailScreen))


async def test_a_draw_between_pushing_the_detail_and_its_compose_is_harmless(
        tmp_path: Path) -> None:
    """Pushing a screen is not synchronous: a redraw that fires before the detail screen is
    composed once raised NoMatches and ended a replay (a CI run under load). Now the draw
    leaves it alone, and the screen fills itself when it mounts."""
    app, _ = live_app(tmp_path)
    async with app.run_test(size=WIDE) as pilot:
        assert await live_data_shown(pilot)
        app.action_detail()  # pushes the screen; its compose comes later
        assert isinstance(app.screen, DetailScreen) and not app.screen.is_mounted
        app._draw(force=True)
        await eventually(lambda: "num_gpu_blocks" in str(
            app.screen.query_one("#detail-info").render()), "the detail filled on mount",
            pause=pilot.pause)
        assert app.return_code is None


async def test_the_detail_opened_while_paused_shows_its_engine(tmp_path: Path) -> None:
    """Paused, the app draws nothing: the detail screen fills itself when it mounts, so a
    frozen moment can still be looked into."""
    app, _ = live_app(tmp_path)
    async with app.run_test(size=WIDE) as pilot:
        assert await live_data_shown(pilot)
        await pilot.press("p", "j", "enter")
        await eventually(lambda: isinstance(app.screen, DetailScreen) and app.screen.is_mounted,
                         "the detail screen composed", pause=pilot.pause)
        assert "10.0.0.5:8001" in str(app.screen.query_one("#detail-info").render())


async def test_pause_freezes_display_while_collection_goes_on(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    app, source = live_app(tmp_path)
    async with app.run_test(size=WIDE) as pilot:
        assert await live_data_shown(pilot)
        before = table_rows(app)
        await pilot.press("p")
        assert "PAUSED" in str(app.query_one("#summary").render())
        draws = _draws(app, monkeypatch)
        source.push(Scrape(HOST_A, T0 + 1, fixture_text(LEAKING_IDLE)))
        await eventually(lambda: app.trackers[HOST_A.url].state.last_good_t == T0 + 1,
                         "the scrape collected while paused", pause=pilot.pause)
        folded = len(draws)
        await eventually(lambda: len(draws) > folded, "a redraw after it", pause=pilot.pause)
        assert table_rows(app) == before  # asked to draw, drew nothing
        await pilot.press("p")
        assert _by_name(app)["10.0.0.5:8000"]["kv"].endswith(LEAKING_IDLE_KV)  # caught up


async def test_host_down_while_others_keep_updating(tmp_path: Path) -> None:
    app, source = live_app(tmp_path, clock_at=T0 + 100)
    async with app.run_test(size=WIDE) as pilot:
        assert await live_data_shown(pilot)
        source.push(
            Scrape(HOST_B, T0 + 99, failure="down", error="connection refused"),
            Scrape(HOST_A, T0 + 99, fixture_text(LEAKING_IDLE)),
        )
        await eventually(lambda: _by_name(app)["10.0.0.5:8000"]["kv"].endswith(LEAKING_IDLE_KV)
                         and _by_name(app)["10.0.0.5:8001"]["status"] != "up",
                         "both scrapes drawn", pause=pilot.pause)
        rows = _by_name(app)
        assert rows["10.0.0.5:8001"]["status"] == "down 2m"  # age of the last good scrape
        assert rows["10.0.0.5:8001"]["model"] == "connection refused"


async def test_filter_and_sort(tmp_path: Path) -> None:
    app, _ = live_app(tmp_path)
    async with app.run_test(size=WIDE) as pilot:
        assert await live_data_shown(pilot)
        await pilot.press("slash", *"8001", "enter")
        assert _names(app) == ["10.0.0.5:8001"]
        await pilot.press("slash", "escape")
        assert len(table_rows(app)) == 3
        await pilot.press("o")  # by KV use, fullest first, unknown last
        assert _names(app) == ["10.0.0.5:8000", "10.0.0.5:8001", "gateway"]
        assert "sort KV use ▼" in str(app.query_one("#summary").render())
        await pilot.press("o")  # by queue
        assert _names(app)[0] == "10.0.0.5:8000"


async def test_a_message_takes_the_footer_s_line_never_a_pane_s(tmp_path: Path) -> None:
    from textual.widgets import Footer
    from textual.widgets._toast import Toast

    from kvtop.ui.widgets.message_line import MessageLine

    app, _ = live_app(tmp_path)
    async with app.run_test(size=(80, 24)) as pilot:
        assert await live_data_shown(pilot)
        panel_before = app.engine_panel.region
        await pilot.press("plus")
        line = app.query_one(MessageLine)
        assert await until(pilot, lambda: line.display and "polling every 2s" in str(
            line.render()))
        assert line.region.y == 23 and not app.query_one(Footer).display
        assert not app.screen.query(Toast)  # nothing drawn over the panes
        assert app.engine_panel.region == panel_before
        app.clear_notifications()  # expired: the key hints come back
        assert await until(pilot, lambda: app.query_one(Footer).display and not line.display)


async def test_interval_keys_reach_the_source(tmp_path: Path) -> None:
    app, source = live_app(tmp_path)
    async with app.run_test(size=WIDE) as pilot:
        await pilot.press("plus")
        assert source.interval_s == 2.0
        await pilot.press("minus", "minus")
        assert source.interval_s == 0.5


async def test_snapshot_writes_json_bodies_and_svg(tmp_path: Path) -> None:
    app, _ = live_app(tmp_path)
    async with app.run_test(size=WIDE) as pilot:
        assert await screen_shows(pilot, "588/599")
        await pilot.press("s")
        await eventually(lambda: any("Snapshot saved to" in n.message
                                     for n in app._notifications),
                         "the snapshot written (in a thread) and told", pause=pilot.pause)
    [folder] = tmp_path.glob("kvtop-snapshot-*")
    assert folder.name == "kvtop-snapshot-20260101T000002Z"
    document = json.loads((folder / f"{folder.name}.json").read_text())
    by_url = {t["target"]: t for t in document["targets"]}
    assert set(by_url) == {HOST_A.url, HOST_B.url, GATEWAY.url}
    assert by_url[HOST_A.url]["history"][0]["blocks_used"] == [588]
    assert document["gpus"][0]["processes"][0]["is_vllm"] is True
    assert (folder / "metrics" / "10.0.0.5_8000.txt").read_text() == fixture_text(UNDER_LOAD)
    assert (folder / "metrics" / "gateway.txt").exists()
    svg = (folder / "screen.svg").read_text()
    assert svg.startswith("<svg") and "588/599" in svg.replace("&#160;", " ")
    for path in folder.rglob("*"):
        if path.is_file():
            assert TOKEN not in path.read_text()
    assert not list(tmp_path.glob(".kvtop-snapshot-*"))  # no temp folder left behind


async def test_s_writes_under_the_state_directory_and_says_the_whole_path(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # a snapshot in the directory kvtop was started in showed up in a git checkout
    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path / "state"))
    monkeypatch.chdir(tmp_path)
    app, _ = live_app(tmp_path, snapshot_dir=None)
    async with app.run_test(size=(80, 24)) as pilot:
        assert await live_data_shown(pilot)
        await pilot.press("s")
        folder = tmp_path / "state/kvtop/snapshots/kvtop-snapshot-20260101T000002Z"
        await eventually(lambda: any(n.message == f"Snapshot saved to {folder}"
                                     for n in app._notifications),
                         "the snapshot's whole path told", pause=pilot.pause)
    assert (folder / "screen.svg").exists()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["state"]


async def test_snapshot_to_unwritable_folder_is_a_message(tmp_path: Path) -> None:
    blocker = tmp_path / "a-file"
    blocker.write_text("")
    app, _ = live_app(tmp_path, snapshot_dir=blocker / "snaps")
    async with app.run_test(size=WIDE) as pilot:
        assert await live_data_shown(pilot)
        await pilot.press("s")
        await eventually(lambda: any(n.message.startswith("Snapshot not written")
                                     for n in app._notifications),
                         "the failure told", pause=pilot.pause)
        assert app.is_running


async def test_gpu_pane_with_fake_nvml(tmp_path: Path) -> None:
    app, _ = live_app(tmp_path)
    async with app.run_test(size=WIDE) as pilot:
        text = await eventually(lambda: "74.0/80.0 GiB" in _gpu_text(app) and _gpu_text(app),
                                "the GPU read (in a thread) drawn", pause=pilot.pause)
        assert "4242" in text and "vLLM python3 -m vllm" in text
        await pilot.press("g")
        assert not app.query_one(GpuPane).display
        await pilot.press("g")
        assert app.query_one(GpuPane).display


async def test_no_nvml_is_one_short_line_in_the_header(tmp_path: Path,
                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    reader = FakeGpuReader(unavailable="NVML Shared Library Not Found")
    app, _ = live_app(tmp_path, gpu_reader=reader)
    async with app.run_test(size=WIDE) as pilot:
        await eventually(lambda: "GPU NVML: NVML Shared Library Not Found"
                         in str(app.query_one("#summary").render()),
                         "the NVML failure in the header", pause=pilot.pause)
        assert not app.query_one(GpuPane).display  # no pane to say there is nothing
        draws = _draws(app, monkeypatch)
        # a read every tick would have come within a GPU period; wait out two of them
        periods = 2 * GPU_MIN_PERIOD_S / app.draw_clock.period_s
        await eventually(lambda: len(draws) > periods, "two GPU periods of redraws",
                         pause=pilot.pause)
        assert reader.reads == 1  # said once, not retried every tick
        assert len(table_rows(app)) == 3


async def test_lost_terminal_exits(tmp_path: Path, monkeypatch) -> None:
    app, _ = live_app(tmp_path)
    async with app.run_test(size=WIDE):
        exits: list[bool] = []
        monkeypatch.setattr(app, "exit", lambda *a, **k: exits.append(True))
        monkeypatch.setattr("sys.stdin.isatty", lambda: False)
        app.watchdog.check()
        assert exits == [True]


async def test_a_server_discovered_later_gets_a_row(tmp_path: Path) -> None:
    app, source = live_app(tmp_path)
    async with app.run_test(size=WIDE) as pilot:
        assert await live_data_shown(pilot)
        late = Target.from_spec("10.0.0.9:8000")  # e.g. Prometheus found a new instance
        source.push(Scrape(late, T0 + 1, fixture_text(UNDER_LOAD)))
        assert await until(pilot, lambda: _by_name(app)["10.0.0.9:8000"]["status"] == "up")
        assert late.url in app.trackers


async def test_a_large_fleet_shows_the_worst_first_and_scrolls(tmp_path: Path) -> None:
    targets = [Target.from_spec(f"10.1.0.{i}:8000") for i in range(40)]
    scrapes = [Scrape(t, T0, fixture_text(LEAKING_IDLE if i != 37 else UNDER_LOAD))
               for i, t in enumerate(targets[:-1])]  # the last one never answers
    source = FakeSource(scrapes)
    app = KvtopApp(AppConfig(targets=targets, source_factory=lambda cfg: source, no_gpu=True,
                             clock=lambda: T0 + 2, snapshot_dir=tmp_path))
    async with app.run_test(size=(100, 20)) as pilot:
        assert await until(pilot, lambda: len(source.delivered) == len(scrapes))
        assert await until(pilot, lambda: _names(app)[0] == "10.1.0.37:8000")
        assert "sort worst first" in str(app.query_one("#summary").render())
        names = _names(app)
        assert names[0] == "10.1.0.37:8000"  # the fullest pool: 588/599 blocks beats 0 %
        assert names[-1] == "10.1.0.39:8000"  # pending: unknown, last
        await pilot.press("end")
        assert app.table.selected_row is not None
        assert app.table.selected_row.name == "10.1.0.39:8000"
        assert app.table.scroll_y > 0  # the cursor's row was scrolled into view
        await pilot.press("o")  # a chosen sort sticks: the cycle goes on to name
        assert _names(app) == sorted(names)
        assert app.table.selected_row.name == "10.1.0.39:8000"  # the cursor follows its row


async def test_a_scrape_or_gpu_read_landing_at_shutdown_paints_nothing(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # a slow machine once delivered a draw after the widgets were gone: KeyError/ScreenStackError
    app, _ = live_app(tmp_path)
    async with app.run_test(size=WIDE) as pilot:
        assert await live_data_shown(pilot)
    painted: list[str] = []
    for widget, method in ((app.table, "show"), (app.table, "show_gpu_column"),
                           (app.summary, "show"), (app.engine_panel, "show"),
                           (app.gpu_pane, "show")):
        real = getattr(widget, method)
        monkeypatch.setattr(widget, method, functools.partial(_record, painted, method, real))
    app._draw(force=True)
    app.gpu_watch.read_done([])
    app.gpu_watch.read_failed("NVML gone")
    assert painted == []  # nothing reached a widget taken off the screen
    assert app.gpu_watch.unavailable == "NVML gone"  # what was learned is kept


def _record(calls: list[str], name: str, real: Callable[..., object], *args: object,
            **kwargs: object) -> object:
    calls.append(name)
    return real(*args, **kwargs)


def _gpu_text(app: KvtopApp) -> str:
    return str(app.query_one(GpuPane).render())
