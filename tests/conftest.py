"""Shared pytest fixtures and hooks. Each fixture group lives in its own module; this file
only exposes them, and makes a skipped tier fail a CI run."""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import socket
import ssl
import subprocess
import uuid
from collections.abc import AsyncIterator, Generator, Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.fakes.faultserver import FaultServer
from tests.scenarios.baseline_runs import Recordings
from tests.support.full_disk import small_tmpfs
from tests.support.mutation_run import MUTATION, cold_caches, fastest_first
from tests.support.tmux import Tmux, processes_with

TESTS = Path(__file__).resolve().parent
# The tiers that need something outside Python: a user without it gets a skip that says
# why; CI installs each (.ci/run), so there a skip means the tier silently did not run.
# The tmux tier is tests/ui/tmux and every other test_tmux*.py module (the hostile ones).
CI_FOLDERS = {"prometheus": TESTS / "prometheus", "twin": TESTS / "twin",
              "tmux": TESTS / "ui" / "tmux"}
# Every tier's folder, and the marker its tests get (pyproject.toml registers them)
TIER_FOLDERS = {**CI_FOLDERS, "pilot": TESTS / "ui" / "pilot",
                "snapshots": TESTS / "ui" / "snapshots", "hostile": TESTS / "hostile"}
XDIST_GROUPS = ("prometheus", "twin")  # tiers whose servers start once, on one worker
# The one deliberate way to leave a tier out, honoured in CI too (.ci/run skips the install).
OPTED_OUT = {"twin": ("KVTOP_TWIN", "0")}


if MUTATION:
    @pytest.fixture(autouse=True)
    def _cold_caches() -> None:
        """Under scripts/mutation.py: each test reaches the code behind kvtop's caches."""
        cold_caches()


@pytest.fixture
def listening_port() -> Iterator[int]:
    """A port this test process listens on: the GPU processes it owns are this "server's"."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        sock.listen()
        yield sock.getsockname()[1]


@pytest.fixture
async def fault_server() -> AsyncIterator[FaultServer]:
    """A started FaultServer (mode "ok", the vLLM 0.33.0 under-load fixture, version 0.33.0)."""
    async with FaultServer() as server:
        yield server


@pytest.fixture
def precious_paths(tmp_path: Path) -> tuple[Path, Path, Path]:
    """(existing, link, victim): a file, and a symbolic link to another file, both holding
    "precious\n": paths `kvtop record` must neither overwrite nor follow."""
    existing = tmp_path / "old.jsonl"
    existing.write_text("precious\n")
    victim = tmp_path / "victim"
    victim.write_text("precious\n")
    link = tmp_path / "link.jsonl.gz"
    link.symlink_to(victim)
    return existing, link, victim


@pytest.fixture
def data_home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """Where kvtop keeps baselines, under the test's own XDG_DATA_HOME (not made yet)."""
    monkeypatch.setenv("XDG_DATA_HOME", str(tmp_path / "data"))
    return tmp_path / "data" / "kvtop" / "baselines"


@pytest.fixture
def small_disk(tmp_path: Path) -> Iterator[Path]:
    """A real 512 KiB filesystem to fill (root only: others skip)."""
    with small_tmpfs(tmp_path / "disk") as folder:
        yield folder


@pytest.fixture
def tmux(tmp_path: Path) -> Iterator[Tmux]:
    """A tmux server of the test's own; every process the test started is killed after."""
    server = Tmux(f"kvtop-test-{uuid.uuid4().hex[:12]}")
    try:
        yield server
    finally:
        server("kill-server")
        for pid in processes_with(str(tmp_path)):
            with contextlib.suppress(ProcessLookupError):  # gone since it was listed
                os.kill(pid, signal.SIGKILL)


@pytest.fixture(scope="session")
def recordings(tmp_path_factory: pytest.TempPathFactory) -> Recordings:
    """The baseline scenarios' recordings (tests/scenarios/baseline_runs.py), made once."""
    return Recordings(tmp_path_factory.mktemp("baseline-runs"))


def _server_tls(folder: Path, subject: str, *extensions: str) -> tuple[ssl.SSLContext, Path]:
    """A server-side TLS context with a fresh self-signed certificate (openssl), and the
    certificate's PEM."""
    if shutil.which("openssl") is None:
        pytest.skip("openssl not installed")
    key, cert = folder / "key.pem", folder / "cert.pem"
    added = [arg for extension in extensions for arg in ("-addext", extension)]
    subprocess.run(
        ["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1",
         "-subj", subject, *added, "-keyout", str(key), "-out", str(cert)],
        check=True, capture_output=True,
    )  # fmt: skip
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    context.load_cert_chain(cert, key)
    return context, cert


@pytest.fixture(scope="session")
def self_signed(tmp_path_factory: pytest.TempPathFactory) -> ssl.SSLContext:
    """A server-side TLS context with a fresh self-signed certificate for 127.0.0.1."""
    return _server_tls(tmp_path_factory.mktemp("tls"), "/CN=127.0.0.1")[0]


@pytest.fixture(scope="session")
def private_ca(tmp_path_factory: pytest.TempPathFactory) -> tuple[ssl.SSLContext, Path]:
    """A server-side TLS context for 127.0.0.1 whose certificate is its own CA (a private
    CA, as behind a company gateway), and the path of that CA's PEM for --cacert."""
    return _server_tls(tmp_path_factory.mktemp("private-ca"), "/CN=kvtop test CA",
                       "subjectAltName=IP:127.0.0.1", "basicConstraints=critical,CA:TRUE")


@pytest.hookimpl(tryfirst=True)  # before xdist reads the groups
def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Each test gets its tier's marker (`-m "not twin"`); each server tier is one xdist group:
    its servers start once, on one worker, and the largest group (the twin tier) is handed
    out first, to run beside everything else."""
    for item in items:
        path = Path(str(item.path)).resolve()
        for tier, folder in TIER_FOLDERS.items():
            if folder in path.parents:
                item.add_marker(tier)
        if path.name.startswith("test_tmux"):
            item.add_marker("tmux")
        tier = next((name for name in XDIST_GROUPS if CI_FOLDERS[name] in path.parents), None)
        if tier:
            item.add_marker(pytest.mark.xdist_group(tier))
    if MUTATION:
        fastest_first(items)


WORKER_SUMMARIES: list[str] = []  # lines a tier's conftest left for the end of the run


@pytest.hookimpl(optionalhook=True)  # an xdist hook: called on the controller
def pytest_testnodedown(node: Any, error: object) -> None:
    WORKER_SUMMARIES.extend(getattr(node, "workeroutput", {}).get("summary", []))


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter) -> None:
    for line in WORKER_SUMMARIES:
        terminalreporter.write_line(line)


def in_ci() -> bool:
    """CI=true, as CI services (and .ci/run) set it."""
    return os.environ.get("CI", "").strip().lower() in ("true", "1")


def ci_tier(path: Path) -> str | None:
    """The CI tier a test file belongs to, unless it was deliberately left out."""
    tier = "tmux" if path.name.startswith("test_tmux") else next(
        (name for name, folder in CI_FOLDERS.items() if folder in path.parents), None)
    variable, value = OPTED_OUT.get(tier or "", ("", None))
    return None if variable and os.environ.get(variable) == value else tier


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]
                              ) -> Generator[None, pytest.TestReport, None]:
    """Under CI=true, a skip in a CI tier is a failure that says which tier and why."""
    outcome = yield
    report: pytest.TestReport = outcome.get_result()  # type: ignore[attr-defined]
    if not report.skipped or hasattr(report, "wasxfail") or not in_ci():
        return
    tier = ci_tier(Path(str(item.path)).resolve())
    if tier is None:
        return
    longrepr = report.longrepr
    reason = longrepr[2] if isinstance(longrepr, tuple) else str(longrepr)
    report.outcome = "failed"
    report.longrepr = (f"CI=true: the {tier} tier must run in CI, but it was skipped "
                       f"({reason}); install what it needs (.ci/run does), or run without "
                       f"CI=true")
