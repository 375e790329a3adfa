"""Start and stop a served vLLM 0.33.0 twin (`vllm serve` with twin/executor.py's model-less
executor; twin/README.md).

Each server runs in its own process group, so stopping it by pid also ends its EngineCore.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import time
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path

from twin.model import MODEL_NAME, VLLM_ENV, write_model_dir

REPO = Path(__file__).resolve().parents[1]
EXECUTOR = "twin.executor.TwinExecutor"  # importable in the server: PYTHONPATH is the checkout
# Start-up is 15-35 s on an idle machine, 100 s for three at once on a busy 2-core one.
INSTALL_HINT = "run scripts/install-twin.sh (or set KVTOP_TWIN_PYTHON)"
START_TIMEOUT_S = float(os.environ.get("KVTOP_TWIN_START_TIMEOUT", "300"))
STOP_TIMEOUT_S = 20.0


def twin_python() -> Path:
    """The twin interpreter: $KVTOP_TWIN_PYTHON, else <repo>/.venv-twin/bin/python."""
    configured = os.environ.get("KVTOP_TWIN_PYTHON")
    return Path(configured) if configured else REPO / ".venv-twin" / "bin" / "python"


def twin_env(**extra: str) -> dict[str, str]:
    """vLLM's CPU-only environment, this checkout on PYTHONPATH (for ``twin``), and the
    executor knobs in ``extra``."""
    return {**os.environ, **VLLM_ENV, "PYTHONPATH": str(REPO), **extra}


def unavailable_reason(python: Path) -> str | None:
    """Why the tier cannot run here before trying vllm, or None."""
    if os.environ.get("KVTOP_TWIN") == "0":
        return "twin tier disabled by KVTOP_TWIN=0"
    if not python.exists():
        return f"twin tier skipped: no twin interpreter at {python}; {INSTALL_HINT}"
    return None


def import_vllm_error(python: Path, model_dir: Path) -> str | None:
    """Write the fake model's config.json and check that the twin interpreter imports vllm
    (else: the reason to skip) and then twin/executor.py (else: a real error)."""
    write_model_dir(model_dir)
    imports = "import vllm; print('vllm imported', flush=True); import twin.executor"
    try:
        check = subprocess.run([str(python), "-c", imports], env=twin_env(),
                               capture_output=True, text=True, timeout=180)
    except (OSError, subprocess.TimeoutExpired) as error:
        return f"twin tier skipped: {python} -c 'import vllm' failed: {error}; {INSTALL_HINT}"
    if check.returncode == 0:
        return None
    if "vllm imported" in check.stdout:
        raise RuntimeError(f"twin/executor.py does not import:\n{check.stderr}")
    last = (check.stderr.strip().splitlines() or ["?"])[-1]
    return f"twin tier skipped: 'import vllm' fails in {python}: {last}; {INSTALL_HINT}"


def free_port() -> int:
    """An ephemeral port on 127.0.0.1 that was free a moment ago."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def free_port_pair() -> int:
    """A port P on 127.0.0.1 such that P and P + 1 were both free a moment ago."""
    for _ in range(100):
        port = free_port()
        with socket.socket() as sock:
            try:
                sock.bind(("127.0.0.1", port + 1))
            except OSError:
                continue
        return port
    raise OSError("no two consecutive free ports on 127.0.0.1")


@dataclass(frozen=True)
class TwinSpec:
    """One served twin: executor knobs (KVTOP_TWIN_*) and the scheduler limits."""

    num_blocks: int
    step_delay_s: float
    leak_frac: float = 0.0
    max_num_seqs: int = 32
    max_model_len: int = 4096
    api_servers: int = 1  # >1: vLLM's multiprocess metrics (PROMETHEUS_MULTIPROC_DIR)
    kv_cache_metrics: bool = False  # --kv-cache-metrics, every block sampled
    # --kv-events-config: vLLM connects its PUB to kvtop listening on this port of
    # 127.0.0.1 and binds its replay socket on the next (free_port() finds a pair)
    kv_events_port: int | None = None
    kv_counts: Path | None = None  # KVTOP_TWIN_KV_COUNTS: the pool's own counts (kv_counts.py)

    def env(self) -> dict[str, str]:
        extra = {} if self.kv_counts is None else {"KVTOP_TWIN_KV_COUNTS": str(self.kv_counts)}
        return twin_env(KVTOP_TWIN_BLOCKS=str(self.num_blocks),
                        KVTOP_TWIN_STEP_S=str(self.step_delay_s),
                        KVTOP_TWIN_LEAK_FRAC=str(self.leak_frac), **extra)

    def kv_args(self) -> list[str]:
        args = ["--kv-cache-metrics", "--kv-cache-metrics-sample", "1.0"] \
            if self.kv_cache_metrics else []
        if self.kv_events_port is not None:
            config = {"enable_kv_cache_events": True, "publisher": "zmq",
                      "endpoint": f"tcp://127.0.0.1:{self.kv_events_port}",
                      "replay_endpoint": f"tcp://127.0.0.1:{self.kv_events_port + 1}"}
            args += ["--kv-events-config", json.dumps(config)]
        return args

    def args(self, model_dir: Path, port: int) -> list[str]:
        return ["-m", "vllm.entrypoints.cli.main", "serve", str(model_dir),
                "--skip-tokenizer-init",
                "--distributed-executor-backend", EXECUTOR,
                "--served-model-name", MODEL_NAME,
                "--max-num-seqs", str(self.max_num_seqs), "--max-num-batched-tokens", "1024",
                "--max-model-len", str(self.max_model_len), "--block-size", "16",
                "--enable-prefix-caching", "--host", "127.0.0.1", "--port", str(port),
                "--api-server-count", str(self.api_servers), *self.kv_args()]


@dataclass
class TwinServer:
    """A launched `vllm serve` twin; `wait_ready` before use, `stop` always."""

    name: str
    spec: TwinSpec
    port: int
    log_path: Path
    process: subprocess.Popen[bytes]
    started_at: float = field(default_factory=time.monotonic)
    ready_after_s: float | None = None

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def metrics_url(self) -> str:
        return self.base_url + "/metrics"

    @classmethod
    def launch(cls, name: str, spec: TwinSpec, python: Path, model_dir: Path,
               log_dir: Path) -> TwinServer:
        port = free_port()
        log_path = log_dir / f"twin-{name}-{port}.log"
        with log_path.open("wb") as log:
            process = subprocess.Popen([str(python), *spec.args(model_dir, port)],
                                       env=spec.env(), stdin=subprocess.DEVNULL, stdout=log,
                                       stderr=subprocess.STDOUT, cwd=log_dir,
                                       start_new_session=True)
        return cls(name, spec, port, log_path, process)

    def log_tail(self, lines: int = 30) -> str:
        text = self.log_path.read_text(encoding="utf-8", errors="replace")
        return "\n".join(text.splitlines()[-lines:])

    def healthy(self) -> bool:
        try:
            with urllib.request.urlopen(self.base_url + "/health", timeout=2) as answer:
                return bool(answer.status == 200)
        except OSError:
            return False

    def wait_ready(self, timeout_s: float = START_TIMEOUT_S) -> None:
        """Block until /health answers 200; fail with the log tail on exit or deadline."""
        deadline = self.started_at + timeout_s
        while not self.healthy():
            if self.process.poll() is not None:
                raise RuntimeError(f"twin {self.name} exited with {self.process.returncode}:\n"
                                   + self.log_tail())
            if time.monotonic() > deadline:
                raise TimeoutError(f"twin {self.name} not healthy after {timeout_s:.0f} s:\n"
                                   + self.log_tail())
            time.sleep(0.5)
        if self.ready_after_s is None:
            self.ready_after_s = time.monotonic() - self.started_at

    def stop(self) -> None:
        """SIGTERM the process group (API server and EngineCore), SIGKILL if it lingers."""
        pgid = self.process.pid  # start_new_session: the group id is the leader's pid
        for sig, wait_s in ((signal.SIGTERM, STOP_TIMEOUT_S), (signal.SIGKILL, 5.0)):
            try:
                os.killpg(pgid, sig)
            except ProcessLookupError:
                break
            if _group_gone(pgid, self.process, wait_s):
                break


def _group_gone(pgid: int, leader: subprocess.Popen[bytes], wait_s: float) -> bool:
    """Wait up to wait_s for the leader to exit and the whole group to be gone."""
    deadline = time.monotonic() + wait_s
    while time.monotonic() < deadline:
        leader.poll()
        try:
            os.killpg(pgid, 0)
        except ProcessLookupError:
            return True
        time.sleep(0.2)
    return False
