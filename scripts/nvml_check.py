"""Check kvtop's real NVML path and its GPU ownership against nvidia-smi on a machine with
NVIDIA GPUs.

Run from the repository root where nvidia-ml-py is installed (it needs nothing else of
kvtop's dependencies):  PYTHONPATH=. python3 scripts/nvml_check.py [--vllm-port PORT]
Prints what kvtop reads and what nvidia-smi reports, side by side, and exits 1 when they
disagree (names, UUIDs, total memory, used memory beyond a small drift, process sets).

Ownership: the check listens on a port itself and opens a CUDA context (through the driver's
libcuda, no other library) in itself and in a child process, so nvidia-smi lists both as
compute processes; kvtop's port -> process -> GPU process mapping must give both, and no
other process, to that port. With ``--vllm-port``, every GPU process nvidia-smi lists whose
command line names vllm must map to that port too (a real vLLM: API server, EngineCore,
workers).
"""

from __future__ import annotations

import argparse
import ctypes
import json
import os
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from kvtop.collect.nvml import GpuReading, NvmlReader, NvmlUnavailable, gpu_to_json
from kvtop.collect.ownership import PortOwners

MIB = 2**20
USED_DRIFT_MIB = 64  # memory moves between the two reads on a busy GPU


@dataclass(frozen=True)
class SmiGpu:
    index: int
    name: str
    uuid: str
    used_mib: int
    total_mib: int
    pids: frozenset[int]


def query_nvidia_smi() -> list[SmiGpu]:
    gpus = _csv(["nvidia-smi", "--query-gpu=index,name,uuid,memory.used,memory.total",
                 "--format=csv,noheader,nounits"])
    apps = _csv(["nvidia-smi", "--query-compute-apps=gpu_uuid,pid",
                 "--format=csv,noheader,nounits"])
    pids: dict[str, set[int]] = {}
    for uuid, pid in apps:
        pids.setdefault(uuid, set()).add(int(pid))
    return [SmiGpu(int(i), name, uuid, int(used), int(total), frozenset(pids.get(uuid, ())))
            for i, name, uuid, used, total in gpus]


def _csv(command: list[str]) -> list[list[str]]:
    out = subprocess.run(command, capture_output=True, text=True, check=True, timeout=30).stdout
    return [[field.strip() for field in line.split(",")] for line in out.splitlines() if line]


def compare(kvtop: list[GpuReading], smi: list[SmiGpu]) -> list[str]:
    """Every disagreement between kvtop's NVML reading and nvidia-smi, as a sentence."""
    problems = []
    if len(kvtop) != len(smi):
        problems.append(f"kvtop sees {len(kvtop)} GPUs, nvidia-smi {len(smi)}")
    for ours, theirs in zip(kvtop, smi, strict=False):
        where = f"GPU {theirs.index}"
        if ours.name != theirs.name or ours.uuid != theirs.uuid:
            problems.append(f"{where}: kvtop {ours.name} {ours.uuid}, "
                            f"nvidia-smi {theirs.name} {theirs.uuid}")
        if ours.memory_total_bytes is None or ours.memory_used_bytes is None:
            problems.append(f"{where}: kvtop read no memory numbers")
            continue
        if ours.memory_total_bytes // MIB != theirs.total_mib:
            problems.append(f"{where}: total {ours.memory_total_bytes // MIB} MiB vs "
                            f"{theirs.total_mib} MiB")
        if abs(ours.memory_used_bytes / MIB - theirs.used_mib) > USED_DRIFT_MIB:
            problems.append(f"{where}: used {ours.memory_used_bytes / MIB:.0f} MiB vs "
                            f"{theirs.used_mib} MiB")
        ours_pids = {p.pid for p in ours.processes}
        if theirs.pids and not theirs.pids <= ours_pids:
            problems.append(f"{where}: processes {sorted(ours_pids)} vs {sorted(theirs.pids)}")
    return problems


# A CUDA context (and 64 MiB) on GPU 0, held until stdin closes: a compute process.
CUDA_CHILD = """
import ctypes, sys
cuda = ctypes.CDLL("libcuda.so.1")
dev, ctx, mem = ctypes.c_int(), ctypes.c_void_p(), ctypes.c_uint64()
assert cuda.cuInit(0) == 0 and cuda.cuDeviceGet(ctypes.byref(dev), 0) == 0
assert cuda.cuCtxCreate_v2(ctypes.byref(ctx), ctypes.c_uint(0), dev) == 0
assert cuda.cuMemAlloc_v2(ctypes.byref(mem), ctypes.c_size_t(64 << 20)) == 0
print("ready", flush=True)
sys.stdin.read()
"""
SMI_WAIT_S = 20.0


class NoCuda(RuntimeError):
    """No CUDA context could be opened here."""


def cuda_context() -> None:
    """Make this process a compute process on GPU 0 (the driver's API through ctypes)."""
    try:
        cuda = ctypes.CDLL("libcuda.so.1")
    except OSError as exc:
        raise NoCuda(f"libcuda.so.1: {exc}") from None
    dev, ctx, mem = ctypes.c_int(), ctypes.c_void_p(), ctypes.c_uint64()
    for call in (lambda: cuda.cuInit(0), lambda: cuda.cuDeviceGet(ctypes.byref(dev), 0),
                 lambda: cuda.cuCtxCreate_v2(ctypes.byref(ctx), ctypes.c_uint(0), dev),
                 lambda: cuda.cuMemAlloc_v2(ctypes.byref(mem), ctypes.c_size_t(64 << 20))):
        if (error := call()) != 0:
            raise NoCuda(f"a CUDA driver call failed with error {error}")


@contextmanager
def gpu_server() -> Iterator[tuple[int, int]]:
    """(port, child pid): this process listens on ``port`` and, like vLLM's API server
    and EngineCore, it and its child each hold a CUDA context."""
    with socket.socket() as listener:
        listener.bind(("127.0.0.1", 0))
        listener.listen()
        cuda_context()
        child = subprocess.Popen([sys.executable, "-c", CUDA_CHILD], stdin=subprocess.PIPE,
                                 stdout=subprocess.PIPE, text=True)
        try:
            assert child.stdout is not None
            if child.stdout.readline().strip() != "ready":
                raise NoCuda("the child process could not open a CUDA context")
            yield listener.getsockname()[1], child.pid
        finally:
            child.kill()
            child.wait()


def smi_pids() -> set[int]:
    apps = _csv(["nvidia-smi", "--query-compute-apps=pid", "--format=csv,noheader,nounits"])
    return {int(row[0]) for row in apps if row and row[0].isdigit()}


def cmdline(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode()
    except OSError:
        return ""


def compare_owners(owners: dict[int, str], listed: set[int], expected: dict[int, str]
                   ) -> list[str]:
    """Every disagreement between kvtop's owners (pid -> port's name) and what must hold:
    each ``expected`` pid listed by nvidia-smi and given its owner, nothing else given one."""
    problems = []
    for pid, owner in sorted(expected.items()):
        if pid not in listed:
            problems.append(f"nvidia-smi does not list pid {pid} ({owner}) as a GPU process")
        elif owners.get(pid) != owner:
            problems.append(f"pid {pid}: kvtop says {owners.get(pid)!r}, the owner is {owner!r}")
    for pid in sorted(set(owners) - set(expected)):
        problems.append(f"pid {pid}: kvtop says {owners[pid]!r}, it is none of the servers'")
    return problems


def ownership_check(reader: NvmlReader, vllm_port: int | None) -> list[str]:
    try:
        with gpu_server() as (port, child):
            return _check_owners(reader, port, child, vllm_port)
    except NoCuda as exc:
        return [f"ownership not checked: {exc}"]


def _check_owners(reader: NvmlReader, port: int, child: int, vllm_port: int | None
                  ) -> list[str]:
    deadline = time.monotonic() + SMI_WAIT_S
    while not {os.getpid(), child} <= (listed := smi_pids()) and time.monotonic() < deadline:
        time.sleep(0.5)
    pids = [p.pid for gpu in reader.read() for p in gpu.processes]
    ports = {port: "check"} | ({vllm_port: "vllm"} if vllm_port else {})
    mapper = PortOwners()
    started = time.perf_counter()
    owners = mapper.owners(pids, ports)
    cold_ms = (time.perf_counter() - started) * 1000
    started = time.perf_counter()
    mapper.owners(pids, ports)
    cached_ms = (time.perf_counter() - started) * 1000
    expected = {os.getpid(): "check", child: "check"}
    if vllm_port:
        expected |= {pid: "vllm" for pid in listed if "vllm" in cmdline(pid).lower()}
    print("nvidia-smi compute pids:", sorted(listed))
    print("kvtop owners:", {pid: owners[pid] for pid in sorted(owners)})
    print(f"kvtop ownership: {cold_ms:.1f} ms worked out, {cached_ms:.3f} ms cached; "
          f"/proc/<pid>/fd unreadable for {sorted(mapper.denied) or 'none'}")
    return compare_owners(owners, listed, expected)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--vllm-port", type=int, help="a vLLM server's port on this machine")
    args = parser.parse_args()
    reader = NvmlReader()
    started = time.perf_counter()
    try:
        readings = reader.read()
    except NvmlUnavailable as exc:
        print(f"NVML unavailable: {exc.reason}")
        return 1
    first_s = time.perf_counter() - started
    started = time.perf_counter()
    readings = reader.read()
    again_s = time.perf_counter() - started
    smi = query_nvidia_smi()
    print(json.dumps([gpu_to_json(gpu) for gpu in readings], indent=2))
    print("nvidia-smi:", *(f"  {gpu}" for gpu in smi), sep="\n")
    print(f"kvtop NVML read: first {first_s * 1000:.1f} ms (init + handles), "
          f"then {again_s * 1000:.1f} ms")
    problems = compare(readings, smi)
    print("\n".join(problems) if problems else "kvtop's NVML reading agrees with nvidia-smi")
    owned = ownership_check(reader, args.vllm_port)
    print("\n".join(owned) if owned else "kvtop's GPU owners agree with nvidia-smi's processes")
    return 1 if problems or owned else 0


if __name__ == "__main__":
    sys.exit(main())
