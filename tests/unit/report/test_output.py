"""A document is JSON for a script and text for a person at a terminal."""

from __future__ import annotations

import json
from typing import Any

import pytest

from kvtop.report.output import emit


def test_json_for_a_script_text_for_a_person(capsys: pytest.CaptureFixture[str]) -> None:
    shown: list[dict[str, Any]] = []
    document = {"kvtop_snapshot": 1, "x": [1, 2]}
    emit(document, None, shown.append)  # stdout is a pipe here: JSON
    out = capsys.readouterr().out
    assert out == json.dumps(document, indent=2) + "\n"  # indented by two, one line after
    emit(document, True, shown.append)
    assert json.loads(capsys.readouterr().out) == document
    emit(document, False, shown.append)
    assert capsys.readouterr().out == "" and shown == [document]
