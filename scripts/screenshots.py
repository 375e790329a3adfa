"""The README's and the tour's pictures.

The README's are the SVG snapshot renders: what it shows is what the snapshot tests check
(tests/ui/snapshots/test_snapshots.py, fixed clock and data)::

    .venv/bin/python -m pytest -n 0 tests/ui/snapshots/test_snapshots.py --snapshot-update
    .venv/bin/python scripts/screenshots.py

The tour's (docs/tour.md) are the real demo at 80x24, driven through the tour's own steps
(tests/support/tour.py; the tmux tier replays the same steps on the real command). The
demo runs in real time, so this takes the tour's two minutes or so::

    .venv/bin/python scripts/screenshots.py --tour
"""

from __future__ import annotations

import argparse
import asyncio
import html
import re
import shutil
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))  # tests.support.tour, run as a script from anywhere

RENDERS = REPO / "tests" / "ui" / "snapshots" / "__snapshots__" / "test_snapshots"
SHOTS = {  # README name -> snapshot test render
    "fleet-80x24.svg": "test_fleet_view[80x24].svg",
    "fleet-80x24-no-nvml.svg": "test_fleet_view_without_nvml[80x24].svg",
    "fleet-120x40.svg": "test_fleet_view[120x40].svg",
    "fleet-160x48.svg": "test_fleet_view[160x48].svg",
    "fleet-200x60.svg": "test_fleet_view[200x60].svg",
    "groups-160x48.svg": "test_groups_by_model.svg",
    "help-80x24.svg": "test_help_at_80x24.svg",
    "detail-160x48.svg": "test_detail_view[160x48].svg",
}
TOUR_SIZE = (80, 24)


def copy_renders() -> None:
    for name, render in SHOTS.items():
        shutil.copyfile(RENDERS / render, REPO / "screenshots" / name)
        print(f"screenshots/{name} <- {render}")


def screen_text(svg: str) -> str:
    """The characters of a Textual SVG screenshot, for a step that looks for text."""
    return html.unescape(re.sub(r"<[^>]+>", "", svg)).replace("\xa0", " ")


async def tour_shots() -> None:
    from kvtop.sim.demo import demo_fleet
    from kvtop.ui.app import AppConfig, KvtopApp
    from tests.support.tour import tour_steps

    with tempfile.TemporaryDirectory() as snapshots, demo_fleet() as targets:
        app = KvtopApp(AppConfig(targets=targets, demo=True, snapshot_dir=Path(snapshots)))
        async with app.run_test(size=TOUR_SIZE) as pilot:
            for step in tour_steps():
                if step.action in ("press", "type"):
                    await pilot.press(*step.pilot_keys())
                    await pilot.pause(0.3)
                elif step.action in ("see", "wait"):
                    deadline = time.monotonic() + step.deadline_s * 2  # headless is slower
                    while step.text not in screen_text(app.export_screenshot()):
                        if time.monotonic() > deadline:
                            raise SystemExit(f"docs/tour.md:{step.line}: never saw "
                                             f"{step.text!r}")
                        await pilot.pause(0.5)
                elif step.action == "pause":
                    await pilot.pause(step.seconds)
                elif step.action == "shot":
                    path = REPO / "screenshots" / f"{step.argument}.svg"
                    path.write_text(app.export_screenshot(title="kvtop --demo"),
                                    encoding="utf-8")
                    print(f"screenshots/{path.name} <- docs/tour.md:{step.line}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tour", action="store_true", help="draw the tour's pictures")
    if parser.parse_args().tour:
        asyncio.run(tour_shots())
    else:
        copy_renders()


if __name__ == "__main__":
    main()
