"""Which watched server a local GPU process belongs to, from /proc (Linux).

A server's port -> the socket listening on it (``/proc/net/tcp``, ``tcp6``) -> the process
holding that socket (``/proc/<pid>/fd``) -> it and every process below it. vLLM's
EngineCore and its tensor-parallel workers, the processes NVML lists on the GPUs, are
children and grandchildren of the API server that listens, so the search goes up from each
GPU process through its parents until one holds a watched port.

Why /proc and not psutil: ``psutil.net_connections()`` reads every socket of every process
(all of ``/proc/*/fd``), which is what this avoids: only the GPU processes and their few
ancestors are looked at. Ownership rarely changes, so an answer is kept for ``ttl_s`` (30 s)
unless the set of GPU processes or ports changes, and so is the table of listening sockets.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Iterable, Mapping
from pathlib import Path

LISTEN = "0A"  # TCP_LISTEN in /proc/net/tcp's st column
MAX_DEPTH = 64  # ancestors looked at per process (a loop or a deep tree stops here)
DEFAULT_TTL_S = 30.0


class PortOwners:
    """Maps GPU processes to the server (whatever value ``ports`` gives a port) whose
    listening socket the process, or one of its ancestors, holds. Not thread-safe: one
    caller (the app's GPU worker, or a headless command)."""

    def __init__(self, proc_root: Path = Path("/proc"), *, ttl_s: float = DEFAULT_TTL_S,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.proc_root = proc_root
        self.ttl_s = ttl_s
        self.clock = clock
        self.scans = 0  # how often the answer was worked out, not taken from the cache
        self.denied: set[int] = set()  # processes whose sockets can't be read (another user)
        self._answer: tuple[float, object, dict[int, str]] | None = None
        self._listening: tuple[float, dict[int, int]] | None = None

    def owners(self, pids: Iterable[int], ports: Mapping[int, str]) -> dict[int, str]:
        """pid -> ``ports[port]`` for each pid that is, or descends from, the process
        listening on one of ``ports`` on this machine; pids with no such ancestor are left
        out."""
        pids = frozenset(pids)
        if not pids or not ports:
            return {}  # nothing to look for: /proc is not read
        question = (pids, tuple(sorted(ports.items())))
        now = self.clock()
        if self._answer is not None:
            at, asked, answer = self._answer
            if asked == question and now - at < self.ttl_s:
                return answer
        answer = self._work_out(pids, ports, now)
        self._answer = (now, question, answer)
        return answer

    def _work_out(self, pids: frozenset[int], ports: Mapping[int, str],
                  now: float) -> dict[int, str]:
        self.scans += 1
        self.denied.clear()
        wanted = {inode: ports[port] for inode, port in self._listening_sockets(now).items()
                  if port in ports}
        if not wanted:
            return {}
        seen: dict[int, frozenset[int]] = {}  # workers share their ancestors
        answer = {}
        for pid in pids:
            owner = self._owner(pid, wanted, seen)
            if owner is not None:
                answer[pid] = owner
        return answer

    def _owner(self, pid: int, wanted: Mapping[int, str],
               seen: dict[int, frozenset[int]]) -> str | None:
        for ancestor in self._lineage(pid):
            inodes = seen.get(ancestor)
            if inodes is None:
                inodes = seen[ancestor] = self._socket_inodes(ancestor)
            for inode in inodes:
                if inode in wanted:
                    return wanted[inode]
        return None

    # -- /proc ----------------------------------------------------------------------------

    def _listening_sockets(self, now: float) -> dict[int, int]:
        """inode -> port of every listening TCP socket (v4 and v6), read once per TTL."""
        if self._listening is not None and now - self._listening[0] < self.ttl_s:
            return self._listening[1]
        table: dict[int, int] = {}
        for name in ("tcp", "tcp6"):
            try:
                text = (self.proc_root / "net" / name).read_text()
            except OSError:
                continue
            for line in text.splitlines()[1:]:
                fields = line.split()
                if len(fields) > 9 and fields[3] == LISTEN:
                    try:
                        table[int(fields[9])] = int(fields[1].rsplit(":", 1)[1], 16)
                    except (ValueError, IndexError):
                        continue
        self._listening = (now, table)
        return table

    def _lineage(self, pid: int) -> list[int]:
        """The process and its ancestors, below pid 1 (init holds no server's socket)."""
        chain: list[int] = []
        while pid > 1 and len(chain) < MAX_DEPTH:
            chain.append(pid)
            parent = self._parent(pid)
            if parent is None:
                break
            pid = parent
        return chain

    def _parent(self, pid: int) -> int | None:
        """The parent's pid from /proc/<pid>/stat; None when the process is gone."""
        try:
            raw = (self.proc_root / str(pid) / "stat").read_bytes()
        except OSError:
            return None
        fields = raw.rsplit(b")", 1)[-1].split()  # the name in parentheses may hold spaces
        try:
            return int(fields[1])  # ppid, the stat file's 4th field
        except (IndexError, ValueError):
            return None

    def _socket_inodes(self, pid: int) -> frozenset[int]:
        folder = self.proc_root / str(pid) / "fd"
        try:
            names = os.listdir(folder)
        except PermissionError:
            self.denied.add(pid)
            return frozenset()
        except OSError:
            return frozenset()
        inodes = set()
        for name in names:
            try:
                link = os.readlink(folder / name)
            except OSError:
                continue
            if link.startswith("socket:["):
                inodes.add(int(link[8:-1]))
        return frozenset(inodes)
