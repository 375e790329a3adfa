"""Every exit code kvtop returns, and what each means for each command: the one table behind
each command's ``--help`` (its epilog) and the man page's EXIT STATUS.

A code keeps one meaning per command; a number may mean different things to different
commands (1 is a leak to ``check``, NO-GO to ``rehearse``), so each command's own codes are
listed with it. 2, 70, 130 and 141 are the same for every command.
"""

from __future__ import annotations

import textwrap

EXIT_OK = 0
EXIT_LEAK = 1  # check: a leak found
EXIT_NO_GO = 1  # rehearse
EXIT_WORSE = 1  # compare: a regression
EXIT_CANNOT_LISTEN = 1  # sim
EXIT_USAGE = 2  # a bad option, config or input file: the message says which
EXIT_NO_DATA = 3  # check, compare, baseline save: no usable data for a verdict
EXIT_UNREADABLE = 3  # snapshot, the app with --prometheus: a target or Prometheus unreadable
EXIT_CANNOT_RUN = 3  # rehearse
EXIT_STALLED = 4  # check: an engine stalled (and no leak)
EXIT_INCOMPLETE = 4  # record: the recording fell short
EXIT_INTERNAL = 70  # EX_SOFTWARE, a bug; never 1, which `check` uses for "leak found"
EXIT_INTERRUPTED = 130  # Ctrl-C
EXIT_BROKEN_PIPE = 141  # 128 + SIGPIPE: what a shell reports for a tool whose reader left

APP = "kvtop"  # the terminal app: kvtop without a command

Meanings = tuple[tuple[int, str], ...]

SHARED: Meanings = (
    (EXIT_USAGE, "usage error (a bad option or config) or unreadable input (a recording, a "
                 "baseline cut off, of a newer format or of another model)"),
    (EXIT_INTERNAL, "internal error, a bug: stderr says where the traceback was written"),
    (EXIT_INTERRUPTED, "interrupted (Ctrl-C)"),
    (EXIT_BROKEN_PIPE, "the reader of stdout went away (a closed pipe), as with SIGPIPE"),
)

# Each command's own codes (2 only where it means more there than SHARED says).
EXITS: dict[str, Meanings] = {
    APP: ((EXIT_OK, "quit"),
          (EXIT_USAGE, "usage error, a --record file that can't be created or a baseline "
                       "that can't be read"),
          (EXIT_UNREADABLE, "--prometheus: Prometheus could not be read")),
    "snapshot": ((EXIT_OK, "every target was read"),
                 (EXIT_UNREADABLE, "a target (or Prometheus) could not be read")),
    "record": ((EXIT_OK, "every scrape is in the file"),
               (EXIT_USAGE, "usage error, or FILE can't be created (it exists: see --force)"),
               (EXIT_INCOMPLETE, "the recording fell short (write errors such as a full "
                                 "disk, --max-size)")),
    "check": ((EXIT_OK, "no leak (ok or watch) and no engine stalled"),
              (EXIT_LEAK, "a leak was found"),
              (EXIT_USAGE, "usage error or unreadable input (not a recording, an existing "
                           "or unwritable --record file)"),
              (EXIT_NO_DATA, "no usable data (no engine left warm-up; targets or Prometheus "
                             "unreadable) and no engine stalled"),
              (EXIT_STALLED, "no leak, but an engine STALLED (requests held, no token "
                             "generated)")),
    "replay": ((EXIT_OK, "quit"),
               (EXIT_USAGE, "usage error, or the recording can't be read"),
               (EXIT_NO_DATA, "the recording holds no scrape")),
    "rules": ((EXIT_OK, "the rules were printed"),),
    "sim": ((EXIT_OK, "stopped by Ctrl-C or SIGTERM"),
            (EXIT_CANNOT_LISTEN, "a port could not be listened on"),
            (EXIT_USAGE, "usage error, or a trace file not found")),
    "rehearse": ((EXIT_OK, "GO"), (EXIT_NO_GO, "NO-GO"),
                 (EXIT_CANNOT_RUN, "could not run (not an OpenAI-compatible server, its "
                                   "/metrics unreadable, or nothing could be judged)")),
    "baseline": ((EXIT_OK, "done: saved, listed, shown or removed"),
                 (EXIT_USAGE, "usage error, a baseline that can't be read, or the file "
                              "can't be written"),
                 (EXIT_NO_DATA, "save: no engine could be read (nothing saved), or --probe "
                                "found no OpenAI API")),
    "compare": ((EXIT_OK, "nothing worse than the baseline (same or better)"),
                (EXIT_WORSE, "a regression: some figure or the leak detector is worse"),
                (EXIT_USAGE, "usage error, or an input that can't be used (an unknown, "
                             "cut-off or newer baseline, not a recording, no model shared)"),
                (EXIT_NO_DATA, "no data: no engine could be read in the run, nothing could "
                               "be judged, or --probe found no OpenAI API")),
    "completion": ((EXIT_OK, "the script was printed"),),
}


def exit_codes(command: str) -> Meanings:
    """Every code ``command`` may return with its meaning there, in order."""
    own = dict(EXITS[command])
    return tuple(sorted({**dict(SHARED), **own}.items()))


def epilog(command: str, columns: int = 79) -> str:
    """The exit codes as a ``--help`` epilog: a code and its meaning per line, wrapped."""
    codes = exit_codes(command)
    width = max(len(str(code)) for code, _ in codes)
    return "exit status:\n" + "\n".join(
        textwrap.fill(meaning, columns, initial_indent=f"  {code:<{width}}  ",
                      subsequent_indent=" " * (width + 4)) for code, meaning in codes)


def by_code() -> dict[int, list[tuple[str, str]]]:
    """Each code with (command, meaning) per command that returns it, for the man page;
    a code every command shares has the command ``""``."""
    codes: dict[int, list[tuple[str, str]]] = {}
    for code, meaning in SHARED:
        codes.setdefault(code, []).append(("", meaning))
    for command, meanings in EXITS.items():
        for code, meaning in meanings:
            codes.setdefault(code, []).append((command, meaning))
    return dict(sorted(codes.items()))
