"""The display boundary: nothing from outside reaches the terminal as a control sequence."""

from __future__ import annotations

import ast
import io
import json
import re
from dataclasses import dataclass
from enum import Enum

import orjson
import pytest
from hypothesis import given
from hypothesis import strategies as st
from rich.console import Console
from rich.text import Text

from kvtop import safe_text
from kvtop.collect.target import Target
from kvtop.safe_text import (
    DISPLAY_MAX,
    MIN_KNOWN_SECRET,
    Secret,
    cells,
    display_text,
    erase_line,
    file_text,
    json_bytes,
    json_text,
    kept_text,
    mask,
    mask_bytes,
    out,
    pad,
    plain,
    rewrite_line,
    terminal_lines,
    warn,
)
from tests.support.paths import REPO

OSC52 = "\x1b]52;c;ZXZpbA==\x07"
TOKEN = "tok-4f2a9c"
SGR = re.compile(r"\x1b\[[0-9;]*m")


@pytest.fixture(autouse=True)
def _no_token_known_yet(monkeypatch: pytest.MonkeyPatch) -> None:
    """Each test starts knowing no token: the boundary's set lives as long as the process, so
    a token an earlier test made known would pass a test of being remembered."""
    monkeypatch.setattr(safe_text, "_known", set())
    monkeypatch.setattr(safe_text, "_known_order", ())


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


def test_a_token_of_eight_characters_is_masked_everywhere_and_one_of_seven_by_its_client() -> None:
    at_limit, under = "k" * MIN_KNOWN_SECRET, "s" * (MIN_KNOWN_SECRET - 1)
    Secret(at_limit), Secret(under), Secret(at_limit)  # the same token twice is one
    assert safe_text._known_order == (at_limit,)
    assert display_text(f"a {at_limit} b {under}") == f"a *** b {under}"
    assert mask(f"a {under}", Secret(under)) == "a ***"


def test_a_token_inside_another_is_masked_last_so_no_part_of_the_longer_one_shows() -> None:
    inner, outer = "token-12345678", "a-token-12345678-b"  # inner sorts last by letters
    Secret(inner), Secret(outer)
    text = f"{outer} / {inner}"
    assert display_text(text) == mask(text) == kept_text(text) == file_text(text) == "*** / ***"
    assert json_text(text) == '"*** / ***"' and json_bytes(text) == b'"*** / ***"'


def test_every_secret_a_target_sends_is_masked_by_its_client_even_a_short_one() -> None:
    sent = [Secret("hdr-val"), Secret("tok")]  # a header's value and a token, both short
    assert mask("echo hdr-val, tok", sent) == "echo ***, ***"
    assert mask_bytes(bytearray(b"echo hdr-val, tok"), sent) == bytearray(b"echo ***, ***")
    assert mask_bytes(bytearray(b"echo tok"), Secret("tok")) == bytearray(b"echo ***")
    assert display_text("echo hdr-val, tok") == "echo hdr-val, tok"  # too short for every output


def test_distinct_tokens_spread_over_a_sets_buckets() -> None:
    assert len({hash(Secret(f"token-{i:04d}")) for i in range(50)}) == 50


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


def test_a_value_exactly_at_its_length_is_whole_and_a_character_more_is_cut() -> None:
    assert display_text("abcde", 5) == "abcde"
    assert display_text("abcdef", 5) == "abcd…"
    assert display_text("a", 1) == "a" and display_text("ab", 1) == "…"
    assert plain("abcdef", max_len=5).plain == "abcd…" and plain("abc").style == ""


class _Mode(str, Enum):
    GO = "GO"


def test_a_value_that_is_not_a_string_shows_as_its_text_and_a_string_as_its_characters() -> None:
    assert display_text(42) == "42" and display_text(None) == "None"
    assert display_text(_Mode.GO) == "GO"  # str() of it says "_Mode.GO"


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
    assert display_text("\u3164name") == "\\u3164name"  # a filler alone reads as printable


def test_a_huge_value_costs_no_more_than_its_shown_part() -> None:
    shown = display_text("\x1b" * 5_000_000)  # cut before the escapes are written
    assert len(shown) == DISPLAY_MAX and shown.endswith("…")
    assert display_text("m" * 2000) == "m" * (DISPLAY_MAX - 1) + "…"


def test_a_token_repeated_along_a_long_value_leaves_no_part_of_itself_at_the_cut() -> None:
    token = "tok-4f2a9c-secret-value"
    Secret(token)
    assert display_text(token * 3, 30) == "*********"
    assert display_text(f"{token} " * 100) == "*** " * 100  # once shown: "… *** tok-4f2a9c-secre"


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
    assert file_text(f"report: {TOKEN}\n{OSC52}") == "report: ***\n\\x1b]52;c;ZXZpbA==\\x07"


def test_json_masks_a_token_written_with_escapes_or_unicode_as_either_writer_writes_it() -> None:
    token = 'tök"en\\secret'  # a quote and a backslash JSON escapes, a letter it may
    Secret(token)
    doc = {"error": f"you sent {token}."}
    assert json_text(doc) == '{"error": "you sent ***."}'  # t\u00f6k\"en\\secret
    assert json_text(doc, ensure_ascii=False) == '{"error": "you sent ***."}'  # tök\"en\\secret
    assert json_bytes(doc) == b'{"error":"you sent ***."}'  # orjson: tök\"en\\secret


def test_json_is_written_with_the_options_asked_for() -> None:
    Secret(TOKEN)
    doc = {"b": 1, "a": [TOKEN]}
    assert json_text(doc, indent=1, sort_keys=True) == '{\n "a": [\n  "***"\n ],\n "b": 1\n}'
    assert json_bytes(doc) == b'{"b":1,"a":["***"]}'
    assert json_bytes(doc, orjson.OPT_APPEND_NEWLINE) == b'{"b":1,"a":["***"]}\n'


def test_a_servers_text_is_kept_exactly_but_for_known_tokens() -> None:
    body = f'vllm:x{{model_name="m{OSC52}"}} 1\n'
    assert kept_text(body) == body
    Secret(TOKEN)
    assert kept_text(body + TOKEN) == body + "***"


@pytest.mark.parametrize(("text", "width"), [
    ("abc", 3), ("模型", 4), ("e\u0301", 1), ("", 0), ("Llama-3 模型 x", 14),
    ("a\x07b", 2),  # a control character takes no cell, as Rich counts it
])
def test_width_is_counted_in_terminal_cells(text: str, width: int) -> None:
    assert cells(text) == width
    assert cells(pad(text, 16)) == 16 and pad(text, 16).startswith(text)
    assert pad(text, 16, right=True).endswith(text) and cells(pad(text, 16, right=True)) == 16
    assert pad(text, width - 1) == text  # never cut


def test_a_document_keeps_its_lines_and_loses_everything_else(capsys) -> None:
    out(f"kvtop: {OSC52}\nrow\r2\n")
    assert capsys.readouterr().out == "kvtop: \\x1b]52;c;ZXZpbA==\\x07\nrow\\x0d2\n"


def test_a_line_of_a_document_or_a_progress_line_is_cut_at_16384_characters() -> None:
    line = "r" * 16_384  # docs/security.md: no terminal is wider
    cut = "r" * 16_383 + "…"
    assert terminal_lines(f"{line}\n{line}r") == file_text(f"{line}\n{line}r") == f"{line}\n{cut}"
    stream = io.StringIO()
    rewrite_line(stream, line)
    rewrite_line(stream, line + "r")
    assert stream.getvalue() == f"\r{line}\x1b[K\r{cut}\x1b[K"


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


# -- every write goes through here ---------------------------------------------------------
#
# Read from the code: each print, write (a stream, a file, a path), notify and widget
# content in kvtop must be given text made by this module (display_text, plain,
# terminal_lines, file_text, kept_text, json_text, json_bytes, or config.quoted, which is
# display_text), a literal, a number formatted as one, or a local name only ever bound to
# one of those. Anything else is a write that bypasses the boundary: it fails here until it
# goes through it, or is reviewed into the list below with the reason it is safe.

PACKAGE = REPO / "kvtop"
BOUNDARY = "kvtop.safe_text"
# What the boundary offers: text made safe for a terminal (or a file people read), or JSON
# with every known token masked.
SAFE_CALLS = frozenset({"display_text", "plain", "terminal_lines", "file_text", "json_text",
                        "json_bytes", "kept_text", "quoted"})
WRITES = frozenset({"write", "writelines", "write_text", "write_bytes"})
NUMERIC_SPEC = set("bcdeEfFgGnoxX%")
WIDGET_CONTENT = frozenset({"update"})  # Static.update in kvtop/ui


@dataclass(frozen=True)
class Write:
    module: str
    function: str
    line: int
    what: str


class Walker(ast.NodeVisitor):
    def __init__(self, module: str) -> None:
        self.module = module
        self.stack: list[ast.AST] = []
        self.names: list[str] = []
        self.found: list[Write] = []

    # scopes
    def _scope(self, node: ast.AST, name: str) -> None:
        self.stack.append(node)
        self.names.append(name)
        self.generic_visit(node)
        self.stack.pop()
        self.names.pop()

    def visit_FunctionDef(self, node: ast.FunctionDef) -> None:
        self._scope(node, node.name)

    def visit_AsyncFunctionDef(self, node: ast.AsyncFunctionDef) -> None:
        self._scope(node, node.name)

    def visit_ClassDef(self, node: ast.ClassDef) -> None:
        self._scope(node, node.name)

    def visit_Call(self, node: ast.Call) -> None:
        func = node.func
        name = func.id if isinstance(func, ast.Name) else (
            func.attr if isinstance(func, ast.Attribute) else "")
        args: list[ast.expr] = []
        what = ""
        if isinstance(func, ast.Name) and name == "print":
            args, what = list(node.args), "print"
        elif isinstance(func, ast.Attribute) and name in WRITES:
            args, what = list(node.args[-1:]), f".{name}"
        elif isinstance(func, ast.Attribute) and name == "notify":
            args, what = list(node.args[:1]), ".notify"
            if not any(k.arg == "markup" and isinstance(k.value, ast.Constant)
                       and k.value.value is False for k in node.keywords):
                self._report(node, ".notify without markup=False")
        elif (self.module.startswith("kvtop.ui") and isinstance(func, ast.Attribute)
              and name in WIDGET_CONTENT and _widget(func.value)):
            args, what = list(node.args[:1]), ".update (widget content)"
        elif name == "dump" and isinstance(func, ast.Attribute):
            self._report(node, "json.dump (use json_text)")
        for arg in args:
            if not self.safe(arg):
                self._report(node, what)
                break
        self.generic_visit(node)

    def _report(self, node: ast.AST, what: str) -> None:
        self.found.append(Write(self.module, ".".join(self.names) or "<module>",
                                getattr(node, "lineno", 0), what))

    # what counts as safe
    def safe(self, node: ast.expr, depth: int = 0) -> bool:
        if depth > 8:
            return False
        if isinstance(node, ast.Constant):
            return True
        if isinstance(node, ast.JoinedStr):
            return all(self._safe_part(v, depth) for v in node.values)
        if isinstance(node, ast.BinOp) and isinstance(node.op, ast.Add):
            return self.safe(node.left, depth + 1) and self.safe(node.right, depth + 1)
        if isinstance(node, ast.IfExp):
            return self.safe(node.body, depth + 1) and self.safe(node.orelse, depth + 1)
        if isinstance(node, ast.Call):
            func = node.func
            called = func.id if isinstance(func, ast.Name) else (
                func.attr if isinstance(func, ast.Attribute) else "")
            return called in SAFE_CALLS
        if isinstance(node, ast.Name):
            return self._safe_name(node.id, depth)
        return False

    def _safe_part(self, part: ast.expr, depth: int) -> bool:
        if isinstance(part, ast.Constant):
            return True
        assert isinstance(part, ast.FormattedValue)
        spec = part.format_spec
        if isinstance(spec, ast.JoinedStr) and spec.values and isinstance(
                spec.values[-1], ast.Constant) and str(spec.values[-1].value)[-1:] in NUMERIC_SPEC:
            return True
        value = part.value
        if isinstance(value, ast.Call) and isinstance(value.func, ast.Name) and \
                value.func.id == "len":
            return True
        return self.safe(value, depth + 1)

    def _safe_name(self, name: str, depth: int) -> bool:
        scope = next((s for s in reversed(self.stack)
                      if isinstance(s, (ast.FunctionDef, ast.AsyncFunctionDef))), None)
        if scope is None:
            return False
        values = [n.value for n in ast.walk(scope) if isinstance(n, ast.Assign)
                  and any(isinstance(t, ast.Name) and t.id == name for t in n.targets)]
        values += [n.value for n in ast.walk(scope) if isinstance(n, ast.AnnAssign)
                   and isinstance(n.target, ast.Name) and n.target.id == name and n.value]
        return bool(values) and all(self.safe(v, depth + 1) for v in values)


def _widget(receiver: ast.expr) -> bool:
    """``self.update(...)`` or ``self.query_one(...).update(...)``: a widget's content."""
    if isinstance(receiver, ast.Name):
        return receiver.id == "self"
    return isinstance(receiver, ast.Call) and isinstance(receiver.func, ast.Attribute) and \
        receiver.func.attr == "query_one"


# (module, function, what) -> why it is safe without a boundary call at the write.
REVIEWED = {
    ("kvtop.baseline.store", "save", ".write"):
        "Baseline.dumps() is json_text (known tokens masked); JSON escapes every control",
    ("kvtop.commands.baseline", "run_save", ".write"): "Baseline.dumps(): json_text, as above",
    ("kvtop.commands.rules", "run", ".write"):
        "kvtop's own YAML; the selector in it is the operator's and written as a JSON string",
    ("kvtop.commands.completion", "run", ".write"): "kvtop's own shell completion script",
    ("kvtop.manpage", "main", ".write"): "kvtop's own man page",
    ("kvtop.crash", "write_crash_report", ".write"):
        "kvtop's version and Python's (the traceback itself goes through file_text)",
    ("kvtop.commands.check", "_watch.on_scrape", ".write"):
        "RecordingWriter.write: a recording's lines are json_text (store/writer.py)",
    ("kvtop.commands.record", "record.on_scrape", ".write"): "RecordingWriter.write, as above",
    ("kvtop.rehearse.watch", "Watcher._on_scrape", ".write"): "RecordingWriter.write, as above",
    ("kvtop.ui.app", "KvtopApp.on_scrape", ".write"): "RecordingWriter.write, as above",
    ("kvtop.ui.recording_tap", "RecordingTap.write", ".write"): "RecordingWriter.write, as above",
    ("kvtop.ui.widgets.message_line", "MessageLine.show", ".update (widget content)"):
        "message_text: the notify messages (which the walk checks) as plain() parts",
    ("kvtop.report.snapshot_files", "write_snapshot", ".write_text"):
        "screen.svg: what the screen showed (already safe), made XML-safe by xml_safe",
    ("kvtop.sim.openai_api", "OpenAIRoutes._stream", ".write"):
        "kvtop sim's own HTTP answers to a client, not a terminal or a file",
    ("kvtop.ui.replay", "ReplayBar.show", ".update (widget content)"):
        "Text.assemble of plain() pieces and kvtop's numbers",
    ("kvtop.ui.screens.detail", "DetailScreen._fill", ".update (widget content)"):
        "describe(): every outside string through display_text (test_boundary_sweep)",
    ("kvtop.ui.widgets.engine_panel", "EnginePanel._draw", ".update (widget content)"):
        "view.engine lines: names through display_text in kvtop/view (test_app_hostile)",
    ("kvtop.ui.widgets.cache_pane", "CachePane.show", ".update (widget content)"):
        "view.cache lines: reasons, labels and a channel's error through display_text there",
    ("kvtop.ui.widgets.gpu_pane", "GpuPane._set", ".update (widget content)"):
        "view.gpus.pane_lines: every outside string through display_text there",
    ("kvtop.ui.widgets.panes", "EngineHead.show", ".update (widget content)"):
        "view lines whose outside strings went through display_text in kvtop/view",
    ("kvtop.ui.widgets.summary", "SummaryBar.show", ".update (widget content)"):
        "the summary's pieces: kvtop's numbers, and the group label made by view.groups "
        "(display_text)",
}


def _bypasses(modules: dict[str, str]) -> list[Write]:
    found = []
    for module, source in modules.items():
        if module == BOUNDARY:
            continue
        walker = Walker(module)
        walker.visit(ast.parse(source))
        found += walker.found
    return found


def _kvtop_sources() -> dict[str, str]:
    sources = {}
    for path in sorted(PACKAGE.rglob("*.py")):
        parts = path.relative_to(REPO).with_suffix("").parts
        module = ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
        sources[module] = path.read_text(encoding="utf-8")
    return sources


def test_every_write_to_a_terminal_or_a_file_goes_through_the_boundary() -> None:
    found = {(w.module, w.function, w.what): w for w in _bypasses(_kvtop_sources())}
    unreviewed = [f"{w.module}:{w.line} {w.function}: {w.what}" for key, w in found.items()
                  if key not in REVIEWED]
    assert unreviewed == []
    assert sorted(set(REVIEWED) - set(found)) == []  # the list can only shrink


@pytest.mark.parametrize(("source", "bypass"), [
    ("def f(label):\n    self.notify(f'groups {label}', markup=False)\n", ".notify"),
    ("def f(label):\n    self.notify(display_text(label))\n", ".notify without markup=False"),
    ("def f(doc):\n    print(doc['model'])\n", "print"),
    ("def f(doc):\n    text = render(doc)\n    sys.stdout.write(text)\n", ".write"),
    ("def f(p, d):\n    p.write_text(json.dumps(d))\n", ".write_text"),
    ("def f(d, out):\n    json.dump(d, out)\n", "json.dump (use json_text)"),
    ("def f(s):\n    os.write(1, s)\n", ".write"),
])
def test_the_walk_finds_a_write_that_bypasses_the_boundary(source: str, bypass: str) -> None:
    assert [w.what for w in _bypasses({"kvtop.x": source})] == [bypass]


@pytest.mark.parametrize("source", [
    "def f(label):\n    self.notify(display_text(f'groups {label}'), markup=False)\n",
    "def f(doc):\n    text = display_text(doc['m'])\n"
    "    print(f'{text} {len(doc)} {doc[0]:.1f}')\n",
    "def f(p, d):\n    p.write_bytes(json_bytes(d) + b'\\n')\n",
    "def f(n):\n    print('a' + display_text(n) if n else 'b')\n",
])
def test_the_walk_passes_text_made_by_the_boundary(source: str) -> None:
    assert _bypasses({"kvtop.x": source}) == []
