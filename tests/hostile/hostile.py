"""What a hostile server or Prometheus sends, and how the tests look at what kvtop printed.

* :data:`EVIL_MODEL`, :data:`EVIL_ENGINE`, :data:`EVIL_CONFIG`: label values with escape
  sequences (OSC 52 clipboard writes, ``ESC[2J``), Rich markup, newlines, bidi overrides and
  8-bit C1 controls, put into a real vLLM scrape by :func:`hostile_body`.
* FaultServer modes ``echo_auth`` / ``echo_auth_ok``: an error (or a /metrics body) that
  echoes the ``Authorization`` header, padded so the token straddles kvtop's quote cut.
* :class:`FakePrometheus`: a small aiohttp app speaking the Prometheus HTTP API kvtop uses,
  with hostile instance labels, model names, ``lastError`` and ``error`` answers that echo
  the header.
* :func:`run_in_pty`: the real command with its stdout on a pseudo-terminal, as a person
  runs it (text output, colours on).
"""

from __future__ import annotations

import asyncio
import fcntl
import json
import os
import pty
import re
import select
import struct
import subprocess
import sys
import tempfile
import termios
import time
from dataclasses import dataclass, field
from typing import Any

from aiohttp import web

from kvtop.collect.adapters import WANTED
from kvtop.collect.exposition import parse
from tests.fakes.faultserver import FaultServer, Request, mode
from tests.support.paths import fixture_text

UNDER_LOAD = "vllm-0.33.0-v1-twin-under-load.txt"
TOKEN = "tok-0123456789abcdef-SECRET-do-not-print"
TOKEN_HEAD = TOKEN[:8]  # what a cut before masking used to leak

OSC52 = "\x1b]52;c;ZXZpbA==\x07"  # "write 'evil' to the clipboard"
CLEAR = "\x1b[2J\x1b[H"
MARKUP = "[/]oops[/bold][link='http://evil.example/x']click[/link]"
SPOOF = "\nFAKE ROW up 100% LEAK"
BIDI = "\u202egnp.exe"
C1_CSI = "\x9b2J"
EVIL_MODEL = f"evil{OSC52}{CLEAR}{MARKUP}{SPOOF}{BIDI}{C1_CSI}"
EVIL_ENGINE = "0\x1b[2J[/]"
EVIL_CONFIG = "\x1b]52;c;Y2FjaGU=\x07[/x]"
EVIL_ERROR = f"boom{OSC52}{CLEAR}{MARKUP}{SPOOF}"
EVIL_LEAD = f"boom{OSC52}{CLEAR}{MARKUP}:"  # leads Prometheus's errors (one line, no spaces)
EVIL_INSTANCE = f"10.9.9.9:8000{OSC52}[/]"
# Label *names* on every series of the hostile instance (Prometheus 3 allows any UTF-8
# name): F5 offers them as groups, the toast and the header name them.
EVIL_LABEL_NAMES = {"a\x1b[2J": "v", "a\x9b2J": "w", f"a{OSC52}": "x", "a[/]": "y[/]"}

# Controls and format characters that must never reach a terminal from outside text.
RAW_CONTROLS = re.compile("[\x00-\x08\x0b-\x1f\x7f-\x9f\u202a-\u202e\u2066-\u2069]")
SGR = re.compile(r"\x1b\[[0-9;:]*m")
CURSOR_TO = re.compile(r"\x1b\[[0-9]+;[0-9]+H")  # Textual places each line it repaints


def _label_value(text: str) -> str:
    """``text`` written as an exposition label value (backslash, quote and newline escaped)."""
    return text.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")


def hostile_body(model: str = EVIL_MODEL) -> bytes:
    """The real vLLM 0.33 scrape with a hostile model name, engine label and KV config."""
    body = fixture_text(UNDER_LOAD)
    body = body.replace('model_name="twin-llama"', f'model_name="{_label_value(model)}"')
    body = body.replace('engine="0"', f'engine="{_label_value(EVIL_ENGINE)}"')
    body = body.replace('cache_dtype="auto"', f'cache_dtype="{_label_value(EVIL_CONFIG)}"')
    return body.encode("utf-8")


def healthy_body() -> bytes:
    return fixture_text(UNDER_LOAD).encode("utf-8")


def foreign_controls(text: str, *, repaint: bool = False) -> list[str]:
    """Control characters in ``text`` outside SGR colours (kvtop's own styling) and, for a
    ``repaint`` of the app's screen, Textual's moves to the start of each line."""
    rest = SGR.sub("", text).replace("\r\n", "\n")
    if repaint:
        rest = CURSOR_TO.sub("", rest)
    return RAW_CONTROLS.findall(rest)


# ---------------------------------------------------------------------------- echo modes


def echoed(auth: str, pad: int) -> str:
    """An error text with the header ``pad`` characters in; the token straddles a cut there."""
    return "x" * pad + " you sent " + auth + " " + EVIL_ERROR


@mode("echo_auth")
async def _echo_auth(srv: FaultServer, req: Request, w: asyncio.StreamWriter) -> bool:
    """HTTP 500 whose JSON message echoes the Authorization header (``?bare=1``: only the
    token, without ``Bearer``), padded by ``?pad=N``."""
    auth = req.headers.get("authorization", "")
    if req.query.get("bare"):
        auth = "token=" + auth.removeprefix("Bearer ")
    message = echoed(auth, int(req.query.get("pad", "100")))
    body = json.dumps({"error": {"message": message}}).encode()
    return await srv.respond(w, 500, body, content_type="application/json")


@mode("echo_auth_ok")
async def _echo_auth_ok(srv: FaultServer, req: Request, w: asyncio.StreamWriter) -> bool:
    """A good scrape whose model name is the header it was sent."""
    auth = req.headers.get("authorization", "").removeprefix("Bearer ")
    return await srv.respond(w, 200, hostile_body(model=f"m {auth}"))


# ---------------------------------------------------------------------------- Prometheus


def _series(instance: str, model: str) -> list[tuple[dict[str, str], str]]:
    """(labels, value) of the wanted series of one instance, from the real scrape, labelled
    as Prometheus labels them."""
    text = fixture_text(UNDER_LOAD).replace('model_name="twin-llama"',
                                            f'model_name="{_label_value(model)}"')
    extra = EVIL_LABEL_NAMES if model == EVIL_MODEL else {}
    return [({"__name__": s.name, **s.labels, **extra, "job": "vllm", "instance": instance},
             repr(s.value)) for s in parse(text, keep=WANTED).samples]


# kvtop quotes 200 characters of what Prometheus says: this puts the cut 8 characters into
# the token of "<EVIL_LEAD>xxx… you sent Bearer <token>".
PROMETHEUS_PAD = 200 - len(EVIL_LEAD) - len(" you sent Bearer ") - 8


@dataclass
class FakePrometheus:
    """Prometheus's HTTP API as kvtop calls it: a hostile instance, a healthy one and a down
    one whose ``lastError`` echoes the header; ``error_mode`` answers every call with an
    ``error`` that echoes it instead."""

    healthy: str = "10.0.0.1:8000"
    hostile: str = EVIL_INSTANCE
    down: str = "10.0.0.2:8000"
    error_mode: bool = False
    pad: int = PROMETHEUS_PAD  # x characters after EVIL_LEAD
    seen_auth: list[str] = field(default_factory=list)
    _runner: web.AppRunner | None = None
    port: int = 0

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    async def __aenter__(self) -> FakePrometheus:
        app = web.Application()
        app.router.add_route("*", "/api/v1/{call}", self._call)
        self._runner = web.AppRunner(app, access_log=None)
        await self._runner.setup()
        site = web.TCPSite(self._runner, "127.0.0.1", 0)
        await site.start()
        self.port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        if self._runner is not None:
            await self._runner.cleanup()

    async def _call(self, request: web.Request) -> web.Response:
        auth = request.headers.get("Authorization", "")
        self.seen_auth.append(auth)
        if self.error_mode:
            return web.json_response({"status": "error", "errorType": "bad_data",
                                      "error": EVIL_LEAD + echoed(auth, self.pad)}, status=400)
        if request.match_info["call"] == "targets":
            return _success({"activeTargets": [
                {"labels": {"job": "vllm", "instance": self.down}, "health": "down",
                 "lastError": EVIL_LEAD + echoed(auth, self.pad)}]})
        query = (await request.post()).get("query", "")
        assert isinstance(query, str)
        return _success({"resultType": "matrix", "result": self._result(query)})

    def _result(self, query: str) -> list[dict[str, Any]]:
        now = time.time()
        if query.startswith("count by"):
            return [{"metric": {"job": "vllm", "instance": i}, "value": [now, "1"]}
                    for i in (self.healthy, self.hostile)]
        if query.startswith("up{"):
            return [{"metric": {"__name__": "up", "job": "vllm", "instance": i},
                     "values": [[now - 1, "0" if i == self.down else "1"]]}
                    for i in (self.healthy, self.hostile, self.down)]
        series = _series(self.healthy, "twin-llama") + _series(self.hostile, EVIL_MODEL)
        return [{"metric": metric, "values": [[now - 1, value]]} for metric, value in series]


def _success(data: dict[str, Any]) -> web.Response:
    return web.json_response({"status": "success", "data": data})


# ---------------------------------------------------------------------------- a terminal


@dataclass
class Run:
    code: int
    out: str  # what the terminal received (the pty turns "\n" into "\r\n")
    err: str


def run_in_pty(*args: str, env: dict[str, str] | None = None, timeout_s: float = 90.0,
               columns: int = 400) -> Run:
    """``python -m kvtop ARGS`` with stdout on a pseudo-terminal ``columns`` wide (so the
    commands print text for people, not JSON) and stderr captured apart."""
    master, slave = pty.openpty()
    fcntl.ioctl(slave, termios.TIOCSWINSZ, struct.pack("HHHH", 50, columns, 0, 0))
    with tempfile.TemporaryFile() as err:
        proc = subprocess.Popen(
            [sys.executable, "-m", "kvtop", *args], stdin=subprocess.DEVNULL, stdout=slave,
            stderr=err, env={**os.environ, "COLUMNS": str(columns), **(env or {})})
        os.close(slave)
        out = _read_until_closed(master, proc, timeout_s)
        code = proc.wait(timeout=10)
        err.seek(0)
        return Run(code, out.decode("utf-8", errors="replace"),
                   err.read().decode("utf-8", errors="replace"))


def _read_until_closed(master: int, proc: subprocess.Popen[bytes], timeout_s: float) -> bytes:
    data = bytearray()
    deadline = time.monotonic() + timeout_s
    try:
        while time.monotonic() < deadline:
            ready, _, _ = select.select([master], [], [], 0.5)
            if not ready:
                continue
            try:
                chunk = os.read(master, 65536)
            except OSError:  # EIO: the child closed the terminal
                break
            if not chunk:
                break
            data += chunk
        else:
            proc.kill()
            raise AssertionError(f"kvtop {proc.args} did not finish within {timeout_s:g} s")
    finally:
        os.close(master)
    return bytes(data)
