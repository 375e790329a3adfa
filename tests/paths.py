"""Where the repository's own test material lives (nothing here reads outside the checkout)."""

from __future__ import annotations

from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
FIXTURES = REPO / "tests" / "fixtures" / "metrics"  # real /metrics texts; INDEX.md says whence


def fixture_text(name: str) -> str:
    """A real scrape from tests/fixtures/metrics; a missing one is an error, never a skip."""
    return (FIXTURES / name).read_text(encoding="utf-8")
