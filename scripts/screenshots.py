"""Copy the SVG snapshot renders into screenshots/ for the README: what the README shows is
what the snapshot tests check (tests/ui/snapshots/test_snapshots.py, fixed clock and data).

    .venv/bin/python -m pytest -n 0 tests/ui/snapshots/test_snapshots.py --snapshot-update
    .venv/bin/python scripts/screenshots.py
"""

from __future__ import annotations

import shutil
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
RENDERS = REPO / "tests" / "ui" / "__snapshots__" / "test_snapshots"
SHOTS = {  # README name -> snapshot test render
    "fleet-80x24.svg": "test_fleet_view[80x24].svg",
    "fleet-120x40.svg": "test_fleet_view[120x40].svg",
    "fleet-160x48.svg": "test_fleet_view[160x48].svg",
    "fleet-200x60.svg": "test_fleet_view[200x60].svg",
    "groups-160x48.svg": "test_groups_by_model.svg",
    "help-80x24.svg": "test_help_at_80x24.svg",
    "detail-160x48.svg": "test_detail_view[160x48].svg",
}


def main() -> None:
    for name, render in SHOTS.items():
        shutil.copyfile(RENDERS / render, REPO / "screenshots" / name)
        print(f"screenshots/{name} <- {render}")


if __name__ == "__main__":
    main()
