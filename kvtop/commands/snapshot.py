"""``kvtop snapshot``: read the targets (twice, so rates are filled in), print JSON or a table.

Exit codes: 0 every target was read, 3 at least one could not be (2: usage error).
"""

from __future__ import annotations

import asyncio
import time
from datetime import datetime, timezone
from typing import Any

from kvtop.collect.poller import Poller
from kvtop.collect.target import Target
from kvtop.derive.tracker import TargetState, TargetTracker
from kvtop.report.gpus import gpu_report
from kvtop.report.output import emit
from kvtop.report.snapshot import snapshot_document
from kvtop.view.table import table_text

EXIT_OK, EXIT_UNREADABLE = 0, 3


async def collect_states(targets: list[Target], *, samples: int, interval_s: float,
                         timeout_s: float | None, insecure: bool,
                         full_metrics: bool = False) -> list[TargetState]:
    """Poll every target ``samples`` times, ``interval_s`` apart, through the trackers."""
    trackers = [TargetTracker(target) for target in targets]
    async with Poller(targets, interval_s=interval_s, timeout_s=timeout_s,
                      insecure=insecure, narrow=not full_metrics) as poller:
        for round_number in range(samples):
            started = time.monotonic()
            for tracker, scrape in zip(trackers, await poller.poll_once(), strict=True):
                tracker.update(scrape)
            if round_number < samples - 1:
                await asyncio.sleep(max(0.0, interval_s - (time.monotonic() - started)))
    return [tracker.state for tracker in trackers]


def snapshot_exit_code(states: list[TargetState]) -> int:
    return EXIT_OK if all(state.status == "up" for state in states) else EXIT_UNREADABLE


def run_snapshot(targets: list[Target], *, samples: int, interval_s: float,
                 timeout_s: float | None, insecure: bool, as_json: bool | None,
                 with_gpus: bool, full_metrics: bool = False) -> int:
    states = asyncio.run(collect_states(targets, samples=samples, interval_s=interval_s,
                                        timeout_s=timeout_s, insecure=insecure,
                                        full_metrics=full_metrics))
    return print_snapshot(states, as_json=as_json, with_gpus=with_gpus)


def print_snapshot(states: list[TargetState], *, as_json: bool | None, with_gpus: bool) -> int:
    """Print the snapshot of these states (JSON or a table); the exit code."""
    gpus, sources = gpu_report(states, with_nvml=with_gpus)
    document: dict[str, Any] = snapshot_document(
        states, gpus, taken_at=datetime.now(timezone.utc), gpu_sources=sources)
    emit(document, as_json, lambda doc: table_text(states, doc))
    return snapshot_exit_code(states)
