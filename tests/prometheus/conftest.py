"""A real Prometheus (Debian's package) scraping simulated vLLM servers every second, with
kvtop's rules loaded; shared by the whole tier and torn down after it."""

from __future__ import annotations

import json
import shutil
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest

from kvtop.config import Config, leak_params
from kvtop.report.rules import render_rules
from tests.fakes.faultserver import refused_port

# Short idle confirmation (the defaults are tested on constructed series in test_leak.py);
# a backfill step of one scrape, so the idle runs survive the backfill. The rules see only
# fractions of the pool, so an idle vLLM 0.8 with 600 blocks holds 1/600 for its null block:
# above the default 0.1 %, the threshold is raised as docs/prometheus.md says to for pools
# under 1 000 blocks.
FAST_THRESHOLDS = {"idle_min_s": 4, "idle_leak_s": 12, "residual_min_frac": 0.002}
CONFIG_TOML = ("[thresholds]\nidle_min_s = 4\nidle_leak_s = 12\nresidual_min_frac = 0.002\n"
               "[prometheus]\nselector = '{job=\"vllm\"}'\nbackfill_step = 1\n")
READY_S = 90.0  # a deadline for "never": a loaded machine starts Prometheus slowly
JOB = "vllm"


@dataclass(frozen=True)
class PromEnv:
    url: str  # Prometheus
    leaky: str  # /metrics URLs
    healthy: list[str]
    paused: str
    old: str  # an idle vLLM 0.8 without /version
    down: str
    config: Path  # kvtop config: fast thresholds, selector, backfill step
    started: float

    @staticmethod
    def instance(url: str) -> str:
        return url.removeprefix("http://").removesuffix("/metrics")


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _prometheus_yml(targets: list[str], rules: Path) -> str:
    listed = ", ".join(f'"{t}"' for t in targets)
    return (f"global:\n  scrape_interval: 1s\n  scrape_timeout: 1s\n  evaluation_interval: 1s\n"
            f"rule_files: [\"{rules}\"]\n"
            f"scrape_configs:\n  - job_name: {JOB}\n    static_configs:\n"
            f"      - targets: [{listed}]\n")


def start_prometheus(binary: str, tmp: Path) -> tuple[subprocess.Popen[bytes], str]:
    """Prometheus on a free port with tmp/prometheus.yml, its TSDB and log in tmp; its URL."""
    port = _free_port()
    proc = subprocess.Popen(
        [binary, f"--config.file={tmp / 'prometheus.yml'}",
         f"--storage.tsdb.path={tmp / 'data'}", f"--web.listen-address=127.0.0.1:{port}"],
        stdout=subprocess.DEVNULL, stderr=(tmp / "prometheus.log").open("wb"))
    return proc, f"http://127.0.0.1:{port}"


def stop(*procs: subprocess.Popen[bytes] | None) -> None:
    """Terminate each process started, killing one that outlives 10 s."""
    for proc in procs:
        if proc is not None:
            proc.terminate()
            try:
                proc.wait(10)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()


def _wait_ready(url: str, instances: list[str], proc: subprocess.Popen[bytes]) -> None:
    """Until every given instance has been scraped up (bounded)."""
    deadline = time.monotonic() + READY_S
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"prometheus exited with {proc.returncode}")
        try:
            targets = httpx.get(f"{url}/api/v1/targets", timeout=2).json()["data"]
            up = {t["labels"]["instance"] for t in targets["activeTargets"]
                  if t["health"] == "up"}
            if set(instances) <= up:
                return
        except (httpx.HTTPError, KeyError, ValueError):
            pass
        time.sleep(0.3)
    raise RuntimeError(f"Prometheus did not scrape {instances} within {READY_S:g} s")


@pytest.fixture(scope="session")
def prom(tmp_path_factory: pytest.TempPathFactory) -> Iterator[PromEnv]:
    binary = shutil.which("prometheus")
    if binary is None:
        pytest.skip("Prometheus tier skipped: no 'prometheus' binary on PATH "
                    "(apt-get install prometheus; .ci/run does)")
    tmp = tmp_path_factory.mktemp("prometheus")
    config = tmp / "kvtop.toml"
    config.write_text(CONFIG_TOML)
    rules = tmp / "kvtop-rules.yml"
    rules.write_text(render_rules(leak_params(Config(thresholds=FAST_THRESHOLDS))))
    fleet = subprocess.Popen([sys.executable, "-m", "tests.prometheus.fleet"],
                             stdin=subprocess.PIPE, stdout=subprocess.PIPE)
    prometheus = None
    with refused_port() as refused:  # held: no other test's server can take it
        try:
            assert fleet.stdout is not None
            urls = json.loads(fleet.stdout.readline())
            down = f"http://127.0.0.1:{refused}/metrics"
            sims = [urls["leaky"], *urls["healthy"], urls["paused"], urls["old"]]
            instances = [PromEnv.instance(u) for u in sims]
            (tmp / "prometheus.yml").write_text(
                _prometheus_yml([*instances, PromEnv.instance(down)], rules))
            prometheus, url = start_prometheus(binary, tmp)
            _wait_ready(url, instances, prometheus)
            yield PromEnv(url, urls["leaky"], urls["healthy"], urls["paused"], urls["old"], down,
                          config, time.time())
        finally:
            stop(prometheus, fleet)
