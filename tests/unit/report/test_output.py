"""A document is JSON for a script and text for a person at a terminal."""

from __future__ import annotations

import json
from typing import Any

import pytest

from kvtop.report.output import emit
from kvtop.safe_text import Secret


def test_json_for_a_script_text_for_a_person(capsys: pytest.CaptureFixture[str]) -> None:
    shown: list[dict[str, Any]] = []
    document = {"kvtop_snapshot": 1, "x": [1, 2]}
    emit(document, None, lambda doc: "")  # stdout is a pipe here: JSON
    out = capsys.readouterr().out
    assert out == json.dumps(document, indent=2) + "\n"  # indented by two, one line after
    emit(document, True, lambda doc: "")
    assert json.loads(capsys.readouterr().out) == document
    emit(document, False, lambda doc: shown.append(doc) or "text\n")
    assert capsys.readouterr().out == "text\n" and shown == [document]


def test_text_is_made_safe_and_json_masks_known_tokens(
        capsys: pytest.CaptureFixture[str]) -> None:
    token = Secret("tok-output-0123456789")
    document = {"error": f"you sent {token.reveal()}", "model": "m\x1b]52;c;eA==\x07"}
    emit(document, True, lambda doc: "")
    assert json.loads(capsys.readouterr().out) == {"error": "you sent ***",
                                                   "model": "m\x1b]52;c;eA==\x07"}
    emit(document, False, lambda doc: f"{doc['model']}\n{doc['error']}\n")
    assert capsys.readouterr().out == "m\\x1b]52;c;eA==\\x07\nyou sent ***\n"
