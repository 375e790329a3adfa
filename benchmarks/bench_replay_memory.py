"""Peak memory (RSS) of ``kvtop check --replay`` and ``kvtop replay`` on long recordings.

Writes synthetic recordings (one target at 1 Hz, every body the real 48 KB vLLM 0.33 scrape
under load, gzip) of each length asked, then runs the real commands on them:

* ``kvtop check --replay FILE --json`` to the end;
* ``kvtop replay FILE --speed 1000`` in a pseudo-terminal, seeking forward with ``}`` until
  the bar says END, then ``q``.

and prints each process's peak RSS (``ru_maxrss``) and CPU time (user + system: wall time on
a shared machine says more about the neighbours). A reader that holds the
whole recording grows with its length; a streaming one stays flat.

    .venv/bin/python -m benchmarks.bench_replay_memory [--hours 1 4] [--dir DIR]
"""

from __future__ import annotations

import argparse
import contextlib
import gzip
import json
import os
import pty
import resource
import select
import signal
import struct
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from benchmarks.paths import METRICS as FIXTURES
from benchmarks.quick import parse_args, quick_option

BODY = "vllm-0.33.0-v1-twin-under-load.txt"
TARGET = "http://10.0.0.5:8000/metrics"
T0 = 1_767_225_600.0  # 2026-01-01 00:00:00 UTC


def write_recording(path: Path, hours: float) -> int:
    """One target at 1 Hz for ``hours``; written by hand: the format is the contract."""
    body = (FIXTURES / BODY).read_text(encoding="utf-8")
    count = int(hours * 3600)
    with gzip.open(path, "wt", encoding="utf-8", compresslevel=6) as file:
        file.write(json.dumps({"format": "kvtop-recording", "version": 1,
                               "created": "2026-01-01T00:00:00+00:00", "interval_s": 1.0,
                               "targets": [TARGET]}) + "\n")
        for i in range(count):
            file.write(json.dumps({"t": T0 + i, "target": TARGET, "body": body}) + "\n")
    return count


def cpu_s(usage: resource.struct_rusage) -> float:
    return usage.ru_utime + usage.ru_stime


def check_replay(path: Path) -> tuple[float, float, int]:
    """(peak RSS MB, CPU seconds, exit code) of ``kvtop check --replay``."""
    proc = subprocess.Popen([sys.executable, "-m", "kvtop", "check", "--replay", str(path),
                             "--json"], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    _, status, usage = os.wait4(proc.pid, 0)
    proc.returncode = os.waitstatus_to_exitcode(status)
    return usage.ru_maxrss / 1024, cpu_s(usage), proc.returncode


def replay(path: Path, timeout_s: float = 900.0) -> tuple[float, float, bool]:
    """(peak RSS MB, CPU seconds, reached END) of ``kvtop replay`` in a 120x30 pty, run
    to the END of the recording."""
    started = time.monotonic()
    pid, fd = pty.fork()
    if pid == 0:
        import fcntl
        import termios

        fcntl.ioctl(0, termios.TIOCSWINSZ, struct.pack("HHHH", 30, 120, 0, 0))
        env = dict(os.environ, TERM="xterm-256color")
        os.execve(sys.executable, [sys.executable, "-m", "kvtop", "replay", str(path),
                                   "--speed", "1000"], env)
    seen, ended, last_key = b"", False, 0.0
    try:
        while time.monotonic() - started < timeout_s:
            ready, _, _ = select.select([fd], [], [], 0.1)
            if ready:
                try:
                    seen = (seen + os.read(fd, 65536))[-200_000:]
                except OSError:
                    break
            if b"END" in seen:
                ended = True
                break
            if b"REPLAY" in seen and time.monotonic() - last_key > 0.5:
                os.write(fd, b"}")  # ten minutes on
                last_key = time.monotonic()
        os.write(fd, b"q")
    except OSError:
        pass
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        done, _, usage = os.wait4(pid, os.WNOHANG)
        if done:
            break
        select.select([fd], [], [], 0.1)
        with contextlib.suppress(OSError):
            os.read(fd, 65536)  # drain the terminal so the app can finish writing
    else:
        os.kill(pid, signal.SIGKILL)
        _, _, usage = os.wait4(pid, 0)
    os.close(fd)
    return usage.ru_maxrss / 1024, cpu_s(usage), ended


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--hours", type=float, nargs="+", default=[1.0, 4.0])
    parser.add_argument("--dir", type=Path, help="where the recordings go (default: a temp dir)")
    quick_option(parser, hours=[0.02])
    args = parse_args(parser)
    folder = args.dir or Path(tempfile.mkdtemp(prefix="kvtop-bench-replay-"))
    print("| recording | scrapes | file | check --replay peak RSS | its CPU | replay peak RSS "
          "| its CPU (to END) |")
    print("|---|---:|---:|---:|---:|---:|---:|")
    for hours in args.hours:
        path = folder / f"rec-{hours:g}h.jsonl.gz"
        count = write_recording(path, hours)
        check_mb, check_s, code = check_replay(path)
        replay_mb, replay_s, ended = replay(path)
        print(f"| {hours:g} h at 1 Hz | {count} | {path.stat().st_size / 1e6:.1f} MB "
              f"| {check_mb:.0f} MB | {check_s:.1f} s (exit {code}) | {replay_mb:.0f} MB "
              f"| {replay_s:.1f} s{'' if ended else ' (END not reached)'} |", flush=True)
        path.unlink()
    return 0


if __name__ == "__main__":
    sys.exit(main())
