"""Shared pytest fixtures. Each group lives in its own module; this file only exposes them."""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest

from tests.faultserver import FaultServer


@pytest.fixture
async def fault_server() -> AsyncIterator[FaultServer]:
    """A started FaultServer (mode "ok", the vLLM 0.33.0 under-load fixture, version 0.33.0)."""
    async with FaultServer() as server:
        yield server
