"""The benchmarks that start the vLLM twin themselves still run: each one's `--quick`, as a
user runs it (tests/unit/test_benchmarks.py runs the others). fidelity.run's quick form is
also judged in test_fidelity.py; here its command line is what is checked."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.unit.test_benchmarks import TWIN_SCRIPTS, run_quick


def test_the_twin_benchmarks_are_found() -> None:
    assert set(TWIN_SCRIPTS) == {"benchmarks.bench_server_cost", "benchmarks.fidelity.run"}


@pytest.mark.parametrize("module", TWIN_SCRIPTS)
def test_the_twin_benchmark_runs_quick_and_prints_its_numbers(module: str,
                                                            twin_interpreter: Path) -> None:
    done = run_quick(module)
    assert done.returncode == 0, done.stderr[-2000:]
    assert any(c.isdigit() for c in done.stdout), done.stdout[-2000:]
