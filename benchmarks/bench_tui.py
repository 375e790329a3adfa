"""CPU and terminal output of the kvtop terminal app with 16 simulated hosts at 1 Hz.

The real command (``python -m kvtop URL...``) runs in a headless pseudo-terminal of a given
size; this script drains the terminal continuously and reports, per run:

* CPU: the app process's user+system time (/proc/<pid>/stat) as % of one core, in the steady
  state (after the first ``--warmup`` seconds, which hold imports and the first scrapes);
* terminal bytes per second over the same span;
* time to first frame (a fleet row's host name on screen: any host, the table may be
  shorter than the fleet), the app's CPU seconds up to it (what a busy machine does not
  inflate the way it inflates wall time), and time to first data (a KV bar).

Goals (issues 4 and 12, with the engine's panes on): <= 5 % of a core and <= 20 KB/s at
80x24, <= 8 % at 160x48, first frame under 1 s with one host hanging (``--hanging 1``: a
listener that takes the connection and never answers, listed first).

With ``--gpu-exporters N`` the app also reads N dcgm-exporters (each serving the real
Tesla T4 body of tests/fixtures/gpu, two GPUs) on the hosts' machine, so every server owns
GPUs: the GPU pane (NVML asked too), the GPU column and the engine pane's GPU line are drawn.

    .venv/bin/python -m benchmarks.bench_tui [--seconds 60] [--hosts 16] [--gpu-exporters 16]
        [--hanging 1] [--demo] [--rounds 5] [--quick]

``--demo`` runs ``kvtop --demo`` instead, as the README's first command does (NVML asked;
the simulated fleet runs in the app's process, so its CPU is in the app's): the first frame
a newcomer sees.
``--rounds N`` repeats each run and prints every round (this machine is shared: report
ranges, not one number). ``--quick`` is a few seconds' smoke run of 80x24.

Run with another checkout's interpreter (``/work/main/.venv/bin/python
benchmarks/bench_tui.py``) to measure that checkout's app: the script imports no kvtop.
"""

from __future__ import annotations

import argparse
import fcntl
import http.server
import os
import pty
import re
import select
import signal
import socket
import struct
import subprocess
import sys
import termios
import threading
import time
from dataclasses import dataclass

from benchmarks.paths import GPU_METRICS
from benchmarks.quick import parse_args, quick_option

ANSI = re.compile(
    rb"\x1b(?:\[[0-9;?<>=]*[ -/]*[@-~]|\][^\x07\x1b]*(?:\x07|\x1b\\)|[()][A-Z0-9]|[=>])"
)
KV_BAR = "░".encode()  # a KV bar is drawn once some host's numbers have arrived
HZ = os.sysconf("SC_CLK_TCK")
DCGM_BODY = GPU_METRICS / "dcgm-datadog-t4.txt"


DEMO_HOSTS = ("mooncake", "prefix-heavy", "leaky", "restarts")  # kvtop/sim/demo.py's names


@dataclass
class Run:
    label: str
    columns: int
    rows: int
    extra: tuple[str, ...] = ()
    gpu: bool = False  # NVML and the GPU pane on (else --no-gpu)
    demo: bool = False  # `kvtop --demo` instead of the given hosts


@dataclass
class Result:
    run: Run
    cpu_percent: float
    bytes_per_s: float
    first_frame_s: float | None
    first_frame_cpu_s: float | None  # the app's own CPU seconds up to its first frame
    first_data_s: float | None


def start_sim(count: int) -> tuple[subprocess.Popen[str], list[str]]:
    """``kvtop sim --port 0 --count N``; its first N stdout lines are the URLs."""
    sim = subprocess.Popen([sys.executable, "-m", "kvtop", "sim", "--port", "0",
                            "--count", str(count)], stdout=subprocess.PIPE, text=True)
    assert sim.stdout is not None
    urls = [sim.stdout.readline().strip() for _ in range(count)]
    if not all(u.startswith("http") for u in urls):
        sim.kill()
        raise SystemExit(f"kvtop sim did not start: {urls}")
    return sim, urls


def start_exporters(count: int) -> tuple[list[http.server.ThreadingHTTPServer], list[str]]:
    """``count`` dcgm-exporters on 127.0.0.1 (threads of this process, not the app's)."""
    body = DCGM_BODY.read_bytes()

    class Exporter(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            if self.path != "/metrics":  # dcgm-exporter serves the exact path only
                self.send_error(404)
                return
            self.send_response(200)
            self.send_header("Content-Type", "text/plain; version=0.0.4")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args: object) -> None:
            pass

    servers = [http.server.ThreadingHTTPServer(("127.0.0.1", 0), Exporter)
               for _ in range(count)]
    for server in servers:
        threading.Thread(target=server.serve_forever, daemon=True).start()
    return servers, [f"127.0.0.1:{s.server_address[1]}" for s in servers]


def start_hanging(count: int) -> tuple[list[socket.socket], list[str]]:
    """``count`` listeners that take connections (the kernel does) and never answer."""
    listeners = []
    for _ in range(count):
        listener = socket.socket()
        listener.bind(("127.0.0.1", 0))
        listener.listen(64)
        listeners.append(listener)
    return listeners, [f"127.0.0.1:{s.getsockname()[1]}" for s in listeners]


def cpu_seconds(pid: int) -> float:
    with open(f"/proc/{pid}/stat", "rb") as file:
        fields = file.read().rsplit(b")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / HZ  # utime, stime (fields 14 and 15)


def spawn(run: Run, urls: list[str]) -> tuple[int, int]:
    """The app in a new pseudo-terminal of the run's size; returns (pid, master fd)."""
    pid, fd = pty.fork()
    if pid == 0:  # child: size the terminal before the app asks for it
        fcntl.ioctl(0, termios.TIOCSWINSZ, struct.pack("HHHH", run.rows, run.columns, 0, 0))
        env = dict(os.environ, TERM="xterm-256color", COLORTERM="")
        env.pop("NO_COLOR", None)
        gpu = [] if run.gpu else ["--no-gpu"]
        hosts = ["--demo"] if run.demo else urls
        os.execve(sys.executable, [sys.executable, "-m", "kvtop", *hosts, *gpu,
                                   "--interval", "1", *run.extra], env)
    return pid, fd


def drain(fd: int, seconds: float) -> bytes:
    """Read whatever the app writes for ``seconds`` (the terminal never blocks it)."""
    out = bytearray()
    deadline = time.monotonic() + seconds
    while (left := deadline - time.monotonic()) > 0:
        ready, _, _ = select.select([fd], [], [], min(left, 0.05))
        if ready:
            try:
                out += os.read(fd, 65536)
            except OSError:  # the app is gone
                break
    return bytes(out)


def measure(run: Run, urls: list[str], seconds: float, warmup: float) -> Result:
    names = DEMO_HOSTS if run.demo else [url.split("//")[-1].split("/", 1)[0] for url in urls]
    hosts = [name.encode() for name in names]  # row names
    started = time.monotonic()
    pid, fd = spawn(run, urls)
    first_frame = first_frame_cpu = first_data = None
    seen = bytearray()
    try:
        while time.monotonic() - started < warmup:
            seen += drain(fd, 0.02)
            plain = ANSI.sub(b"", bytes(seen))
            if first_frame is None and any(host in plain for host in hosts):
                first_frame = time.monotonic() - started
                first_frame_cpu = cpu_seconds(pid)
            if first_data is None and KV_BAR in plain:
                first_data = time.monotonic() - started
        cpu0, t0 = cpu_seconds(pid), time.monotonic()
        steady = drain(fd, seconds)
        cpu1, t1 = cpu_seconds(pid), time.monotonic()
    finally:
        stop(pid, fd)
    return Result(run, 100 * (cpu1 - cpu0) / (t1 - t0), len(steady) / (t1 - t0),
                  first_frame, first_frame_cpu, first_data)


def stop(pid: int, fd: int) -> None:
    """q, as a user would; then the signals, so no app outlives the benchmark."""
    try:
        os.write(fd, b"q")
        drain(fd, 1.0)
    except OSError:
        pass
    for sig in (signal.SIGTERM, signal.SIGKILL):
        if os.waitpid(pid, os.WNOHANG) != (0, 0):
            break
        os.kill(pid, sig)
        time.sleep(0.5)
    else:
        os.waitpid(pid, 0)
    os.close(fd)


def table(results: list[Result], hosts: int, seconds: float, exporters: int,
          demo: bool = False) -> str:
    def secs(value: float | None) -> str:
        return "–" if value is None else f"{value:.2f} s"

    gpus = (f"{exporters} dcgm-exporters, GPU pane on" if exporters
            else "NVML asked" if demo else "--no-gpu")
    fleet = "kvtop --demo" if demo else f"{hosts} simulated hosts at 1 Hz"
    lines = [
        f"kvtop TUI ({sys.executable}), {fleet}, {seconds:g} s steady state, {gpus}",
        "",
        "| terminal | CPU (% of a core) | output | first frame | its CPU | first data |",
        "|---|---:|---:|---:|---:|---:|",
    ]
    for r in results:
        lines.append(f"| {r.run.label} | {r.cpu_percent:.1f} % | {r.bytes_per_s / 1000:.1f} KB/s"
                     f" | {secs(r.first_frame_s)} | {secs(r.first_frame_cpu_s)}"
                     f" | {secs(r.first_data_s)} |")
    return "\n".join(lines)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seconds", type=float, default=60.0, help="steady-state span per run")
    parser.add_argument("--warmup", type=float, default=5.0, help="seconds before measuring")
    parser.add_argument("--hosts", type=int, default=16)
    parser.add_argument("--gpu-exporters", type=int, default=0, metavar="N",
                        help="also read N dcgm-exporters (the GPU views drawn)")
    parser.add_argument("--hanging", type=int, default=0, metavar="N",
                        help="also N hosts that take the connection and never answer, first")
    parser.add_argument("--only", choices=("80x24", "160x48"), help="one terminal size")
    parser.add_argument("--demo", action="store_true", help="run `kvtop --demo` instead")
    parser.add_argument("--rounds", type=int, default=1, help="each run this many times")
    quick_option(parser, seconds=2.0, warmup=2.0, hosts=4, only="80x24")
    args = parse_args(parser)
    gpu = args.gpu_exporters > 0 or args.demo  # the demo as the README runs it: NVML asked
    runs = [Run("80×24", 80, 24, gpu=gpu, demo=args.demo),
            Run("160×48", 160, 48, gpu=gpu, demo=args.demo),
            Run("80×24 --low-bandwidth", 80, 24, ("--low-bandwidth",), gpu, args.demo)]
    if args.only:
        runs = [r for r in runs if r.label == args.only.replace("x", "×")]
    runs = [run for run in runs for _ in range(args.rounds)]
    sim, urls = (None, []) if args.demo else start_sim(args.hosts)
    exporters, exporter_urls = start_exporters(args.gpu_exporters)
    hanging, hanging_urls = start_hanging(args.hanging)
    try:
        results = [measure(run, hanging_urls + urls + exporter_urls, args.seconds,
                           args.warmup) for run in runs]
    finally:
        if sim is not None:
            sim.terminate()
            sim.wait(10)
        for server in exporters:
            server.shutdown()
        for listener in hanging:
            listener.close()
    print(table(results, args.hosts, args.seconds, args.gpu_exporters, args.demo))
    return 0


if __name__ == "__main__":
    sys.exit(main())
