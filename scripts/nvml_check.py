"""Check kvtop's real NVML path against nvidia-smi on a machine with NVIDIA GPUs.

Run from the repository root where nvidia-ml-py is installed (it needs nothing else of
kvtop's dependencies):  PYTHONPATH=. python3 scripts/nvml_check.py
Prints what kvtop reads and what nvidia-smi reports, side by side, and exits 1 when they
disagree (names, UUIDs, total memory, used memory beyond a small drift, process sets).
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
from dataclasses import dataclass

from kvtop.collect.nvml import GpuReading, NvmlReader, NvmlUnavailable, gpu_to_json

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


def main() -> int:
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
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
