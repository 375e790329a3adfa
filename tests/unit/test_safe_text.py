"""The display boundary: nothing from outside reaches the terminal as a control sequence."""

from __future__ import annotations

import json

from hypothesis import given
from hypothesis import strategies as st
from rich.text import Text

from kvtop.safe_text import DISPLAY_MAX, display_text, plain, warn

OSC52 = "\x1b]52;c;ZXZpbA==\x07"


def test_escape_sequences_are_written_out_not_sent() -> None:
    shown = display_text(f"llama{OSC52}\x1b[2J")
    assert "\x1b" not in shown and "\x07" not in shown
    assert shown == "llama\\x1b]52;c;ZXZpbA==\\x07\\x1b[2J"


def test_newlines_and_bidi_overrides_cannot_spoof_rows() -> None:
    shown = display_text("m\nFAKE ROW up 100% LEAK\u202egnp.exe\r")
    assert "\n" not in shown and "\r" not in shown and "\u202e" not in shown
    assert shown == "m\\x0aFAKE ROW up 100% LEAK\\u202egnp.exe\\x0d"


def test_c1_controls_and_lone_surrogates_are_escaped() -> None:
    assert display_text("a\x9b2Jb\ud800") == "a\\x9b2Jb\\ud800"


def test_ordinary_text_passes_through_unchanged() -> None:
    for text in ("Llama-3.1-70B-Instruct", "模型 ²", "[bold]not markup[/bold]", "e0"):
        assert display_text(text) == text


def test_cut_to_a_length_with_an_ellipsis() -> None:
    assert display_text("abcdefgh", 5) == "abcd…"
    assert display_text("abc", 5) == "abc"
    assert display_text("abc", 0) == ""
    assert len(display_text("\x1b" * 10, 6)) == 6


def test_json_keeps_the_exact_value() -> None:
    raw = f"m{OSC52}\n"
    assert json.loads(json.dumps(raw)) == raw  # JSON output is exact and escaped by json


@given(st.text())
def test_no_control_or_format_character_survives(text: str) -> None:
    shown = display_text(text)
    for char in shown:
        code = ord(char)
        assert code >= 0x20 and not 0x7F <= code <= 0x9F
        assert not 0x202A <= code <= 0x202E and not 0x2066 <= code <= 0x2069
        assert not 0xD800 <= code <= 0xDFFF
    shown.encode("utf-8")  # always encodable


def test_tag_characters_and_invisible_fillers_are_written_out() -> None:
    hidden = "ok\U000e0041\U000e0042\u3164"  # "AB" in tag characters: invisible on screen
    assert display_text(hidden) == "ok\\U000e0041\\U000e0042\\u3164"


def test_a_huge_value_costs_no_more_than_its_shown_part() -> None:
    shown = display_text("\x1b" * 5_000_000)  # cut before the escapes are written
    assert len(shown) == DISPLAY_MAX and shown.endswith("…")
    assert display_text("m" * 2000) == "m" * (DISPLAY_MAX - 1) + "…"


def test_plain_is_rich_text_never_markup() -> None:
    text = plain("[/]oops[link='http://evil.example/x']x[/link]\x1b[2J", style="bold")
    assert isinstance(text, Text) and not text.spans
    assert text.plain == "[/]oops[link='http://evil.example/x']x[/link]\\x1b[2J"
    assert str(text.style) == "bold"


def test_warn_prints_one_safe_line(capsys) -> None:
    warn(f"kvtop: Prometheus said {OSC52}\nFAKE")
    err = capsys.readouterr().err
    assert err == "kvtop: Prometheus said \\x1b]52;c;ZXZpbA==\\x07\\x0aFAKE\n"
