"""Drive a served twin and read it independently of kvtop.

* `Load`: token-id `/v1/completions` requests, `concurrency` at a time, in background threads.
* `read_metrics`: the server's own `/metrics`, parsed with `prometheus_client.parser`.
* `MetricsTap`: a pass-through proxy that keeps every `/metrics` body it relays, so a test can
  compare kvtop's snapshot with the exact bytes kvtop read, even while the numbers move.
* `kvtop_snapshot`: the real `kvtop snapshot --json` command.
"""

from __future__ import annotations

import gzip
import json
import random
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from prometheus_client.parser import text_string_to_metric_families

from twin.model import MODEL_NAME

VOCAB = 32000
SUMMARY: list[str] = []  # one line per scenario, printed at the end of the session (conftest)
REQUEST_TIMEOUT_S = 120.0
KVTOP_TIMEOUT_S = 60.0


# ------------------------------------------------------------------------------ the load
def make_prompts(rng: random.Random, count: int, shared_frac: float) -> list[list[int]]:
    """Random token-id prompts of 16-400 tokens; `shared_frac` start with one 256-token prefix."""
    system = [rng.randrange(3, VOCAB) for _ in range(256)]
    prompts = []
    for _ in range(count):
        suffix = [rng.randrange(3, VOCAB) for _ in range(rng.randint(16, 400))]
        prompts.append(system + suffix if rng.random() < shared_frac else suffix)
    return prompts


def complete(base_url: str, prompt: list[int], max_tokens: int) -> None:
    body = json.dumps({"model": MODEL_NAME, "prompt": [prompt], "max_tokens": max_tokens})
    request = urllib.request.Request(base_url + "/v1/completions", data=body.encode(),
                                     headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(request, timeout=REQUEST_TIMEOUT_S) as answer:
        answer.read()


@dataclass
class Load:
    """`requests` completions with `concurrency` in flight, sent from background threads."""

    base_url: str
    requests: int
    concurrency: int
    seed: int = 0
    shared_frac: float = 0.0
    max_tokens: tuple[int, int] = (16, 256)
    errors: list[str] = field(default_factory=list)

    def __post_init__(self) -> None:
        self._pool = ThreadPoolExecutor(self.concurrency, thread_name_prefix="twin-load")
        self._futures: list[Any] = []

    def start(self) -> Load:
        rng = random.Random(self.seed)
        for prompt in make_prompts(rng, self.requests, self.shared_frac):
            tokens = rng.randint(*self.max_tokens)
            self._futures.append(self._pool.submit(complete, self.base_url, prompt, tokens))
        return self

    def done(self) -> bool:
        return all(future.done() for future in self._futures)

    def wait(self, timeout_s: float) -> None:
        """Wait for every request (bounded); record failures in `errors`."""
        deadline = time.monotonic() + timeout_s
        for future in self._futures:
            try:
                future.result(timeout=max(0.1, deadline - time.monotonic()))
            except Exception as error:  # a failed request or the deadline
                self.errors.append(repr(error))
        self._pool.shutdown(wait=False, cancel_futures=True)


# --------------------------------------------------------------- the server's own reading
@dataclass(frozen=True)
class Metrics:
    """One `/metrics` body, parsed by prometheus_client (not by kvtop)."""

    text: str = field(repr=False)
    samples: dict[str, list[tuple[dict[str, str], float]]] = field(repr=False)

    def __repr__(self) -> str:
        return ("Metrics(usage, running, waiting, queries, hits, preemptions = "
                f"{self.key_values()})")

    @classmethod
    def parse(cls, text: str) -> Metrics:
        samples: dict[str, list[tuple[dict[str, str], float]]] = {}
        for family in text_string_to_metric_families(text):
            for sample in family.samples:
                samples.setdefault(sample.name, []).append((dict(sample.labels), sample.value))
        return cls(text, samples)

    def value(self, name: str) -> float:
        """The single series of `name` (one engine, one model)."""
        (series,) = self.samples[name]
        return series[1]

    def labels(self, name: str) -> dict[str, str]:
        (series,) = self.samples[name]
        return series[0]

    @property
    def usage(self) -> float:
        return self.value("vllm:kv_cache_usage_perc")

    @property
    def running(self) -> float:
        return self.value("vllm:num_requests_running")

    @property
    def waiting(self) -> float:
        return self.value("vllm:num_requests_waiting")

    @property
    def queries(self) -> float:
        return self.value("vllm:prefix_cache_queries_total")

    @property
    def hits(self) -> float:
        return self.value("vllm:prefix_cache_hits_total")

    @property
    def preemptions(self) -> float:
        return self.value("vllm:num_preemptions_total")

    def key_values(self) -> tuple[float, ...]:
        return (self.usage, self.running, self.waiting, self.queries, self.hits,
                self.preemptions)


def http_get(url: str, timeout_s: float = 10.0) -> str:
    with urllib.request.urlopen(url, timeout=timeout_s) as answer:
        return str(answer.read().decode("utf-8"))


def read_metrics(base_url: str) -> Metrics:
    return Metrics.parse(http_get(base_url + "/metrics"))


def wait_until_idle(base_url: str, timeout_s: float = 60.0) -> Metrics:
    """The server's reading once running == waiting == 0 in two reads 0.3 s apart."""
    deadline = time.monotonic() + timeout_s
    previous: Metrics | None = None
    while time.monotonic() < deadline:
        now = read_metrics(base_url)
        idle = now.running == 0 and now.waiting == 0
        if idle and previous is not None and previous.key_values() == now.key_values():
            return now
        previous = now if idle else None
        time.sleep(0.3)
    raise TimeoutError(f"{base_url} not idle after {timeout_s:.0f} s")


def wait_until_busy(base_url: str, timeout_s: float = 60.0) -> Metrics:
    """The server's first reading with running > 0."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        now = read_metrics(base_url)
        if now.running > 0:
            return now
        time.sleep(0.1)
    raise TimeoutError(f"{base_url} never ran a request within {timeout_s:.0f} s")


# -------------------------------------------------------------------------- the tap
class MetricsTap:
    """A 127.0.0.1 proxy to `upstream`: relays each GET verbatim, keeps the `/metrics` bodies
    (and the paths asked for, narrowed reads at `/metrics/?name[]=…` included)."""

    def __init__(self, upstream: str) -> None:
        self.upstream = upstream
        self.bodies: list[str] = []
        self.paths: list[str] = []
        self._server = ThreadingHTTPServer(("127.0.0.1", 0), self._handler())
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)

    @property
    def metrics_url(self) -> str:
        return f"http://127.0.0.1:{self._server.server_address[1]}/metrics"

    def __enter__(self) -> MetricsTap:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._server.shutdown()
        self._server.server_close()
        self._thread.join(timeout=5)

    def _handler(self) -> type[BaseHTTPRequestHandler]:
        tap = self

        class Relay(BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                status, headers, body = tap.relay(self.path, self.headers.get("Accept-Encoding"))
                self.send_response(status)
                for name, value in headers:
                    self.send_header(name, value)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *args: object) -> None:
                pass

        return Relay

    def relay(self, path: str, encoding: str | None) -> tuple[int, list[tuple[str, str]], bytes]:
        request = urllib.request.Request(self.upstream + path)
        if encoding:
            request.add_header("Accept-Encoding", encoding)
        try:
            with urllib.request.urlopen(request, timeout=10) as answer:
                status, headers, body = answer.status, answer.headers, answer.read()
        except urllib.error.HTTPError as error:
            status, headers, body = error.code, error.headers, error.read()
        kept = [(k, v) for k, v in headers.items() if k.lower() in ("content-type",
                                                                      "content-encoding")]
        if urlsplit(path).path.rstrip("/").endswith("/metrics") and status == 200:
            gzipped = headers.get("Content-Encoding") == "gzip"
            self.bodies.append((gzip.decompress(body) if gzipped else body).decode("utf-8"))
            self.paths.append(path)
        return status, kept, body


# ------------------------------------------------------------------------- kvtop itself
def kvtop_command() -> list[str]:
    """The installed `kvtop` script next to this interpreter, else `python -m kvtop`."""
    script = Path(sys.executable).parent / "kvtop"
    return [str(script)] if script.exists() else [sys.executable, "-m", "kvtop"]


def kvtop_snapshot(url: str, samples: int = 1, interval_s: float = 0.5) -> dict[str, Any]:
    """`kvtop snapshot URL --json --no-gpu`; asserts exit 0, returns the one target."""
    done = subprocess.run([*kvtop_command(), "snapshot", url, "--json", "--no-gpu",
                           "--samples", str(samples), "--interval", str(interval_s)],
                          capture_output=True, text=True, timeout=KVTOP_TIMEOUT_S)
    assert done.returncode == 0, f"kvtop exit {done.returncode}: {done.stderr}{done.stdout}"
    (target,) = json.loads(done.stdout)["targets"]
    return dict(target)


def json_num(value: float, digits: int = 6) -> float:
    """A number as the snapshot JSON writes it (rounded; docs/snapshot-json.md)."""
    return round(value, digits)


def only_engine(target: dict[str, Any]) -> dict[str, Any]:
    (engine,) = target["engines"]
    return dict(engine)
