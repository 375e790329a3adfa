"""The real-server tier: kvtop against a served vLLM 0.33.0 twin (twin/README.md).

Skipped, with the reason, unless the twin venv can `import vllm` (scripts/install-twin.sh, or
KVTOP_TWIN_PYTHON); KVTOP_TWIN=0 turns it off. The servers this
session's tests need are started together on first use (start-up dominates the tier's time)
and stopped by process group once the tier's last test is done.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.twin.client import SUMMARY
from twin.serve import TwinServer, TwinSpec, import_vllm_error, twin_python, unavailable_reason

# One served twin per scenario; fixture `twin_<name>` hands out a ready one.
SPECS = {
    "healthy": TwinSpec(num_blocks=600, step_delay_s=0.02),  # load outlasts two snapshots
    "pressure": TwinSpec(num_blocks=120, step_delay_s=0.005, max_model_len=1024),
    "leaking": TwinSpec(num_blocks=1000, step_delay_s=0.0, leak_frac=0.15),
    # Two API server processes: vLLM's multiprocess metrics, which cannot filter by name.
    "api_servers": TwinSpec(num_blocks=300, step_delay_s=0.01, api_servers=2),
}
STARTED: list[TwinServer] = []  # for the terminal summary


class TwinFleet:
    """Twins launched in parallel; `ready(name)` waits for one."""

    def __init__(self, servers: dict[str, TwinServer]) -> None:
        self.servers = servers

    def ready(self, name: str) -> TwinServer:
        server = self.servers[name]
        server.wait_ready()
        return server

    def stop(self) -> None:
        for server in self.servers.values():
            server.stop()


@dataclass(frozen=True)
class TwinSetup:
    python: Path  # the twin venv's interpreter
    work: Path  # server logs
    model_dir: Path  # the fake model's config.json


@pytest.fixture(scope="session", autouse=True)
def twin_setup(tmp_path_factory: pytest.TempPathFactory) -> TwinSetup:
    """Skips the whole tier (checked once per session) unless the twin venv imports vllm."""
    python = twin_python()
    reason = unavailable_reason(python)
    if reason:
        pytest.skip(reason)
    work = tmp_path_factory.mktemp("twin")
    setup = TwinSetup(python, work, work / "twin_model")
    reason = import_vllm_error(python, setup.model_dir)
    if reason:
        pytest.skip(reason)
    return setup


@pytest.fixture(scope="session")
def twin_interpreter(twin_setup: TwinSetup) -> Path:
    """The twin venv's python, for tests that run their own twin subprocess."""
    return twin_setup.python


def needed_twins(session: pytest.Session) -> list[str]:
    """Scenario names whose `twin_<name>` fixture some selected test uses."""
    wanted = {name for item in session.items for name in getattr(item, "fixturenames", ())}
    return [name for name in SPECS if f"twin_{name}" in wanted]


@pytest.fixture(scope="package", autouse=True)
def twin_fleet(twin_setup: TwinSetup, request: pytest.FixtureRequest) -> Iterator[TwinFleet]:
    """Launches, at the tier's first test, every twin the session will need, so their start-up
    overlaps with each other and with tests that need none."""
    fleet = TwinFleet({})
    try:
        for name in needed_twins(request.session):
            server = TwinServer.launch(name, SPECS[name], twin_setup.python,
                                       twin_setup.model_dir, twin_setup.work)
            fleet.servers[name] = server
            STARTED.append(server)
        yield fleet
    finally:
        fleet.stop()


@pytest.fixture(scope="package")
def twin_healthy(twin_fleet: TwinFleet) -> TwinServer:
    return twin_fleet.ready("healthy")


@pytest.fixture(scope="package")
def twin_pressure(twin_fleet: TwinFleet) -> TwinServer:
    return twin_fleet.ready("pressure")


@pytest.fixture(scope="package")
def twin_leaking(twin_fleet: TwinFleet) -> TwinServer:
    return twin_fleet.ready("leaking")


@pytest.fixture(scope="package")
def twin_api_servers(twin_fleet: TwinFleet) -> TwinServer:
    return twin_fleet.ready("api_servers")


def summary_lines() -> list[str]:
    lines = []
    if STARTED:
        times = ", ".join(f"{s.name} {s.ready_after_s:.0f} s" if s.ready_after_s else
                          f"{s.name} not ready" for s in STARTED)
        lines.append(f"twin servers (started together) healthy after: {times}")
    return lines + [f"twin {line}" for line in SUMMARY]


def pytest_sessionfinish(session: pytest.Session) -> None:
    workeroutput = getattr(session.config, "workeroutput", None)
    if workeroutput is not None:  # an xdist worker: tests/conftest.py prints it
        workeroutput["summary"] = summary_lines()


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter) -> None:
    for line in summary_lines():  # run without xdist workers
        terminalreporter.write_line(line)
