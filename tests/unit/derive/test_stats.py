"""How full an engine's pool is, as every view and detector reads it: the server's own
figure, else blocks used over the pool, else unknown (never 0)."""

from __future__ import annotations

import pytest

from kvtop.derive.stats import EngineStats


def stats(**values: float | int | None) -> EngineStats:
    return EngineStats(model="m", engine="0", t=0.0, **values)  # type: ignore[arg-type]


@pytest.mark.parametrize(("values", "usage"), [
    ({"kv_usage": 0.25, "blocks_used": 90, "blocks_total": 100}, 0.25),  # the server's own
    ({"kv_usage": 0.0, "blocks_used": 90, "blocks_total": 100}, 0.0),  # 0 is a figure
    ({"blocks_used": 90, "blocks_total": 100}, 0.9),
    ({"blocks_used": 90, "blocks_total": 0}, None),  # no pool: no fraction
    ({"blocks_used": None, "blocks_total": 100}, None),
    ({}, None),
])
def test_the_pools_usage(values: dict[str, float | int | None], usage: float | None) -> None:
    assert stats(**values).usage == usage
