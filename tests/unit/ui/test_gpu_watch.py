"""The app's GPUs in a small app (Pilot): NVML read in a worker thread and re-armed after
each read (never faster than every 2 s), each GPU process owned by the server listening on
its port (a real socket, read back through /proc), refreshed at once for a new server and
at most every 2 s for an exporter's numbers, and what the header, ``g`` and the snapshot
say when NVML is absent, broken or turned off."""

from __future__ import annotations

import os
import threading
from collections.abc import Callable
from typing import Any

import pytest
from textual.app import App
from textual.timer import Timer
from textual.worker import Worker, WorkerState

from kvtop.collect.gpu import GpuReading
from kvtop.collect.nvml import GpuProcess
from kvtop.collect.target import Target
from kvtop.derive.gpu_owners import GpuSource, Owner, local_host
from kvtop.derive.tracker import TargetState
from kvtop.ui import gpu_watch
from kvtop.ui.gpu_watch import GPU_MIN_PERIOD_S, GpuWatch
from tests.fakes.fake_nvml import FakeGpuReader

GIB = 2**30
NOW = 1_767_225_600.0
EXPORTER = Target.from_spec("10.0.0.7:9400")


def gpu(index: int = 0, used: int = 70 * GIB, pid: int | None = None) -> GpuReading:
    processes = () if pid is None else (GpuProcess(pid, "python3 -m vllm", used, True),)
    return GpuReading(index, "NVIDIA H100 80GB HBM3", f"GPU-{index}", used, 80 * GIB,
                      90.0, 60.0, 500.0, processes=processes)


class Watched:
    """A GpuWatch with what it called back, the servers it sees and its clock."""

    def __init__(self, app: App[Any], reader: Any, *, period_s: float = 1.0,
                 on_screen: bool = True) -> None:
        self.states: list[TargetState] = []
        self.refreshes: list[bool] = []
        self.t = NOW
        self.on_screen = on_screen
        self.watch = GpuWatch(app, reader, history_s=60.0, clock=lambda: self.t,
                              states=lambda: self.states, period_s=lambda: period_s,
                              on_screen=lambda: self.on_screen,
                              on_refresh=self.refreshes.append)


@pytest.fixture
def monotonic(monkeypatch: pytest.MonkeyPatch) -> Callable[[float], None]:
    """Set the watch's monotonic clock (the app's own is left alone)."""
    now = [1000.0]

    class Clock:
        @staticmethod
        def monotonic() -> float:
            return now[0]

    monkeypatch.setattr(gpu_watch, "time", Clock)
    return lambda t: now.__setitem__(0, t)


async def read_once(w: Watched, app: App[Any]) -> tuple[Worker[None], list[tuple[float, Any]]]:
    """Start the watch in ``app`` and wait for its one read to land: its worker, and the
    timers it set (each held off for an hour: the next read is not wanted here)."""
    timers: list[tuple[float, Any]] = []
    real = app.set_timer

    def set_timer(delay: float, callback: Any, **kwargs: Any) -> Timer:
        timers.append((delay, callback))
        return real(3600, callback)

    app.set_timer = set_timer  # type: ignore[method-assign,assignment]
    w.watch.start()
    [worker] = app.workers
    await app.workers.wait_for_complete()
    return worker, timers


async def test_a_read_in_a_thread_owns_the_gpu_by_port_and_rearms(listening_port: int) -> None:
    app: App[None] = App()
    async with app.run_test() as pilot:
        reader = FakeGpuReader([gpu(0, pid=os.getpid()), gpu(1, used=0)])
        w = Watched(app, reader, period_s=1.0)
        server = Target.from_spec(f"127.0.0.1:{listening_port}")
        w.states = [TargetState(server, "up", kind="vllm")]
        worker, timers = await read_once(w, app)
        assert (worker.name, worker.group, worker.exit_on_error, worker._thread_worker,
                worker.state) == ("read_gpus", "gpu", False, True, WorkerState.SUCCESS)
        await pilot.pause()
        await pilot.pause()
        assert reader.reads == 1
        owner = Owner(server.url, f"127.0.0.1:{listening_port}", "process")
        assert [(v.gpu.index, v.owners) for v in w.watch.views] == [(0, (owner,)), (1, ())]
        assert w.watch.views[0].process_owners == {os.getpid(): owner}
        assert w.watch.owned == {server.url: (70 * GIB, 80 * GIB)}
        assert list(w.watch.history.series(server.url)) == [(NOW, 70 * GIB, 80 * GIB)]
        assert list(w.watch.trails.of(gpu(1, used=0))) == [(NOW, 0)]
        assert w.refreshes == [True]  # a new owner: the rows say something new
        assert [(delay, callback.__name__) for delay, callback in timers] == [
            (GPU_MIN_PERIOD_S, "read")]  # never faster than every 2 s
        assert w.watch.note() is None
        assert w.watch.why_no_pane(demo=False) is None
        assert w.watch.sources(w.states) == [
            GpuSource("nvml", None, local_host(), "ok", None, 2)]


@pytest.mark.parametrize(("period_s", "delay"), [(1.999, 2.0), (2.0, 2.0), (2.001, 2.001)])
async def test_the_next_read_comes_after_the_poll_period_never_under_2_s(
        period_s: float, delay: float) -> None:
    app: App[None] = App()
    async with app.run_test() as pilot:
        w = Watched(app, FakeGpuReader([gpu()]), period_s=period_s)
        _, timers = await read_once(w, app)
        await pilot.pause()
        await pilot.pause()
        assert [d for d, _ in timers] == [delay]
        assert w.refreshes == [False]  # a GPU nobody owns: nothing new in the rows


async def test_absent_nvml_is_said_once_in_the_header_and_not_retried() -> None:
    app: App[None] = App()
    async with app.run_test() as pilot:
        reader = FakeGpuReader(unavailable="NVML Shared Library Not Found")
        w = Watched(app, reader)
        _, timers = await read_once(w, app)
        await pilot.pause()
        await pilot.pause()
        assert (reader.reads, timers) == (1, [])
        assert w.refreshes == [True]  # the header's note drawn now
        assert w.watch.unavailable == "NVML Shared Library Not Found"
        assert w.watch.note() == ("no NVML", "NVML: NVML Shared Library Not Found")
        assert w.watch.sources([]) == [GpuSource("nvml", None, local_host(), "unavailable",
                                                 "NVML Shared Library Not Found", 0)]
        assert w.watch.why_no_pane(demo=False) == (
            "no GPU pane: no local GPU (NVML Shared Library Not Found); add a GPU exporter "
            "(dcgm-exporter, nvidia_gpu_exporter) as a target")


class BrokenReader:
    def read(self) -> list[GpuReading]:
        raise ValueError("driver went away")


async def test_a_broken_driver_is_a_failed_source_never_a_crash() -> None:
    app: App[None] = App()
    async with app.run_test() as pilot:
        w = Watched(app, BrokenReader())
        _, timers = await read_once(w, app)
        await pilot.pause()
        await pilot.pause()
        assert timers == []
        assert w.watch.unavailable == "ValueError: driver went away"
        assert w.watch.sources([]) == [GpuSource("nvml", None, local_host(), "failed",
                                                 "ValueError: driver went away", 0)]
        assert app.is_running


async def test_proc_surprises_cost_the_owner_column_not_the_gpus(
        listening_port: int, monkeypatch: pytest.MonkeyPatch) -> None:
    def unreadable(*args: object) -> dict[int, str]:
        raise PermissionError("/proc/1/fd")

    app: App[None] = App()
    async with app.run_test() as pilot:
        w = Watched(app, FakeGpuReader([gpu(0, pid=os.getpid())]))
        w.states = [TargetState(Target.from_spec(f"127.0.0.1:{listening_port}"), "up")]
        monkeypatch.setattr(w.watch._port_owners, "owners", unreadable)
        await read_once(w, app)
        await pilot.pause()
        await pilot.pause()
        assert [(v.gpu.index, v.owners) for v in w.watch.views] == [(0, ())]
        assert w.watch.owned == {}


async def test_no_gpu_reads_nothing_and_says_nothing_in_the_header() -> None:
    app: App[None] = App()
    async with app.run_test():
        w = Watched(app, None)
        w.watch.start()
        assert list(app.workers) == []
        assert w.watch.note() is None
        assert w.watch.sources([]) == []
        assert w.watch.why_no_pane(demo=False) == (
            "no GPU pane: --no-gpu (a GPU exporter as a target still shows its GPUs)")


class BlockedReader:
    """Holds its read until let go: a driver call that hangs."""

    def __init__(self) -> None:
        self.go = threading.Event()

    def read(self) -> list[GpuReading]:
        self.go.wait(5)
        return []


async def test_a_new_read_replaces_one_still_hanging() -> None:
    app: App[None] = App()
    async with app.run_test() as pilot:
        reader = BlockedReader()
        w = Watched(app, reader)
        w.watch.start()
        [hanging] = app.workers
        w.watch.read()
        [fresh] = [worker for worker in app.workers if worker is not hanging]
        assert (hanging.is_cancelled, fresh.is_cancelled) == (True, False)  # never piled up
        reader.go.set()
        await fresh.wait()
        await pilot.pause()


async def test_gpus_read_then_lost_say_no_nvml_without_the_reason() -> None:
    app: App[None] = App()
    async with app.run_test() as pilot:
        w = Watched(app, FakeGpuReader([gpu()]))
        await read_once(w, app)
        await pilot.pause()
        await pilot.pause()
        w.watch.read_failed("NVML gone")
        assert w.watch.note() == ("no NVML", "no NVML")  # the pane still shows its GPUs


def test_no_gpu_says_nothing_of_failing_exporters_in_the_header() -> None:
    w = Watched(App(), None)
    w.states = [TargetState(EXPORTER, "down", kind="dcgm", error="connection refused")]
    w.watch.refresh()
    assert len(w.watch.failed_sources) == 1  # the pane lists it
    assert w.watch.note() is None


def test_why_no_pane_before_the_first_read_and_in_the_demo() -> None:
    w = Watched(App(), FakeGpuReader())
    assert w.watch.why_no_pane(demo=False) == "no GPU pane: no GPU read yet"
    assert w.watch.why_no_pane(demo=True) == (
        "no GPU pane: the demo's servers are simulated and own no GPU")
    assert Watched(App(), None).watch.why_no_pane(demo=True) == (
        "no GPU pane: the demo's servers are simulated and own no GPU")


def test_the_reason_in_why_no_pane_is_80_cells_and_never_markup() -> None:
    w = Watched(App(), FakeGpuReader())
    w.watch.read_failed("[b]x[/b]\x1b[2J" + "y" * 80)
    text = w.watch.why_no_pane(demo=False)
    assert text is not None
    reason = text.removeprefix("no GPU pane: no local GPU (").split(")")[0]
    assert "\x1b" not in reason and reason.startswith("[b]x[/b]")
    assert len(reason) == 80


def test_a_failing_exporter_is_counted_and_listed_after_nvml() -> None:
    w = Watched(App(), FakeGpuReader())
    w.states = [TargetState(EXPORTER, "down", kind="dcgm", error="connection refused")]
    w.watch.refresh()
    failed = GpuSource("dcgm", EXPORTER.url, "10.0.0.7", "failed", "connection refused", 0)
    assert w.watch.failed_sources == [failed]
    assert w.watch.why_no_pane(demo=False) is None  # the pane says what failed
    assert w.watch.note() == ("1 exporter failing", "1 exporter failing")
    assert w.watch.sources(w.states) == [GpuSource("nvml", None, local_host(), "ok", None, 0),
                                         failed]
    assert w.refreshes == [False]


def test_off_screen_a_refresh_remembers_nothing_and_draws_nothing() -> None:
    w = Watched(App(), FakeGpuReader(), on_screen=False)
    w.watch.gpus = [gpu()]
    w.watch.refresh(news=True)
    assert (w.watch.views, w.watch.owned, w.refreshes, len(w.watch.trails)) == ([], {}, [], 0)


def test_a_new_server_refreshes_at_once_an_exporter_at_most_every_2_s(
        monotonic: Callable[[float], None]) -> None:
    w = Watched(App(), FakeGpuReader())
    w.watch.refresh_if_due()  # the first frame: owners at once
    assert len(w.refreshes) == 1
    w.watch.refresh_if_due()
    w.watch.scraped(False, "vllm")  # a server's numbers: not the GPUs'
    w.watch.refresh_if_due()
    monotonic(1000.0 + GPU_MIN_PERIOD_S)
    w.watch.refresh_if_due()
    assert len(w.refreshes) == 1
    w.watch.scraped(True, "vllm")  # a new server: at once
    w.watch.refresh_if_due()
    assert len(w.refreshes) == 2
    w.watch.scraped(False, "nvidia_gpu_exporter")
    monotonic(1000.0 + 2 * GPU_MIN_PERIOD_S - 0.001)  # a hair before 2 s
    w.watch.refresh_if_due()
    assert len(w.refreshes) == 2
    monotonic(1000.0 + 2 * GPU_MIN_PERIOD_S)  # exactly 2 s
    w.watch.refresh_if_due()
    assert len(w.refreshes) == 3
    w.watch.scraped(False, "dcgm")
    monotonic(1000.0 + 3 * GPU_MIN_PERIOD_S)
    w.watch.refresh_if_due()
    w.watch.refresh_if_due()
    assert len(w.refreshes) == 4


async def test_each_refresh_remembers_its_time_and_says_when_owners_change(
        listening_port: int) -> None:
    app: App[None] = App()
    async with app.run_test() as pilot:
        server = Target.from_spec(f"127.0.0.1:{listening_port}")
        w = Watched(app, FakeGpuReader([gpu(0, pid=os.getpid())]))
        w.states = [TargetState(server, "up", kind="vllm")]
        await read_once(w, app)
        await pilot.pause()
        await pilot.pause()
        w.t = NOW + 5
        w.watch.refresh()  # the same owners: nothing new to draw
        w.t = NOW + 6
        w.watch.refresh(news=True)  # the header's note changed
        w.t = NOW + 7
        w.watch.read_done([gpu(0, pid=os.getpid())], None)  # its process is gone: no owner
        assert w.refreshes == [True, False, True, True]
        assert w.watch.owned == {}
        assert list(w.watch.history.series(server.url)) == [
            (t, 70 * GIB, 80 * GIB) for t in (NOW, NOW + 5, NOW + 6)]
        assert list(w.watch.trails.of(gpu())) == [
            (t, 70 * GIB) for t in (NOW, NOW + 5, NOW + 6, NOW + 7)]
