"""What kvtop says after a bug, in this process (tests/unit/test_cli.py crashes the real
command in a subprocess)."""

from __future__ import annotations

import sys
import tempfile
from pathlib import Path

import pytest

from kvtop import __version__
from kvtop.crash import write_crash_report


def raised(error: BaseException) -> BaseException:
    try:
        raise error
    except BaseException as caught:
        return caught


@pytest.fixture
def reports_in(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    return tmp_path


def test_one_line_names_the_error_and_its_report(reports_in: Path) -> None:
    secret_local = "Bearer sk-never-in-a-report"  # noqa: F841 - a frame's local
    line = write_crash_report(raised(ValueError("boom")))
    (report,) = reports_in.glob("kvtop-crash-*.txt")
    assert line == f"ValueError: boom (traceback in {report})"
    header, *rest = report.read_text(encoding="utf-8").splitlines()
    assert header == f"kvtop {__version__}, Python {sys.version.split()[0]}"
    assert rest[0] == "Traceback (most recent call last):"
    assert rest[-1] == "ValueError: boom"
    assert "sk-never-in-a-report" not in report.read_text(encoding="utf-8")


def test_what_the_error_quotes_is_made_safe_on_the_line_and_in_the_file(
        reports_in: Path) -> None:
    line = write_crash_report(raised(RuntimeError("\x1b[2Jwiped " + "x" * 300)))
    summary = line.split(" (traceback in ")[0]
    assert "\x1b" not in line and len(summary) == 200 and summary.endswith("…")
    assert summary.startswith("RuntimeError: ")
    (report,) = reports_in.glob("kvtop-crash-*.txt")
    text = report.read_text(encoding="utf-8")
    assert "\x1b" not in text and "x" * 300 in text


def test_a_report_that_cannot_be_written_says_why(tmp_path: Path,
                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path / "gone"))
    assert write_crash_report(raised(KeyError("k"))) == (
        "KeyError: 'k' (the traceback could not be written: No such file or directory)")
