"""The display boundary: nothing from outside reaches the terminal as a control sequence."""

from __future__ import annotations

import io
import json
import re

import pytest
from hypothesis import given
from hypothesis import strategies as st
from rich.console import Console
from rich.text import Text

from kvtop.collect.target import Target
from kvtop.safe_text import (
    DISPLAY_MAX,
    Secret,
    cells,
    display_text,
    erase_line,
    file_text,
    json_bytes,
    json_text,
    mask,
    mask_bytes,
    out,
    pad,
    plain,
    rewrite_line,
    warn,
)

OSC52 = "\x1b]52;c;ZXZpbA==\x07"
TOKEN = "tok-4f2a9c"
SGR = re.compile(r"\x1b\[[0-9;]*m")


# -- secrets ---------------------------------------------------------------------------


def test_a_token_never_shows_itself() -> None:
    secret = Secret(TOKEN)
    assert repr(secret) == str(secret) == f"{secret}" == "Secret('***')"
    assert TOKEN not in repr(Target("http://h/metrics", token=secret))
    assert secret.reveal() == TOKEN


def test_tokens_are_equal_by_value_so_a_target_given_twice_is_one() -> None:
    assert Secret(TOKEN) == Secret(TOKEN) and Secret(TOKEN) != Secret("other")
    assert Secret(TOKEN) != TOKEN
    assert len({Secret(TOKEN), Secret(TOKEN), Secret("other")}) == 2
    one = Target.from_spec("h:1", token=Secret(TOKEN))
    assert len({one, Target.from_spec("h:1", token=Secret(TOKEN))}) == 1


@pytest.mark.parametrize(("text", "shown"), [
    (f"you sent {TOKEN}, and again {TOKEN}", "you sent ***, and again ***"),
    ("Authorization: Bearer abc.def", "Authorization: Bearer ***"),
    ('{"AUTHORIZATION":"BEARER abc"}', '{"AUTHORIZATION":"BEARER ***"}'),
    ("authorization: BeArEr abc", "authorization: BeArEr ***"),  # any case, as HTTP has it
    ("header was Bearer xyz; retry", "header was Bearer ***; retry"),
    ("a bearer token is needed", "a bearer token is needed"),  # kvtop's own hint stays
    ("nothing to hide", "nothing to hide"),
])
def test_an_echoed_token_or_bearer_header_is_masked(text: str, shown: str) -> None:
    assert mask(text, Secret(TOKEN)) == shown


def test_without_a_token_only_known_tokens_and_bearer_headers_are_masked() -> None:
    never_a_secret = "tok-never-made-a-secret"
    assert mask(f"{never_a_secret} Bearer abc", None) == f"{never_a_secret} Bearer ***"
    Secret(TOKEN)  # known from now on, wherever it shows
    assert mask(f"{TOKEN} Bearer abc", None) == "*** Bearer ***"
    assert mask("an empty token hides nothing", Secret("")) == "an empty token hides nothing"


def test_a_raw_answer_is_masked_before_it_is_read() -> None:
    body = bytearray(f'vllm:x{{model_name="{TOKEN}"}} 1\n'.encode())
    assert mask_bytes(body, Secret(TOKEN)) == bytearray(b'vllm:x{model_name="***"} 1\n')
    assert mask_bytes(bytearray(b"no token here"), Secret(TOKEN)) == b"no token here"
    assert mask_bytes(bytearray(b"kept as is"), None) == b"kept as is"
    assert mask_bytes(bytearray(b"kept as is"), Secret("")) == b"kept as is"


# -- a terminal --------------------------------------------------------------------------


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


def test_a_known_token_is_masked_on_a_terminal_even_across_the_cut() -> None:
    Secret(TOKEN)
    assert display_text(f"said {TOKEN}") == "said ***"
    cut = display_text("x" * 6 + TOKEN, 10)  # the cut falls inside the token
    assert cut == "xxxxxx***" and "tok-" not in cut


def test_a_short_token_is_not_masked_everywhere() -> None:
    Secret("abc")  # masking "abc" in every line would garble kvtop's own text
    assert display_text("abcdef") == "abcdef"
    assert mask("abcdef", Secret("abc")) == "***def"  # where its own client quotes it


def test_json_for_files_and_scripts_masks_known_tokens_in_every_form() -> None:
    quoted = 'tok-"quoted\\token'
    Secret(TOKEN), Secret(quoted)
    doc = {"error": f"you sent {TOKEN}", "other": f"and {quoted}", "model": f"m{OSC52}"}
    text = json_text(doc)
    assert TOKEN not in text and "quoted" not in text
    assert json.loads(text) == {"error": "you sent ***", "other": "and ***",
                                "model": f"m{OSC52}"}  # exact but for the tokens
    assert json.loads(json_bytes(doc)) == json.loads(text)
    assert file_text(f"report: {TOKEN}\n") == "report: ***\n"


@pytest.mark.parametrize(("text", "width"), [
    ("abc", 3), ("模型", 4), ("e\u0301", 1), ("", 0), ("Llama-3 模型 x", 14),
])
def test_width_is_counted_in_terminal_cells(text: str, width: int) -> None:
    assert cells(text) == width
    assert cells(pad(text, 16)) == 16 and pad(text, 16).startswith(text)
    assert pad(text, 16, right=True).endswith(text) and cells(pad(text, 16, right=True)) == 16
    assert pad(text, width - 1) == text  # never cut


def test_a_document_keeps_its_lines_and_loses_everything_else(capsys) -> None:
    out(f"kvtop: {OSC52}\nrow\r2\n")
    assert capsys.readouterr().out == "kvtop: \\x1b]52;c;ZXZpbA==\\x07\nrow\\x0d2\n"


def test_a_progress_line_carries_only_kvtops_own_controls() -> None:
    stream = io.StringIO()
    rewrite_line(stream, f"1 of 2 · {OSC52}\n")
    erase_line(stream)
    assert stream.getvalue() == "\r1 of 2 · \\x1b]52;c;ZXZpbA==\\x07\\x0a\x1b[K\r\x1b[K"


@given(st.text() | st.text(alphabet="[]/=\\\x1b\x9b\n\r'ab", max_size=60))
def test_no_string_reaches_a_terminal_as_control_or_markup(text: str) -> None:
    """What a Rich console writes for ``plain(text)`` is the safe text, character for
    character: no control byte of the string's and no markup tag read as one."""
    console = Console(file=io.StringIO(), force_terminal=True, color_system="truecolor",
                      width=100_000, soft_wrap=True)
    console.print(plain(text, style="bold"), end="")
    written = SGR.sub("", console.file.getvalue())  # type: ignore[attr-defined]
    assert written == display_text(text)
    assert not re.search("[\x00-\x1f\x7f-\x9f]", written)
    stream = io.StringIO()
    rewrite_line(stream, text)
    assert not re.search("[\x00-\x1f\x7f-\x9f]", stream.getvalue()[1:-3])
