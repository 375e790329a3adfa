"""The command line as a person scripting kvtop meets it, through the real command (a
subprocess): closed pipes, typos and nonsense in the config and options, non-HTTP targets,
token files that are not files, help for every command, completions, the man page, the
snapshot table, check's progress on a terminal and its text/JSON, and internal errors."""

from __future__ import annotations

import asyncio
import fcntl
import json
import os
import pty
import re
import select
import shutil
import struct
import subprocess
import sys
import termios
import time
import zipfile
from pathlib import Path
from typing import Any

import pytest

from kvtop.cli import SUMMARIES, main
from kvtop.collect.target import Scrape, Target
from kvtop.exits import APP, EXIT_USAGE, SHARED, exit_codes
from kvtop.manpage import render, roff
from kvtop.store.recording import RecordingWriter
from tests.fakes.faultserver import FaultServer, closed_port, fixture
from tests.support.paths import REPO

LOAD, IDLE = "vllm-0.33.0-v1-twin-under-load.txt", "vllm-0.33.0-v1-twin-idle.txt"
LEAKING = "vllm-0.33.0-v1-twin-leaking-idle.txt"
KVTOP = [sys.executable, "-m", "kvtop"]


def kvtop(*args: str, env: dict[str, str] | None = None,
          timeout: float = 60) -> subprocess.CompletedProcess[str]:
    return subprocess.run([*KVTOP, *args], capture_output=True, text=True, timeout=timeout,
                          env={**os.environ, **(env or {})}, stdin=subprocess.DEVNULL)


def in_process(capsys: pytest.CaptureFixture[str], *args: str) -> subprocess.CompletedProcess[str]:
    """``kvtop ARGS`` through the same main() in this process (for the many small cases; the
    process boundary itself is covered by the subprocess tests)."""
    code = main(list(args))
    out, err = capsys.readouterr()
    return subprocess.CompletedProcess(["kvtop", *args], code, out, err)


def usage_error(done: subprocess.CompletedProcess[str]) -> str:
    """The one-line message of a usage error (exit 2, no traceback)."""
    assert done.returncode == 2, (done.returncode, done.stderr)
    assert "Traceback" not in done.stderr and done.stdout == ""
    return done.stderr


def recording(path: Path, bodies: list[str], t0: float = 1_800_000_000.0) -> Path:
    target = Target.from_spec("127.0.0.1:8000")
    with RecordingWriter(path, interval_s=10.0, targets=[target]) as writer:
        for i, body in enumerate(bodies):
            writer.write(Scrape(target, t0 + 10 * i, body=body))
    return path


# -- a closed pipe -------------------------------------------------------------------------


def closed_reader(args: list[str], timeout: float = 60) -> subprocess.CompletedProcess[bytes]:
    """Run kvtop with stdout a pipe whose reader is gone before kvtop writes a byte (what
    `| head -1` becomes once head has its line)."""
    read, write = os.pipe()
    os.close(read)
    try:
        return subprocess.run([*KVTOP, *args], stdout=write, stderr=subprocess.PIPE,
                              stdin=subprocess.DEVNULL, timeout=timeout)
    finally:
        os.close(write)


async def test_every_command_ends_quietly_when_its_reader_goes_away(tmp_path: Path) -> None:
    replay = recording(tmp_path / "r.jsonl", [fixture(LOAD).decode()] * 3)
    async with FaultServer(bodies=[fixture(LOAD), fixture(IDLE)]) as server:
        commands = [
            ["--help"],
            ["snapshot", server.url(), "--json", "--no-gpu", "--interval", "0.2"],
            ["snapshot", server.url(), "--table", "--no-gpu", "--samples", "1"],
            ["check", "--replay", str(replay), "--json"],
            ["check", "--replay", str(replay), "--text"],
            ["rules"],
            ["completion", "bash"],
            ["baseline", "save", str(tmp_path / "b.json"), "--from", str(replay), "--json"],
            ["baseline", "list"],
            ["compare", str(tmp_path / "b.json"), "--replay", str(replay), "--json"],
            ["sim", "--port", "0"],  # prints its URL, then would serve until Ctrl-C
        ]
        for args in commands:
            done = await asyncio.to_thread(closed_reader, args)
            err = done.stderr.decode()
            assert done.returncode == 141, (args, done.returncode, err)
            assert "Traceback" not in err and "BrokenPipe" not in err, (args, err)


# -- the config file -----------------------------------------------------------------------


@pytest.mark.parametrize(("text", "key", "suggestion"), [
    ('[[target]]\nurl = "gpu-1:8000"\n', "target", "targets"),
    ("intervall = 2\n", "intervall", "interval"),
    ('[[targets]]\nurl = "gpu-1:8000"\nnmae = "gpu-1"\n', "nmae", "name"),
    ('[[targets]]\nurll = "gpu-1:8000"\n', "urll", "url"),
    ("[thresholds]\nidle_leek_s = 60\n", "idle_leek_s", "idle_leak_s"),
    ('[prometheus]\nurl = "prom:9090"\nselecter = "{}"\n', "selecter", "selector"),
])
def test_unknown_config_keys_are_named_with_the_closest_known_one(
        tmp_path: Path, capsys: pytest.CaptureFixture[str], text: str, key: str,
        suggestion: str) -> None:
    config = tmp_path / "kvtop.toml"
    config.write_text(text)
    err = usage_error(in_process(capsys, "snapshot", "--config", str(config), "--no-gpu"))
    assert f"unknown key '{key}'" in err and f"did you mean '{suggestion}'?" in err, err
    assert str(config) in err


@pytest.mark.parametrize(("text", "says"), [
    ('interval = "1"\n', "interval (seconds) must be a finite number > 0"),
    ("interval = nan\n", "interval (seconds) must be a finite number > 0"),
    ("interval = -1\n", "interval (seconds) must be a finite number > 0"),
    ("interval = true\n", "interval (seconds) must be a finite number > 0"),
    ("targets = 5\n", "targets must be an array of tables"),
    ('targets = ["gpu-1:8000"]\n', "each [[targets]] must be a table"),
    ('[[targets]]\nurl = 8000\n', "url must be a string"),
    ('[[targets]]\nurl = "gpu-1:8000"\nname = 5\n', "name must be a string"),
    ('[[targets]]\nurl = "gpu-1:8000"\ngroup = ["a"]\n', "group must be a string"),
    ('[[targets]]\nurl = "ftp://gpu-1"\n', "not an http:// or https:// URL"),
    ("thresholds = 3\n", "[thresholds] must be a table"),
    ("[thresholds]\nbucket_s = 0\n", "bucket_s must be a finite number > 0"),
    ("[thresholds]\nidle_leak_s = nan\n", "idle_leak_s must be a finite number >= 0"),
    ("[thresholds]\nleak_hold_s = -5\n", "leak_hold_s must be a finite number >= 0"),
    ("[thresholds]\nwindow_s = inf\n", "window_s must be a finite number > 0"),
    ("[thresholds]\nidle_min_scrapes = 2.5\n", "idle_min_scrapes must be a whole number"),
    ('[thresholds]\nz = "2"\n', "z must be a finite number >= 0"),
    ("[thresholds]\npinned_frac = 1.5\n", "pinned_frac is a fraction: at most 1"),
    ('[prometheus]\nurl = "prom:9090"\nbackfill_step = "15s"\n', "backfill_step (seconds)"),
    ("[prometheus]\nurl = 9090\n", "url must be a string"),
    ("prometheus = 1\n", "[prometheus] must be a table"),
    ("interval = \n", "Invalid value"),  # not TOML at all
])
def test_wrong_types_and_impossible_values_in_the_config_are_usage_errors(
        tmp_path: Path, capsys: pytest.CaptureFixture[str], text: str, says: str) -> None:
    config = tmp_path / "kvtop.toml"
    config.write_text(text)
    for command in (["snapshot", "--no-gpu"], ["check", "--duration", "1s"], ["rules"]):
        err = usage_error(in_process(capsys, *command, "--config", str(config)))
        assert says in err, err


def test_config_errors_through_the_real_command(tmp_path: Path) -> None:
    config = tmp_path / "kvtop.toml"
    config.write_text('[[target]]\nurl = "gpu-1:8000"\n[thresholds]\nbucket_s = 0\n')
    err = usage_error(kvtop("check", "--config", str(config)))
    assert err == (f"kvtop: {config}: unknown key 'target' (did you mean 'targets'?)\n")


@pytest.mark.parametrize("args", [
    ["snapshot", "--interval", "nan"], ["snapshot", "--interval", "0"],
    ["snapshot", "--timeout", "-1"], ["snapshot", "--timeout", "inf"],
    ["check", "--duration", "inf"], ["check", "--duration", "nan"],
    ["check", "--duration=-5m"], ["check", "--interval", "0"],
    ["record", "-o", "x.jsonl", "--duration", "0s"],
    ["record", "-o", "x.jsonl", "--interval=-inf"],
    ["replay", "x.jsonl", "--speed", "nan"], ["sim", "--speed", "inf"],
    ["sim", "--leak-frac", "1.5"], ["sim", "--slow-metrics=-1"],
    ["--interval", "nan"], ["--timeout", "0"],
    ["compare", "b", "--interval", "inf"], ["baseline", "save", "b", "--time-scale", "nan"],
    ["compare", "b", "--duration", "0"],
])
def test_nan_inf_zero_and_negative_numbers_on_the_command_line_are_usage_errors(
        capsys: pytest.CaptureFixture[str], args: list[str]) -> None:
    err = usage_error(in_process(capsys, *args))
    assert "must be" in err, err


def test_only_http_and_https_urls_are_targets(capsys: pytest.CaptureFixture[str]) -> None:
    err = usage_error(kvtop("snapshot", "ftp://gpu-1:8000", "--no-gpu", "--json"))
    assert err == ("kvtop: not an http:// or https:// URL: 'ftp://gpu-1:8000' (kvtop reads "
                   "/metrics over HTTP)\n")
    for target in ("file:///etc/passwd", "gopher://x:70", "unix:///run/vllm.sock"):
        err = usage_error(in_process(capsys, "check", target, "--duration", "1s"))
        assert "not an http:// or https:// URL" in err, err


def test_token_files_that_are_not_regular_files_are_refused(tmp_path: Path) -> None:
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)  # nobody will ever write to it: reading it would block for ever
    big = tmp_path / "big"
    big.write_bytes(b"x" * (65 * 1024))
    cases = [("/dev/zero", "not a regular file"), (str(fifo), "not a regular file"),
             (str(tmp_path), "not a regular file"), (str(big), "larger than 64 KiB"),
             (str(tmp_path / "absent"), "No such file")]
    for path, says in cases:
        err = usage_error(kvtop("snapshot", "127.0.0.1:1", "--token-file", path, "--no-gpu",
                                timeout=30))
        assert says in err and "--token-file" in err, err
        config = tmp_path / "kvtop.toml"
        config.write_text(f'[[targets]]\nurl = "127.0.0.1:1"\ntoken_file = "{path}"\n')
        err = usage_error(kvtop("snapshot", "--config", str(config), "--no-gpu", timeout=30))
        assert says in err and "token_file" in err, err


# -- internal errors -----------------------------------------------------------------------

PLANT = ("import sys, kvtop.cli, kvtop.commands.snapshot as s\n"
         "def boom(*a, **k):\n"
         "    raise RuntimeError('a planted bug')\n"
         "s.run = boom\n"
         "sys.exit(kvtop.cli.main(['snapshot', '127.0.0.1:1', '--no-gpu']))\n")


def test_an_internal_error_exits_70_with_one_line_and_the_traceback_in_a_file(
        tmp_path: Path) -> None:
    done = subprocess.run([sys.executable, "-c", PLANT], capture_output=True, text=True,
                          timeout=60, env={**os.environ, "TMPDIR": str(tmp_path)})
    assert done.returncode == 70, done.stderr
    (line,) = done.stderr.splitlines()
    assert line.startswith("kvtop: internal error, a bug: RuntimeError: a planted bug")
    (report,) = tmp_path.glob("kvtop-crash-*.txt")
    assert str(report) in line
    assert "Traceback" in report.read_text() and "boom" in report.read_text()


APP_CRASH = ("import sys, kvtop.cli, kvtop.ui.app as a\n"
             "def boom(self):\n"
             "    token = 'sk-LOCAL-SECRET-7f3a'  # a local, as the HTTP client has one\n"
             "    raise RuntimeError('a planted bug in the app')\n"
             "a.KvtopApp.on_mount = boom\n"
             "sys.exit(kvtop.cli.main(['127.0.0.1:1', '--no-gpu']))\n")


def run_in_terminal(args: list[str], *, seconds: float, cols: int = 100, rows: int = 30,
                    env: dict[str, str] | None = None) -> tuple[int, str]:
    """Run with stdin, stdout and stderr on a pseudo-terminal; (exit code, what it wrote)."""
    master, slave = pty.openpty()
    fcntl.ioctl(slave, termios.TIOCSWINSZ, struct.pack("HHHH", rows, cols, 0, 0))
    proc = subprocess.Popen(args, stdin=slave, stdout=slave, stderr=slave,
                            env={**os.environ, "TERM": "xterm-256color", **(env or {})},
                            start_new_session=True)
    os.close(slave)
    output = bytearray()
    deadline = time.monotonic() + seconds
    try:
        while time.monotonic() < deadline:
            ready, _, _ = select.select([master], [], [], 0.2)
            if ready:
                try:
                    chunk = os.read(master, 65536)
                except OSError:  # the child closed the terminal: it has ended
                    break
                if not chunk:
                    break
                output += chunk
            elif proc.poll() is not None:
                break
        return proc.wait(timeout=10), output.decode(errors="replace")
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        os.close(master)


def test_the_app_exits_70_after_a_crash_with_no_locals_shown(tmp_path: Path) -> None:
    code, output = run_in_terminal([sys.executable, "-c", APP_CRASH], seconds=60,
                                   env={"TMPDIR": str(tmp_path)})
    assert code == 70, output[-2000:]
    assert "the app stopped on an internal error, a bug: RuntimeError: a planted bug in the "\
        "app" in output
    # Textual's own report prints each frame's locals; a token held in one must not show.
    assert "sk-LOCAL-SECRET" not in output
    (report,) = tmp_path.glob("kvtop-crash-*.txt")
    assert str(report) in output.replace("\r\n", "").replace("\n", "")
    text = report.read_text()
    assert "boom" in text and "sk-LOCAL-SECRET" not in text


# -- a mistyped command, an app without a terminal -----------------------------------------


@pytest.mark.parametrize(("argv", "said", "usage"), [
    (["chek", "host:8000"], "unknown command 'chek' (did you mean 'check'?)", "kvtop check"),
    (["snapshto", "host:8000"], "unknown command 'snapshto' (did you mean 'snapshot'?)",
     "kvtop snapshot"),
    (["--interval", "2", "recrod"], "unknown command 'recrod' (did you mean 'record'?)",
     "kvtop record"),
    (["--no-gpu", "snapshot", "host:8000"], "the command 'snapshot' comes first",
     "kvtop snapshot"),
])
def test_a_mistyped_or_misplaced_command_is_a_usage_error_with_its_usage_line(
        capsys: pytest.CaptureFixture[str], argv: list[str], said: str, usage: str) -> None:
    done = in_process(capsys, *argv)
    assert done.returncode == EXIT_USAGE and done.stdout == ""
    first, *rest = done.stderr.splitlines()
    assert first.startswith(f"kvtop: {said}"), done.stderr
    assert any(line.startswith(f"usage: {usage} [-h]") for line in rest), done.stderr


@pytest.mark.parametrize("target", ["chek:8000", "check.internal", "http://snapshot/m",
                                    "localhost", "gpu-7", "--"])
def test_a_host_like_target_is_never_taken_for_a_command(
        capsys: pytest.CaptureFixture[str], target: str) -> None:
    # the boundary: these are servers (or nothing close to a command), so the app is what
    # was asked for; with stdout captured it is refused for want of a terminal instead
    done = in_process(capsys, *(["--", "chek"] if target == "--" else [target]), "--no-gpu")
    assert done.returncode == EXIT_USAGE and done.stdout == ""
    assert "unknown command" not in done.stderr
    assert done.stderr.startswith("kvtop: the app draws on a terminal, and stdout is not one")


@pytest.mark.parametrize(("argv", "usage", "meant"), [
    (["snapshot", "--jsno"], "usage: kvtop snapshot", "--json"),
    (["baseline", "save", "b", "--jsn"], "usage: kvtop baseline save", "--json"),
    (["--no-gppu"], "usage: kvtop [TARGET ...]", "--no-gpu"),
])
def test_an_unknown_option_names_the_closest_with_its_commands_usage(
        capsys: pytest.CaptureFixture[str], argv: list[str], usage: str, meant: str) -> None:
    err = usage_error(in_process(capsys, *argv))
    assert err.startswith(usage), err
    assert err.rstrip().endswith(f"(did you mean '{meant}'?)"), err


def test_the_app_never_writes_to_a_pipe(tmp_path: Path) -> None:
    replay = recording(tmp_path / "r.jsonl", [fixture(LOAD).decode()] * 2)
    for argv in (["snapshto", "127.0.0.1:1"], ["127.0.0.1:1", "--no-gpu"],
                 ["replay", str(replay)]):
        done = kvtop(*argv)  # stdout is a pipe, as in `kvtop … | cat`
        assert done.returncode == EXIT_USAGE, (argv, done.stderr)
        assert done.stdout == "" and "\x1b" not in done.stderr, argv
        assert "Traceback" not in done.stderr
    assert "kvtop snapshot" in done.stderr or "kvtop check --replay" in done.stderr


# -- --header and --cacert: usage errors ----------------------------------------------------


@pytest.mark.parametrize(("args", "says"), [
    (["--header", "X-Api-Key: gw-literal-secret"],
     "kvtop: --header: header 'X-Api-Key': its value would show in process listings; write "
     "X-Api-Key:$VAR or X-Api-Key:@FILE\n"),
    (["--header", "Authorization: Bearer gw-literal-secret"],
     "kvtop: --header: header 'Authorization' is set by kvtop itself (the token: token_env / "
     "token_file)\n"),
    (["--cacert", "/nonexistent/ca.pem"], "kvtop: --cacert: no such file: /nonexistent/ca.pem\n"),
    (["--cacert", "/etc/hostname", "--insecure"],
     "kvtop: --cacert verifies TLS and --insecure does not: give one\n"),
])
def test_a_header_or_ca_bundle_that_cant_be_used_is_a_usage_error(
        capsys: pytest.CaptureFixture[str], args: list[str], says: str) -> None:
    err = usage_error(in_process(capsys, "snapshot", "127.0.0.1:1", "--no-gpu", *args))
    assert err == says and "gw-literal-secret" not in err


def test_a_ca_bundle_that_is_no_pem_and_options_without_their_targets(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    junk = tmp_path / "ca.pem"
    junk.write_text("junk\n")
    err = usage_error(in_process(capsys, "snapshot", "127.0.0.1:1", "--cacert", str(junk)))
    assert err.startswith(f"kvtop: --cacert: not a PEM CA bundle: {junk} (")
    config = tmp_path / "kvtop.toml"
    config.write_text('[[targets]]\nurl = "gpu-1:8000"\n')
    err = usage_error(in_process(capsys, "snapshot", "--config", str(config), "--header",
                                 "Accept: text/plain"))
    assert "for the config's, give each [[targets]] headers / cacert" in err
    err = usage_error(in_process(capsys, "snapshot", "--prometheus", "http://prom:9090",
                                 "--header", "Accept: text/plain"))
    assert "--header and --cacert are for targets read directly" in err


# -- help, completion, man page ------------------------------------------------------------


def test_help_lists_every_command_with_one_line() -> None:
    done = kvtop("--help")
    assert done.returncode == 0
    for name, summary in SUMMARIES.items():
        assert re.search(rf"^  {name} +{re.escape(summary)}$", done.stdout, re.M), name
    replay = kvtop("replay", "--help").stdout
    assert "a recording written by kvtop record" in replay and "where the s key" in replay
    record = " ".join(kvtop("record", "--help").stdout.split())
    assert "-o FILE, --output FILE the recording to write" in record


def test_bash_completes_commands_and_options() -> None:
    script = kvtop("completion", "bash").stdout

    def complete(*words: str) -> list[str]:
        line = " ".join(f"'{w}'" for w in words)
        shell = (f"source /dev/stdin; COMP_WORDS=({line}); COMP_CWORD={len(words) - 1}; "
                 "_shtab_kvtop; printf '%s\\n' \"${COMPREPLY[@]}\"")
        done = subprocess.run(["bash", "-c", shell], input=script, capture_output=True,
                              text=True, timeout=30)
        return done.stdout.split()

    assert complete("kvtop", "sn") == ["snapshot"]
    assert "completion" in complete("kvtop", "")
    assert complete("kvtop", "check", "--unt") == ["--until", "--until-leak"]
    assert set(complete("kvtop", "completion", "")) == {"bash", "zsh", "fish"}
    assert set(complete("kvtop", "baseline", "")) == {"save", "list", "show", "rm"}
    assert "--probe" in complete("kvtop", "compare", "--pro")


@pytest.mark.skipif(shutil.which("fish") is None, reason="fish is not installed")
def test_fish_completes_commands_and_options() -> None:
    script = kvtop("completion", "fish").stdout
    done = subprocess.run(["fish", "--no-config", "-c",
                           "source; complete -C'kvtop sn'; complete -C'kvtop check --unt'"],
                          input=script, capture_output=True, text=True, timeout=30)
    names = [line.split("\t")[0] for line in done.stdout.splitlines()]
    assert names == ["snapshot", "--until", "--until-leak"], done.stdout + done.stderr


@pytest.mark.skipif(shutil.which("zsh") is None, reason="zsh is not installed")
def test_zsh_completion_is_valid_and_defines_kvtop() -> None:
    script = kvtop("completion", "zsh").stdout
    assert script.startswith("#compdef kvtop")
    done = subprocess.run(["zsh", "-n"], input=script, capture_output=True, text=True,
                          timeout=30)
    assert done.returncode == 0, done.stderr
    assert "snapshot:'Read every target" in script and '"--until-leak[' in script


def test_the_man_page_is_current_and_renders() -> None:
    page = REPO / "man" / "kvtop.1"
    assert page.read_text(encoding="utf-8") == render(), \
        "man/kvtop.1 is out of date: python -m kvtop.manpage > man/kvtop.1"
    if shutil.which("groff") is None:
        pytest.skip("groff is not installed")
    done = subprocess.run(["groff", "-man", "-Tutf8", "-ww", str(page)], capture_output=True,
                          text=True, timeout=30)
    assert done.returncode == 0 and done.stderr == "", done.stderr
    text = re.sub(r".\x08", "", done.stdout)
    for name in SUMMARIES:
        assert f"{name}: {SUMMARIES[name]}"[:40] in " ".join(text.split())
    for action in ("save", "list", "show", "rm"):  # a command's own actions too
        assert f"kvtop baseline {action}" in text


# Textual's key names as a person reads them (the help's and the man page's way)
KEY_NAMES = {"ctrl+c": "^C", "question_mark": "?", "slash": "/", "up": "↑", "down": "↓",
             "left": "←", "right": "→", "pageup": "PgUp", "pagedown": "PgDn", "home": "Home",
             "end": "End", "full_stop": ".", "left_square_bracket": "[",
             "right_square_bracket": "]", "left_curly_bracket": "{",
             "right_curly_bracket": "}", "less_than_sign": "<", "greater_than_sign": ">"}
MOUSE = {"click"}  # said in KEYS, but no key binds it


def bound_keys(bindings: list[Any]) -> set[str]:
    """Every key these bindings bind, as a person reads it (its key_display when it has
    one: "+" for "plus,equals_sign")."""
    keys: set[str] = set()
    for binding in bindings:
        if binding.key_display:
            keys.update(binding.key_display.split())
            continue
        for key in binding.key.split(","):
            keys.add(KEY_NAMES.get(key, key.upper() if re.fullmatch(r"f\d+", key) else key))
    return keys


def man_keys(section: str) -> set[str]:
    """The keys a part of the man page's KEYS section names (its bold terms)."""
    keys: set[str] = set()
    for term in re.findall(r"^\\fB(.*)\\fR$", section, re.MULTILINE):
        term = re.sub(r"\\\[u([0-9A-F]{4})\]", lambda m: chr(int(m.group(1), 16)), term)
        term = term.replace("\\&", "").replace("\\-", "-").replace("\\e", "\\")
        for word in term.split():
            keys.update(word if all(c in "↑↓←→" for c in word) else [word])
    return keys


def test_the_man_pages_keys_are_the_keys_the_app_binds() -> None:
    from kvtop.ui.keys import LIVE_BINDINGS, REPLAY_BINDINGS
    from kvtop.ui.widgets.fleet_table import FleetTable

    section = render().split(".SH KEYS\n", 1)[1].split(".SH ", 1)[0]
    live, replay = section.split(".PP\n")
    app = bound_keys([*LIVE_BINDINGS, *FleetTable.BINDINGS])
    assert man_keys(live) - MOUSE == app
    assert man_keys(replay) == bound_keys(REPLAY_BINDINGS) - app


@pytest.mark.slow  # ~9 s: pip builds a wheel
def test_pip_install_installs_the_man_page(tmp_path: Path) -> None:
    # the wheel pip would install, built from a copy (a build writes build/ and *.egg-info)
    source = tmp_path / "src"
    for name in ("pyproject.toml", "README.md"):
        (source / name).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy(REPO / name, source / name)
    for folder in ("kvtop", "man"):
        shutil.copytree(REPO / folder, source / folder,
                        ignore=shutil.ignore_patterns("__pycache__"))
    done = subprocess.run([sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "-w",
                           str(tmp_path / "dist"), str(source)],
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stdout + done.stderr
    (wheel,) = (tmp_path / "dist").glob("*.whl")
    with zipfile.ZipFile(wheel) as archive:
        (page,) = [name for name in archive.namelist()
                   if name.endswith(".data/data/share/man/man1/kvtop.1")]
        assert archive.read(page).decode("utf-8") == render()


def listed_exit_codes(help_text: str) -> dict[int, str]:
    """The exit status a --help ends with: code -> meaning, wrapped lines joined."""
    codes: dict[int, str] = {}
    code = -1
    for line in help_text.split("\nexit status:\n", 1)[1].splitlines():
        if not line.strip():
            break
        if line.startswith("   "):  # the meaning wrapped onto another line
            codes[code] += " " + line.strip()
        else:
            number, _, meaning = line.strip().partition(" ")
            code = int(number)
            codes[code] = meaning.strip()
    return codes


@pytest.mark.parametrize("command", [[], *([name] for name in SUMMARIES),
                                     ["baseline", "save"], ["baseline", "rm"]])
def test_every_help_lists_the_exit_codes_exits_py_gives_it(
        capsys: pytest.CaptureFixture[str], command: list[str]) -> None:
    done = in_process(capsys, *command, "--help")
    assert done.returncode == 0
    assert listed_exit_codes(done.stdout) == dict(exit_codes(command[0] if command else APP))


def test_the_man_page_lists_every_commands_exit_codes() -> None:
    section = render().split(".SH EXIT STATUS\n", 1)[1].split(".SH ", 1)[0]
    by_code = {int(re.match(r"\\fB(\d+)\\fR", part).group(1)): part  # type: ignore[union-attr]
               for part in section.split(".TP\n")[1:]}
    for command in (APP, *SUMMARIES):
        for code, meaning in exit_codes(command):
            if (code, meaning) in SHARED:
                assert roff(meaning) in by_code[code], (command, code)
            else:
                name = "the app" if command == APP else command
                assert roff(f"{name}: {meaning}") in by_code[code], (command, code)


@pytest.mark.parametrize("name", list(SUMMARIES))
def test_each_exit_code_a_command_returns_is_one_its_help_lists(name: str) -> None:
    # the codes a command module names (EXIT_*) are listed for it: a new one can't go unsaid
    import kvtop.exits

    source = (REPO / "kvtop" / "commands" / f"{name}.py").read_text(encoding="utf-8")
    named = {n: getattr(kvtop.exits, n) for n in re.findall(r"\b(EXIT_[A-Z_]+)\b", source)
             if hasattr(kvtop.exits, n)}
    listed = dict(exit_codes(name))
    assert {n: code for n, code in named.items() if code not in listed} == {}


# -- snapshot ------------------------------------------------------------------------------


async def test_snapshot_table_into_a_pipe_is_the_apps_rows_unwrapped(tmp_path: Path) -> None:
    evil = fixture(LOAD).replace(b'model_name="twin-llama"',
                                 b'model_name="twin-llama-with-a-long-name\x1b[2J"')
    async with FaultServer(bodies=[evil]) as server:
        down = f"http://127.0.0.1:{closed_port()}/metrics"
        done = await asyncio.to_thread(kvtop, "snapshot", server.url(), down, "--table",
                                       "--samples", "1", "--no-gpu", env={"COLUMNS": "40"})
    assert done.returncode == 3, done.stderr
    header, up, refused = done.stdout.splitlines()
    for title in ("NAME", "MODEL", "STATUS", "KV BLOCKS", "LEAK", "RUN", "WAIT", "PRE/s", "HIT",
                  "PP t/s", "GEN t/s", "TTFT 50/99"):
        assert title in header
    assert len(up) > 80  # never squeezed to 80 columns, never wrapped onto a second line
    assert "\x1b" not in done.stdout and "long-name\\x1b[2J" in up  # shown, not obeyed
    assert "588/599" in up and "30" in up.split() and "149" in up.split()
    # one scrape has no window: HIT shows only the lifetime, labelled; latency none at all
    # (a lifetime figure is never shown as current)
    assert "(38%)" in up and up.split()[-1] == "–" and not re.search(r"\d+(ms|s)/", up)
    assert "connection refused" in refused and "down" in refused


def test_headless_commands_load_no_textual() -> None:
    # The table shares the app's rows and formatters, not its framework: start-up stays light.
    code = ("import sys, kvtop.cli, kvtop.commands.snapshot, kvtop.view.table, "
            "kvtop.commands.check, kvtop.commands.baseline, "
            "kvtop.baseline.text, kvtop.baseline.live, kvtop.baseline.compare; "
            "print(sorted(m for m in sys.modules "
            "if m.split('.')[0] == 'textual'))")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          timeout=60, check=True)
    assert done.stdout.strip() == "[]"


# -- check ---------------------------------------------------------------------------------


def test_check_text_when_piped_and_the_span_it_judged(tmp_path: Path) -> None:
    replay = recording(tmp_path / "r.jsonl", [fixture(LOAD).decode()] * 4)
    done = kvtop("check", "--replay", str(replay), "--json")
    document = json.loads(done.stdout)
    assert document["started_at"] == "2027-01-15T08:00:00.000+00:00"
    assert document["ended_at"] == "2027-01-15T08:00:30.000+00:00"
    assert document["duration_s"] == 30.0
    text = kvtop("check", "--replay", str(replay), "--text")
    # the same loaded body 4 times: requests held, no token counted for 30 s is a stall (4)
    assert text.returncode == done.returncode == 4
    assert text.stdout.startswith(
        "kvtop check: UNKNOWN, STALLED (30s judged, 2027-01-15T08:00:00")
    assert "not enough data" in text.stdout


async def test_check_shows_progress_on_a_terminal_only() -> None:
    async with FaultServer(bodies=[fixture(IDLE)]) as server:
        args = ["check", server.url(), "--duration", "4s", "--interval", "0.5"]
        code, output = await asyncio.to_thread(run_in_terminal, [*KVTOP, *args], seconds=60)
        piped = await asyncio.to_thread(kvtop, *args, "--json")
    assert code == 0, output
    progress = re.findall(r"kvtop check: (\S+) of 4s \((\S+) left\) · (\d) engine\(s\) seen · "
                          r"worst so far: (\w+)", output)
    assert len(progress) >= 2, output
    assert progress[-1][2] == "1" and progress[-1][3] == "OK"  # an idle pool, drained
    assert "\r\x1b[K" in output  # the line is cleared before the verdict
    assert "kvtop check: OK (" in output  # the text verdict on a terminal
    assert piped.returncode == 0 and "engine(s) seen" not in piped.stderr
    assert json.loads(piped.stdout)["verdict"] == "ok"


# -- main() in this process: each way a command ends, and the parsers it builds -----------


def test_each_way_a_command_ends_is_its_exit_code(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
        capsys: pytest.CaptureFixture[str]) -> None:
    """A bug is 70 with one line and the traceback in a file; Ctrl-C 130; a config error
    2 with its words; what the command returns, as it is."""
    import tempfile

    import kvtop.commands.rules as rules
    from kvtop.config import ConfigError

    def ends(how: BaseException | int) -> Any:
        def run(args: object) -> int:
            if isinstance(how, int):
                return how
            raise how
        return run

    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    said = {}
    for name, how in (("bug", RuntimeError("a planted bug")), ("ctrl-c", KeyboardInterrupt()),
                      ("config", ConfigError("rules: no such thing")), ("code", 4),
                      ("zero", 0)):
        monkeypatch.setattr(rules, "run", ends(how))
        code = main(["rules"])
        out, err = capsys.readouterr()
        said[name] = (code, out, err)
    (report,) = tmp_path.glob("kvtop-crash-*.txt")
    assert said == {
        "bug": (70, "", f"kvtop: internal error, a bug: RuntimeError: a planted bug "
                        f"(traceback in {report})\n"),
        "ctrl-c": (130, "", ""), "config": (2, "", "kvtop: rules: no such thing\n"),
        "code": (4, "", ""), "zero": (0, "", "")}
    assert "a planted bug" in report.read_text(encoding="utf-8")


def test_a_reader_gone_is_141_and_what_is_left_goes_nowhere(
        monkeypatch: pytest.MonkeyPatch) -> None:
    read, write = os.pipe()
    os.close(read)  # `kvtop rules | head -0`: the reader has gone
    stdout = os.fdopen(write, "w")
    monkeypatch.setattr(sys, "stdout", stdout)
    try:
        assert main(["rules"]) == 141
        # stdout's descriptor now leads to /dev/null: the interpreter's last flush is quiet
        assert os.fstat(write).st_rdev == os.stat(os.devnull).st_rdev
        stdout.write("more\n")
        stdout.flush()
    finally:
        stdout.close()


def test_help_and_version_go_to_stdout_with_exit_0(capsys: pytest.CaptureFixture[str]) -> None:
    from kvtop import __version__

    assert main(["--version"]) == 0
    assert capsys.readouterr() == (f"kvtop {__version__}\n", "")
    assert main(["--help"]) == 0
    out, err = capsys.readouterr()
    assert err == "" and out.startswith(
        "usage: kvtop [TARGET ...] [options]\n       kvtop {" + ",".join(SUMMARIES) + "} ...\n")
    # the description and the exit codes as written, line by line; the commands aligned
    assert ("\nhtop for the KV cache of vLLM, SGLang and llama.cpp servers: KV blocks, queues,\n"
            "preemptions, prefix hits, throughput, latency, local GPUs and a leak indicator.\n"
            in out)
    width = max(map(len, SUMMARIES))
    table = "\n".join(f"  {name:<{width}}  {summary}" for name, summary in SUMMARIES.items())
    assert ("\ncommands (kvtop COMMAND --help for each):\n" + table
            + "\n\nKeys in the app: ? for help.\n\nexit status:\n  0    quit\n") in out


@pytest.mark.parametrize(("argv", "ending"), [
    (["snapshot", "--jsno=yes-as-json"],
     "unrecognized arguments: --jsno=yes-as-json (did you mean '--json'?)"),
    (["snapshot", "host:1", "--zzzzzzzz"], "unrecognized arguments: --zzzzzzzz"),
    (["snapshot", "host:1", "--zzzzzzzz", "--jsno"],
     "unrecognized arguments: --zzzzzzzz --jsno (did you mean '--json'?)"),
    # the words after the first ": " of argparse's message, each option's name before its "="
    (["snapshot", "host:1", "--jsno", "--zzzzzzzz: q"],
     "unrecognized arguments: --jsno --zzzzzzzz: q (did you mean '--json'?)"),
    (["snapshot", "--jsno=yes-as-json=1"],
     "unrecognized arguments: --jsno=yes-as-json=1 (did you mean '--json'?)"),
    (["snapshot", "host:1", "--zzzzzzzz", "--yy: q", "--jsno"],
     "unrecognized arguments: --zzzzzzzz --yy: q --jsno (did you mean '--json'?)"),
    # a word that is no option is not taken for a mistyped one, however close
    (["rules", "config"], "unrecognized arguments: config"),
    # only unknown options get a suggestion, not a missing one
    (["record", "host:1"], "the following arguments are required: -o/--output"),
])
def test_an_unknown_option_is_named_with_the_closest_known_one_if_any(
        capsys: pytest.CaptureFixture[str], argv: list[str], ending: str) -> None:
    err = usage_error(in_process(capsys, *argv))
    assert err.splitlines()[-1] == f"kvtop {argv[0]}: error: {ending}"


def test_the_apps_options_default_as_documented(tmp_path: Path,
                                                monkeypatch: pytest.MonkeyPatch) -> None:
    from kvtop.cli import build_app_parser
    from kvtop.store.writer import DEFAULT_MAX_BYTES

    monkeypatch.chdir(tmp_path)
    args = vars(build_app_parser().parse_args([]))
    assert {key: args[key] for key in (
        "interval", "demo", "no_gpu", "snapshot_dir", "low_bandwidth", "record",
        "record_max_size", "baseline")} == {
        "interval": None, "demo": False, "no_gpu": False, "snapshot_dir": tmp_path,
        "low_bandwidth": False, "record": None, "record_max_size": DEFAULT_MAX_BYTES,
        "baseline": None}


def test_every_command_runs_its_own_module_and_lists_its_exit_codes() -> None:
    import argparse

    from kvtop.cli import Formatter, build_command_parser, command_module
    from kvtop.exits import epilog

    parser = build_command_parser()
    assert parser.prog == "kvtop"
    (commands,) = (a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    assert list(commands.choices) == list(SUMMARIES)
    for name, command in commands.choices.items():
        assert command.get_default("command") is command_module(name).run, name
        assert command.epilog == epilog(name) and command.formatter_class is Formatter
    save = commands.choices["baseline"]._subparsers._group_actions[0].choices["save"]
    assert save.epilog == epilog("baseline") and save.formatter_class is Formatter
    assert parser.get_default("reference").__name__ == "build_reference_parser"


def test_the_app_on_a_prometheus_that_cannot_be_read_exits_3_before_drawing(
        monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    """The instances are found first; a Prometheus that can't be asked ends it there."""
    monkeypatch.setattr(sys.stdout, "isatty", lambda: True)  # as at a terminal
    url = f"http://127.0.0.1:{closed_port()}"
    assert main(["--prometheus", url, "--no-gpu"]) == 3
    assert capsys.readouterr() == (
        "", f"kvtop: Prometheus {url}: connection refused: nothing listens on that port\n")


def test_the_apps_options_reach_its_config_and_each_target_its_max_num_seqs(
        tmp_path: Path) -> None:
    """What the app is started with (its own run needs a terminal: tests/ui/pilot)."""
    from kvtop.cli import _app_config, _trackers, build_app_parser
    from kvtop.config import load_config
    from kvtop.derive.limits import LimitParams
    from kvtop.ui.app import AppConfig

    path = tmp_path / "kvtop.toml"
    path.write_text('[alerts]\nbell = false\n\n[[targets]]\nurl = "gpu-1:8000"\n'
                    'max_num_seqs = 32\n')
    config = load_config(path)
    args = build_app_parser().parse_args([
        "gpu-1:8000", "--no-gpu", "--low-bandwidth", "--insecure", "--full-metrics",
        "--record", str(tmp_path / "r.jsonl.gz"), "--record-max-size", "1M",
        "--snapshot-dir", str(tmp_path)])
    target = Target.from_spec("gpu-1:8000")
    assert _app_config(args, [target], 2.5, config, demo=True) == AppConfig(
        targets=[target], interval_s=2.5, no_gpu=True, demo=True, snapshot_dir=tmp_path,
        low_bandwidth=True, insecure=True, full_metrics=True, record=tmp_path / "r.jsonl.gz",
        record_max_bytes=1024 * 1024, alerts=config.alerts)
    assert config.alerts.bell is False  # the config's alerts, not the default ones
    trackers = _trackers(config)
    assert trackers(target).state.target == target
    assert trackers(target).limit_params == LimitParams(max_num_seqs=32)
    assert trackers(Target.from_spec("gpu-2:8000")).limit_params is None


@pytest.mark.parametrize(("argv", "said"), [
    # "-" is a target word, not an option: what follows is a target too, not a command
    (["-", "chek", "--no-gpu"], "kvtop: the app draws on a terminal, and stdout is not one; "
                                "for a pipe or a file use `kvtop snapshot` (JSON) or `kvtop "
                                "snapshot --table`\n"),
    # a word with none of : / . and not localhost is no server: a mistyped command
    (["recordX"], "kvtop: unknown command 'recordX' (did you mean 'record'?)\n"
                  "kvtop: a server is written host:port or as a URL\nusage: kvtop record [-h]"),
    # an option that takes a value, given none: argparse says so
    (["--interval"], "kvtop: error: argument --interval: expected one argument\n"),
])
def test_the_first_word_that_is_not_an_option_decides_app_or_command(
        capsys: pytest.CaptureFixture[str], argv: list[str], said: str) -> None:
    done = in_process(capsys, *argv)
    assert done.returncode == EXIT_USAGE and done.stdout == ""
    assert said in done.stderr, done.stderr


def test_the_app_reads_its_config_and_baseline_before_the_terminal(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    bad = tmp_path / "kvtop.toml"
    bad.write_text("interval_s = -1\n")
    config_error = in_process(capsys, "--config", str(bad), "--no-gpu")
    assert config_error.returncode == EXIT_USAGE
    assert config_error.stderr.startswith(f"kvtop: {bad}: ")
    assert "terminal" not in config_error.stderr
    baseline = in_process(capsys, "127.0.0.1:1", "--baseline", "no-such-baseline", "--no-gpu")
    assert baseline.returncode == EXIT_USAGE and "no-such-baseline" in baseline.stderr
    assert "terminal" not in baseline.stderr
    no_terminal = in_process(capsys, "127.0.0.1:1", "--no-gpu")
    assert no_terminal.stderr == (
        "kvtop: the app draws on a terminal, and stdout is not one; for a pipe or a file use "
        "`kvtop snapshot` (JSON) or `kvtop snapshot --table`\n")


def test_the_app_is_handed_its_targets_and_refuses_a_recording_that_exists(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
        capsys: pytest.CaptureFixture[str]) -> None:
    """At a terminal, the app is started on what the command line names: a recording that
    exists already is refused there (exit 2) before anything is drawn."""
    monkeypatch.setattr(sys.stdout, "isatty", lambda: True)
    existing = tmp_path / "r.jsonl.gz"
    existing.write_bytes(b"")
    assert main(["127.0.0.1:1", "127.0.0.1:2", "--no-gpu", "--interval", "3",
                 "--record", str(existing)]) == EXIT_USAGE
    assert capsys.readouterr() == ("", f"kvtop: can't record to {existing}: it is an existing "
                                       "file, and kvtop does not overwrite or follow one\n")


def test_one_tree_of_every_option_has_the_commands_and_no_targets_of_the_app() -> None:
    from kvtop.cli import build_app_parser, build_reference_parser

    assert [a.dest for a in build_reference_parser()._actions if not a.option_strings] == [
        "==SUPPRESS=="]  # the commands' subparsers
    assert [a.dest for a in build_app_parser()._actions if not a.option_strings] == ["targets"]


def test_a_commands_description_is_wrapped_to_the_terminal(
        monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.setenv("COLUMNS", "60")
    assert main(["sim", "--help"]) == 0
    out = capsys.readouterr().out
    assert ("\n\nServe simulated vLLM V1 servers whose /metrics look like\nvLLM 0.33's, each "
            "printing its URL on a line of stdout,\nuntil Ctrl-C.\n\n") in out
