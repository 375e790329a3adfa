"""The GPU side of the app: the GPU pane names each process's server, the table's GPU
column, the engine pane's GPU memory line under the KV line, exporters' GPUs and their
failures. Local ownership is real (a listening socket in this process, a child process,
/proc); NVML is the fake; exporter bodies are real (tests/fixtures/gpu)."""

from __future__ import annotations

import json
import socket
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from kvtop.collect.nvml import NvmlReader
from kvtop.collect.target import Scrape, Target
from kvtop.ui.app import AppConfig, KvtopApp
from kvtop.ui.widgets.engine_panel import EnginePanel
from kvtop.ui.widgets.gpu_pane import GpuPane
from tests.fakes.fake_nvml import GIB, FakeDevice, FakeGpuReader, FakePynvml
from tests.fakes.fake_source import FakeSource
from tests.scenarios.app import T0, UNDER_LOAD, table_rows, until
from tests.scenarios.gpu import DCGM_MIG, gpu_fixture
from tests.support.paths import fixture_text

WIDE = (200, 40)
EVIL_HOST = "evil\x1b]52;c;aGk=\x07"


@pytest.fixture
def listener() -> Iterator[tuple[int, int]]:
    """(port, pid of a child process): the "API server" listening, and its "EngineCore"."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        sock.listen()
        child = subprocess.Popen(["sleep", "60"])
        try:
            yield sock.getsockname()[1], child.pid
        finally:
            child.kill()
            child.wait()


def _summary(app: KvtopApp) -> str:
    return str(app.query_one("#summary").render())


def _pane(app: KvtopApp) -> str:
    return str(app.query_one(GpuPane).render())


def _panel(app: KvtopApp) -> str:
    """The selected engine's lines: over the charts, or the sparklines on a small screen."""
    if app.charts_shown:
        return str(app.panes.head.render())
    return str(app.query_one(EnginePanel).render())


async def test_local_gpu_is_named_after_its_server(tmp_path: Path,
                                                   listener: tuple[int, int]) -> None:
    port, child = listener
    target = Target.from_spec(f"127.0.0.1:{port}")
    nvml = FakePynvml([FakeDevice(compute=[(child, 69 * GIB)]),
                       FakeDevice(uuid="GPU-1", used=0, compute=[])])
    source = FakeSource([Scrape(target, T0, fixture_text(UNDER_LOAD))])
    app = KvtopApp(AppConfig(targets=[target], source_factory=lambda _: source,
                             gpu_reader=NvmlReader(nvml), clock=lambda: T0 + 2,
                             snapshot_dir=tmp_path))
    name = f"127.0.0.1:{port}"
    async with app.run_test(size=WIDE) as pilot:
        # the GPU pane: the process line carries the server's row name
        assert await until(pilot, lambda: f"{child}  69.0G {name} " in _pane(app)), _pane(app)
        # the table: the server's GPU memory, as nvidia-smi sees it (70 of 80 GiB)
        assert await until(pilot, lambda: table_rows(app)[0].get("gpu") == "70/80G")
        # the engine pane: what the server's GPUs use beside its KV pool
        assert await until(pilot, lambda: "GPU 70.0/80.0 GiB  what nvidia-smi sees"
                           in _panel(app)), _panel(app)
        await pilot.resize_terminal(80, 24)  # sparklines: GPU memory under the KV line
        assert await until(pilot, lambda: not app.charts_shown
                           and "70.0/80.0 GiB  what nvidia-smi sees" in _panel(app))
        labels = [line.split()[0] for line in _panel(app).splitlines() if line[:1] != " "]
        assert labels[labels.index("KV") + 1] == "GPU", _panel(app)
        await pilot.resize_terminal(*WIDE)
        await pilot.press("s")  # the snapshot file says the same
        assert await until(pilot, lambda: list(tmp_path.glob("kvtop-snapshot-*/*.json")))
    [path] = tmp_path.glob("kvtop-snapshot-*/*.json")
    document = json.loads(path.read_text())
    first, idle = document["gpus"]
    owner = {"target": target.url, "label": name, "by": "process"}
    assert first["owners"] == [owner] and idle["owners"] == []
    assert first["processes"][0] == {"pid": child, "name": first["processes"][0]["name"],
                                     "used_gpu_memory_bytes": 69 * GIB, "is_vllm": False,
                                     "owner": owner}
    assert document["gpu_sources"] == [{"source": "nvml", "target": None,
                                        "host": first["host"], "status": "ok",
                                        "error": None, "gpus": 2}]


async def test_nobody_s_gpu_gets_no_column(tmp_path: Path) -> None:
    target = Target.from_spec("10.0.0.5:8000")
    source = FakeSource([Scrape(target, T0, fixture_text(UNDER_LOAD))])
    app = KvtopApp(AppConfig(targets=[target], source_factory=lambda _: source,
                             gpu_reader=FakeGpuReader(), clock=lambda: T0 + 2,
                             snapshot_dir=tmp_path))
    async with app.run_test(size=WIDE) as pilot:
        assert await until(pilot, lambda: "4242" in _pane(app))  # pid 4242 isn't here
        assert await until(pilot, lambda: table_rows(app)[0]["status"] == "up")
        assert "gpu" not in table_rows(app)[0]
        assert "GPU no GPU found for this server" in _panel(app)


async def test_exporter_gpus_their_owners_and_failures(tmp_path: Path) -> None:
    server = Target.from_spec("10.0.0.5:8000", name="llama")
    exporter = Target.from_spec("10.0.0.5:9400")
    body = gpu_fixture(DCGM_MIG).replace('Hostname="ub20-a100-k8s"', f'Hostname="{EVIL_HOST}"')
    source = FakeSource([Scrape(server, T0, fixture_text(UNDER_LOAD)),
                         Scrape(exporter, T0, body)])
    app = KvtopApp(AppConfig(targets=[server, exporter], source_factory=lambda _: source,
                             gpu_reader=FakeGpuReader(unavailable="NVML Shared Library Not "
                                                      "Found"),
                             clock=lambda: T0 + 2, snapshot_dir=tmp_path))
    async with app.run_test(size=WIDE) as pilot:
        assert await until(pilot, lambda: "MIG 13 1g.5gb" in _pane(app)), _pane(app)
        pane = _pane(app)
        assert "NVML" not in pane  # the header says it, in a word: the exporter has GPUs
        assert await until(pilot, lambda: "GPU no NVML" in _summary(app)), _summary(app)
        assert "serves llama (same host)" in pane
        # the exporter's Hostname label is outside text: escapes are shown, never sent
        assert "evil\\x1b]52;c;aGk=\\x07 GPU0 GPU" in pane and "\x1b" not in pane
        rows = {row["name"]: row for row in table_rows(app)}
        assert rows["llama"]["gpu"] == "5/40G"  # 4845 of 40535 MiB; the MIG slice not twice
        (exporter_row,) = [r for r in app.table.rows if r.url == exporter.url]
        assert exporter_row.cells["model"].text == "dcgm: 2 GPUs"
        source.push(Scrape(exporter, T0 + 1, failure="down", error="connection refused"))
        assert await until(pilot, lambda: "dcgm-exporter 10.0.0.5: connection refused"
                           in _pane(app)), _pane(app)
        assert await until(pilot, lambda: "1 exporter failing" in _summary(app))
        assert "MIG 13" in _pane(app)  # stale: its last values stay, with the reason above
