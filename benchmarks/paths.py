"""Where the benchmarks find the repository's real scrapes (tests/fixtures, INDEX.md says
whence each came): read as data, so no benchmark imports the tests."""

from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
METRICS = REPO / "tests" / "fixtures" / "metrics"
GPU_METRICS = REPO / "tests" / "fixtures" / "gpu"
