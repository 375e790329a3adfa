"""Fidelity: kvtop's simulator and vLLM 0.33's real scheduler replay the same requests.

The quick form of benchmarks/fidelity/run.py (docs/fidelity.md): a small pool under bursts
(preemptions, shared prefixes) and a slice of the Mooncake trace sample. Both sides
are stepped one engine step at a time; the issue's goals are usage MAE <= 5 pp and final
prefix-cache hit rate within 3 pp. The twin replay runs in one subprocess (about 15 s).
"""

from __future__ import annotations

from pathlib import Path

from benchmarks.fidelity.run import run


def test_simulator_tracks_the_real_scheduler_step_by_step(twin_interpreter: Path) -> None:
    results = run(["pressure", "mooncake"], quick=True, python=twin_interpreter)
    for r in results:
        assert r.usage_mae_pp <= 5.0, r
        assert abs(r.hit_rate_diff_pp) <= 3.0, r
        assert r.running_mae <= 1.0 and r.waiting_mae <= 1.0, r
        assert r.preemptions_twin > 0, f"{r.workload} no longer exercises preemption"
        assert 0.8 <= r.preemption_ratio <= 1.25, r
