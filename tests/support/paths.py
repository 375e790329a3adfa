"""Where the repository's own test material lives (nothing here reads outside the checkout)."""

from __future__ import annotations

from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
FIXTURES = REPO / "tests" / "fixtures" / "metrics"  # real /metrics texts; INDEX.md says whence


def fixture_text(name: str) -> str:
    """A real scrape from tests/fixtures/metrics; a missing one is an error, never a skip."""
    return (FIXTURES / name).read_text(encoding="utf-8")
# The vLLM 0.33 twin's scrapes, idle and under load: the bodies most command tests serve
IDLE, LOAD = "vllm-0.33.0-v1-twin-idle.txt", "vllm-0.33.0-v1-twin-under-load.txt"
