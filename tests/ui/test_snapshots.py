"""SVG snapshots of the fleet and detail views at 80x24 and 160x48 (fixed clock and data)."""

from __future__ import annotations

import pytest

from tests.ui.scenario import static_app

SIZES = [(80, 24), (160, 48)]


async def _settle(pilot) -> None:
    await pilot.pause(0.3)  # the GPU read runs in a thread


@pytest.mark.parametrize("size", SIZES, ids=lambda s: f"{s[0]}x{s[1]}")
def test_fleet_view(snap_compare, size: tuple[int, int]) -> None:
    assert snap_compare(static_app(), terminal_size=size, run_before=_settle)


@pytest.mark.parametrize("size", SIZES, ids=lambda s: f"{s[0]}x{s[1]}")
def test_detail_view(snap_compare, size: tuple[int, int]) -> None:
    async def open_detail(pilot) -> None:
        await _settle(pilot)
        await pilot.press("j", "j", "enter")  # the loaded llama-70b-a, third by name
        await pilot.pause(0.3)

    assert snap_compare(static_app(), terminal_size=size, run_before=open_detail)


def test_gpu_unavailable_and_filtered(snap_compare) -> None:
    from tests.fakes.fake_nvml import FakeGpuReader

    app = static_app(gpu_reader=FakeGpuReader(unavailable="NVML Shared Library Not Found"))

    async def filter_llama(pilot) -> None:
        await _settle(pilot)
        await pilot.press("slash", *"llama", "enter")

    assert snap_compare(app, terminal_size=(120, 30), run_before=filter_llama)
