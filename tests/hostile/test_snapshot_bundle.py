"""The `s` snapshot bundle with labels and screens from outside: one file per target, a long
label never fails the snapshot, and screen.svg always parses as XML."""

from __future__ import annotations

import json
import xml.etree.ElementTree as ET
from datetime import datetime, timezone
from pathlib import Path

from kvtop.report.snapshot_files import MAX_NAME, SnapshotFiles, body_names, write_snapshot
from tests.hostile.hostile import OSC52

TAKEN = datetime(2026, 1, 1, tzinfo=timezone.utc)
SVG = ('<svg xmlns="http://www.w3.org/2000/svg"><text>{}</text></svg>')


def _write(tmp_path: Path, bodies: list[tuple[str, str]], screen: str = "ok") -> Path:
    files = SnapshotFiles(TAKEN, {"kvtop_snapshot": 1}, bodies, SVG.format(screen))
    return write_snapshot(tmp_path, files)


def test_labels_that_make_the_same_file_name_keep_every_body(tmp_path: Path) -> None:
    labels = ["gpu-1:8000/a/b", "gpu-1:8000/a_b", "GPU-1_8000_A_B", "gpu-1:8000/a/b", "..", ""]
    folder = _write(tmp_path, [(label, f"body {i}\n") for i, label in enumerate(labels)])
    written = sorted((folder / "metrics").iterdir())
    assert len(written) == len(labels)
    assert sorted(p.read_text() for p in written) == [f"body {i}\n" for i in range(len(labels))]
    assert len({p.name.lower() for p in written}) == len(labels)  # case-blind disks too


def test_a_very_long_label_gets_a_short_name(tmp_path: Path) -> None:
    long_label = "h:1/" + "a" * 5000
    folder = _write(tmp_path, [(long_label, "x\n"), (long_label + "b", "y\n"), ("ok:1", "z\n")])
    names = sorted(p.name for p in (folder / "metrics").iterdir())
    assert len(names) == 3 and all(len(n) <= MAX_NAME + 8 for n in names)
    assert json.loads((folder / f"{folder.name}.json").read_text()) == {"kvtop_snapshot": 1}


def test_body_names_are_unique_even_against_suffixed_names() -> None:
    assert body_names(["a", "a", "a-2"]) == ["a.txt", "a-2.txt", "a-2-2.txt"]


def test_screen_svg_is_valid_xml_whatever_was_on_screen(tmp_path: Path) -> None:
    hostile = f"m{OSC52}\x00\x0b\ufffe\ud800&<>"
    folder = _write(tmp_path, [("h:1", "a lone surrogate \ud800 in a recorded body\n")],
                    screen=hostile.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;"))
    root = ET.parse(folder / "screen.svg").getroot()
    assert root.tag.endswith("svg")
    assert "m\ufffd]52" in "".join(root.itertext())
    assert (folder / "metrics" / "h_1.txt").read_text().startswith("a lone surrogate")
