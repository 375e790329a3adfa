"""The figures a baseline keeps and the smallest change of each that counts
(kvtop/baseline/figures.py), as docs/baseline-format.md's table lists them."""

from __future__ import annotations

from kvtop.baseline.figures import (
    ENGINE_FIGURES,
    GPU_MEMORY,
    PROBE_FIGURES,
    SPECS,
    FigureSpec,
    _latency,
)

MS = 0.001
# key: (worse when, share of the baseline's value, at least), the docs' table
DOCUMENTED = {
    "kv_usage": ("higher", 0.1, 0.03), "idle_kv_usage": ("higher", 0.0, 0.005),
    "preemptions_per_min": ("higher", 0.5, 1.0), "waiting": ("higher", 0.25, 0.5),
    "hit_rate": ("lower", 0.0, 0.05), "reuse_share": ("lower", 0.0, 0.05),
    "block_lifetime_p50": ("lower", 0.2, 10 * MS), "block_lifetime_p99": ("lower", 0.2, 10 * MS),
    "kv_limited": ("higher", 0.0, 0.1),
    "ttft_p50": ("higher", 0.2, 5 * MS), "ttft_p99": ("higher", 0.2, 5 * MS),
    "itl_p50": ("higher", 0.2, 2 * MS), "itl_p99": ("higher", 0.2, 2 * MS),
    "e2e_p50": ("higher", 0.2, 50 * MS), "e2e_p99": ("higher", 0.2, 50 * MS),
    "running": ("load", 0.1, 1.0), "prompt_tps": ("load", 0.1, 1.0),
    "generation_tps": ("load", 0.1, 1.0),
}


def test_a_latency_figure_is_its_p50_and_p99_in_seconds_20_percent_and_a_floor() -> None:
    assert _latency("ttft", "TTFT", 0.005) == (
        FigureSpec("ttft_p50", "TTFT p50", "seconds", "higher", 0.2, 0.005),
        FigureSpec("ttft_p99", "TTFT p99", "seconds", "higher", 0.2, 0.005))


def test_each_figure_counts_a_change_as_the_docs_say() -> None:
    got = {spec.key: (spec.worse, spec.rel, spec.floor) for spec in ENGINE_FIGURES}
    assert got == DOCUMENTED and set(SPECS) == set(DOCUMENTED)
    assert [s.key for s in ENGINE_FIGURES if s.steady] == ["idle_kv_usage"]
    assert (GPU_MEMORY.worse, GPU_MEMORY.rel, GPU_MEMORY.floor) == ("load", 0.02, 256 * 2**20)
    assert [(s.key, s.worse, s.rel, s.floor) for s in PROBE_FIGURES] == [
        ("ttft", "higher", 0.2, 5 * MS), ("total", "higher", 0.2, 10 * MS)]
