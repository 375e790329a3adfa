"""Recordings of the simulated server for the baseline tests, made once per session in
simulated time (benchmarks/baseline_eval/scenarios.py): the healthy run, one run per
change, a healthy prefix-heavy run (the baseline for prefix caching off) and the reruns.

The changed runs have another seed than their baseline (other arrivals, lengths and
prefixes), as a later run of a real server would: the change must show through the noise."""

from __future__ import annotations

from pathlib import Path

from benchmarks.baseline_eval.scenarios import CHANGES, HEALTHY, RunSpec, write_recording
from kvtop.baseline import collect
from kvtop.baseline.model import Baseline
from kvtop.store.recording import read_recording

RERUNS = 20
CHANGED_SEED = 100
SPECS: dict[str, RunSpec] = {
    "healthy": HEALTHY,
    "prefix_heavy": HEALTHY.but(prefix_heavy=True),
    **{name: spec.but(seed=CHANGED_SEED) for name, spec in CHANGES.items()},
}


class Recordings:
    """Scenario recordings, written on first use into one folder for the session."""

    def __init__(self, folder: Path) -> None:
        self.folder = folder

    def path(self, name: str, spec: RunSpec | None = None) -> Path:
        path = self.folder / f"{name}.jsonl.gz"
        if not path.exists():
            write_recording(spec or SPECS[name], path)
        return path

    def rerun(self, seed: int) -> Path:
        return self.path(f"rerun-{seed}", HEALTHY.but(seed=seed))


def summarise(path: Path, name: str | None = None) -> Baseline:
    """A recording summarised the way `kvtop baseline save --from` / `compare --replay` do."""
    recording = read_recording(path)
    return collect.summarise(recording.in_time_order(), targets=recording.targets(),
                             name=name, source={"kind": "recording", "recording": str(path)},
                             interval_s=recording.interval_s, in_time_order=True)
