"""Where the shared material lives relative to a checkout (repo/../shared)."""

from __future__ import annotations

from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
SHARED = REPO.parent / "shared"
FIXTURES = SHARED / "fixtures" / "metrics"


def fixture_text(name: str) -> str:
    path = FIXTURES / name
    if not path.exists():
        pytest.skip(f"shared fixture {path} not found (clone next to ../shared)")
    return path.read_text(encoding="utf-8")
