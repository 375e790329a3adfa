"""Local GPUs for headless output: NVML when it is there, nothing (not an error) when not."""

from __future__ import annotations

from typing import Any

from kvtop.collect.nvml import NvmlUnavailable, gpu_to_json, read_gpus


def gpus_json() -> list[dict[str, Any]]:
    try:
        return [gpu_to_json(gpu) for gpu in read_gpus()]
    except NvmlUnavailable:
        return []
