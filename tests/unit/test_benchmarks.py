"""Every benchmark still runs: each one's `--quick` (seconds, small numbers) as a user runs it,
`python -m benchmarks.NAME` from the repository root. Its numbers mean nothing here; what
fails is a benchmark that no longer starts, crashes, or prints no number. The ones that start
the vLLM twin run in the twin tier (tests/twin/test_benchmarks.py)."""

from __future__ import annotations

import ast
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tests.support.paths import REPO

BENCHMARKS = REPO / "benchmarks"
QUICK_TIMEOUT_S = 300.0  # a loaded 2-core machine; a quick run takes seconds to half a minute


def runnable(path: Path) -> bool:
    """A script a user runs: it has `if __name__ == "__main__"` and is not a twin driver
    (those import vLLM's scheduler and run under the twin's interpreter, driven by their
    benchmark)."""
    text = path.read_text(encoding="utf-8")
    return "from twin.scheduler import" not in text and any(
        isinstance(node, ast.If) and "__main__" in ast.unparse(node.test)
        for node in ast.parse(text).body)


def needs_twin(path: Path) -> bool:
    """It starts the vLLM twin itself (imports the twin's launcher or its driver)."""
    text = path.read_text(encoding="utf-8")
    return "from twin.serve import" in text and "twin_python()" in text and (
        "TwinServer" in text or "DRIVER" in text)


def module_name(path: Path) -> str:
    return ".".join(path.relative_to(REPO).with_suffix("").parts)


SCRIPTS = sorted(path for path in BENCHMARKS.rglob("*.py") if runnable(path))
TWIN_SCRIPTS = [module_name(p) for p in SCRIPTS if needs_twin(p)]


def run_quick(module: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", module, "--quick"], cwd=REPO,
                          capture_output=True, text=True, timeout=QUICK_TIMEOUT_S, check=False,
                          env={**os.environ, "PYTHONDONTWRITEBYTECODE": "1"})


def test_every_benchmark_offers_quick() -> None:
    missing = [module_name(p) for p in SCRIPTS if "quick" not in p.read_text(encoding="utf-8")]
    assert SCRIPTS and missing == []


@pytest.mark.parametrize("module", [module_name(p) for p in SCRIPTS
                                    if module_name(p) not in TWIN_SCRIPTS])
def test_the_benchmark_runs_quick_and_prints_its_numbers(module: str) -> None:
    if module == "benchmarks.bench_fleet" and shutil.which("prometheus") is None:
        pytest.skip("bench_fleet needs the 'prometheus' binary (.ci/run installs it)")
    done = run_quick(module)
    assert done.returncode == 0, done.stderr[-2000:]
    assert any(c.isdigit() for c in done.stdout), done.stdout[-2000:]  # its numbers
