"""An engine reading with only the fields a test sets, and the one engine of a server's reading."""

from __future__ import annotations

from kvtop.collect.reading import EngineReading, ServerReading


def reading(**values: object) -> EngineReading:
    r = EngineReading(model="m", engine="0")
    for name, value in values.items():
        setattr(r, name, value)
    return r


def only(reading: ServerReading) -> EngineReading:
    assert len(reading.engines) == 1, reading.engines
    return reading.engines[0]
