"""``kvtop baseline save|list|show|rm`` (docs/baseline-format.md), and the run a baseline
summarises, live or recorded, which ``kvtop compare`` reads too."""

from __future__ import annotations

import argparse
import asyncio
import sys
from pathlib import Path
from typing import TYPE_CHECKING

from kvtop.cli_args import (
    add_target_arguments,
    add_time_range_arguments,
    parse_duration,
    positive_number,
    resolve_targets,
    time_range,
)
from kvtop.config import ConfigError, leak_params, load_config
from kvtop.exits import EXIT_NO_DATA, EXIT_OK, EXIT_USAGE
from kvtop.report.output import emit
from kvtop.safe_text import display_text, warn

if TYPE_CHECKING:
    from kvtop.baseline.model import Baseline, ProbeSummary
    from kvtop.baseline.probe import ProbeSettings, PromptForm

DEFAULT_DURATION = "20m"
# Fewer minutes than this and compare's rank test can never reach p < 0.01 against a run of
# the same length (2 / C(10, 5) = 0.008): every figure would be unknown.
SHORTEST_USEFUL_MIN = 5


def _count(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a whole number: {text!r}") from None
    if not 1 <= value <= 100:
        raise argparse.ArgumentTypeError("from 1 to 100")
    return value


def live_arguments(parser: argparse.ArgumentParser, what: str, leading: str) -> None:
    """Options of a live run. The positionals are one list, ``leading`` then the targets:
    argparse can't place options between two positionals when the second may be empty."""
    add_target_arguments(parser)
    for action in parser._actions:
        if action.dest == "targets":
            action.metavar = f"{leading} TARGET"
            action.help = (f"{leading}, then host:port or URL of each /metrics endpoint "
                           "(default: the config's targets, else http://127.0.0.1:8000)")
    parser.add_argument("--duration", type=parse_duration, metavar="D",
                        help=f"how long to watch live targets (default {DEFAULT_DURATION})")
    parser.add_argument("--interval", type=positive_number, default=1.0, metavar="S",
                        help="seconds between scrapes (default 1)")
    parser.add_argument("--probe", action="store_true",
                        help=f"{what}send a fixed short completion to each server's OpenAI "
                             "API --probes times and time it (it sends traffic)")
    parser.add_argument("--probes", type=_count, default=None, metavar="N",
                        help="how many probe requests (default 5)")
    parser.add_argument("--time-scale", type=positive_number, default=1.0, metavar="S",
                        help="the target's clock runs S times wall time (kvtop sim --speed "
                             "S): the duration and timings are in its time")
    parser.add_argument("--no-gpu", action="store_true", help="do not read local GPUs")


def add_parser(subparsers: argparse._SubParsersAction, summary: str) -> argparse.ArgumentParser:
    """Register ``baseline`` with its actions save, list, show and rm."""
    parser = subparsers.add_parser(
        "baseline", help=summary,
        description="Save, list, show and remove baselines: per engine the cache config, "
                    "KV usage, queues, preemptions, prefix hit rate, throughput, latency and "
                    "GPU memory of a healthy run (docs/baseline-format.md). Saved under "
                    "$XDG_DATA_HOME/kvtop/baselines/NAME.json, or at a path.")
    actions = parser.add_subparsers(title="actions", metavar="ACTION", required=True)
    save = actions.add_parser(
        "save", help="watch the targets (or read a recording) and save a baseline",
        description="Watch the targets for --duration (or read a recording with --from) "
                    "and save what the run looked like as NAME: a name (letters, digits, "
                    ". _ -) or a path ending in .json.")
    save.usage = ("kvtop baseline save NAME [TARGET ...] [--duration D | --from RECORDING] "
                  "[--probe] [options]")
    live_arguments(save, "also ", "NAME")
    save.add_argument("--from", dest="recording", type=Path, metavar="RECORDING",
                      help="summarise a recording instead of watching live targets")
    add_time_range_arguments(save, "--from")
    save.add_argument("--force", action="store_true", help="replace a baseline of that name")
    save.add_argument("--json", dest="as_json", action="store_true",
                      help="print the saved baseline")
    save.set_defaults(action=run_save)
    listing = actions.add_parser("list", help="the saved baselines",
                                 description="List the baselines saved by name.")
    listing.add_argument("--json", dest="as_json", action="store_true", default=None,
                         help="JSON (the default when stdout is not a terminal)")
    listing.set_defaults(action=run_list)
    show = actions.add_parser("show", help="what a baseline holds",
                              description="Print a baseline (its file with --json).")
    show.add_argument("name", metavar="NAME")
    show.add_argument("--json", dest="as_json", action="store_true", default=None,
                      help="the file's JSON (the default when stdout is not a terminal)")
    show.set_defaults(action=run_show)
    remove = actions.add_parser("rm", help="remove a saved baseline",
                                description="Remove a baseline.")
    remove.add_argument("name", metavar="NAME")
    remove.set_defaults(action=run_rm)
    return parser


def run(args: argparse.Namespace) -> int:
    return int(args.action(args))


# -- the run to summarise -------------------------------------------------------------------


def from_recording(path: Path, args: argparse.Namespace, name: str | None) -> Baseline:
    """The recording summarised, within ``--since``/``--until`` when given."""
    from kvtop.baseline.collect import summarise
    from kvtop.store.recording import RecordingError, open_recording
    from kvtop.store.time_range import TimeRange

    span = TimeRange(args.since, args.until)  # the caller refused them without a recording
    try:
        recording = open_recording(path)
    except RecordingError as exc:
        raise ConfigError(str(exc)) from None
    for warning in recording.warnings:
        warn(f"kvtop: {path}: {warning}")
    source: dict[str, str | int | float | bool | None] = {"kind": "recording",
                                                          "recording": str(path)}
    if span:
        source["range"] = span.describe()
    return summarise(span.within(recording.in_time_order()), targets=recording.targets(),
                     name=name, source=source, interval_s=recording.interval_s,
                     leak_params=leak_params(load_config(args.config)), in_time_order=True)


def _probe_settings(args: argparse.Namespace,
                    probe: ProbeSummary | None) -> ProbeSettings | None:
    """What --probe sends: in a compare, what the baseline's probe sent (model, form)."""
    from kvtop.baseline.probe import DEFAULT_PROBES, ProbeSettings

    if not args.probe:
        if args.probes is not None:
            raise ConfigError("--probes N needs --probe")
        return None
    count = args.probes or (probe.requests if probe is not None else DEFAULT_PROBES)
    if probe is None:
        return ProbeSettings(count=count)
    form: PromptForm = "token_ids" if probe.prompt == "token_ids" else "text"
    return ProbeSettings(count=count, model=probe.model or None, form=form)


def live(args: argparse.Namespace, name: str | None,
          probe: ProbeSummary | None = None) -> Baseline:
    from kvtop.baseline.live import CannotProbe, LiveSettings, collect_live
    from kvtop.collect.nvml import NvmlReader

    config = load_config(args.config)
    settings = LiveSettings(
        targets=resolve_targets(args, config),
        duration_s=args.duration or parse_duration(DEFAULT_DURATION),
        interval_s=args.interval, timeout_s=args.timeout, insecure=args.insecure,
        full_metrics=args.full_metrics, time_scale=args.time_scale,
        leak_params=leak_params(config), probe=_probe_settings(args, probe))
    print(f"kvtop: watching {len(settings.targets)} target(s) for "
          f"{settings.duration_s:g} s ...", file=sys.stderr)
    try:
        collector = asyncio.run(collect_live(settings, None if args.no_gpu else NvmlReader()))
    except CannotProbe as exc:
        raise NoData(str(exc)) from None
    for note in settings.notes:
        warn(f"kvtop: {note}")
    return collector.baseline(name=name, source={"kind": "live",
                                                 "time_scale": args.time_scale},
                              interval_s=args.interval)


def too_short(run: Baseline) -> str | None:
    """A warning when the run is too short to judge a later one against, else None."""
    minutes = max((engine.minutes for _, engine in run.engines()), default=0)
    if minutes >= SHORTEST_USEFUL_MIN:
        return None
    return (f"{minutes} whole minute(s) is too short to judge against: kvtop compare needs "
            f"{SHORTEST_USEFUL_MIN} a side before its rank test can find any change, and "
            f"says unknown until then; save one of {DEFAULT_DURATION} (the default)")


class NoData(Exception):
    """Nothing could be read or probed: exit 3."""


def has_data(run: Baseline) -> bool:
    return any(engine.samples for _, engine in run.engines())


# -- baseline actions ---------------------------------------------------------------------


def first(args: argparse.Namespace, what: str) -> str:
    """Take the leading name (NAME, BASELINE) off the positionals."""
    if not args.targets:
        raise ConfigError(f"give the {what} first")
    first, args.targets = args.targets[0], args.targets[1:]
    return str(first)


def run_save(args: argparse.Namespace) -> int:
    from kvtop.baseline import store
    from kvtop.baseline.model import BaselineError

    args.name = first(args, "baseline's NAME")
    if args.recording is not None and (args.targets or args.duration or args.probe):
        raise ConfigError("--from reads a recording: give no targets, --duration or --probe "
                          "with it (a probe needs a live server)")
    time_range(args, args.recording, "--from")
    try:
        path = store.baseline_path(args.name)
    except BaselineError as exc:
        raise ConfigError(str(exc)) from None
    if path.exists() and not args.force:
        raise ConfigError(f"baseline {args.name!r} exists ({path}); --force replaces it")
    name = path.stem if store.is_path(args.name) else args.name
    try:
        run = (from_recording(args.recording, args, name) if args.recording is not None
               else live(args, name))
    except NoData as exc:
        warn(f"kvtop baseline: {exc}")
        return EXIT_NO_DATA
    if not has_data(run):
        warn("kvtop baseline: no engine was read; nothing saved")
        return EXIT_NO_DATA
    if (short := too_short(run)) is not None:
        warn(f"kvtop baseline: {short}")
    try:
        store.save(run, args.name, overwrite=args.force)
    except OSError as exc:
        warn(f"kvtop baseline: cannot write {path}: {exc.strerror or exc}")
        return EXIT_USAGE
    if args.as_json:
        sys.stdout.write(run.dumps())
    else:
        engines = len(run.engines())
        print(display_text(f"saved baseline {name!r} to {path}: {engines} engine(s), "
                           f"{run.duration_s / 60:.1f} min"))
    return EXIT_OK


def run_list(args: argparse.Namespace) -> int:
    from kvtop.baseline import store
    from kvtop.baseline.text import render_list

    listed = store.list_saved()
    document = {"baselines": [
        {"name": e.name, "path": str(e.path), "error": e.error,
         "created": e.baseline.created if e.baseline else None,
         "duration_s": e.baseline.duration_s if e.baseline else None,
         "models": sorted({str(m.model) for _, m in e.baseline.engines()}) if e.baseline
         else []} for e in listed]}
    emit(document, args.as_json, lambda _doc: render_list(listed))
    return EXIT_OK


def load(spec: str) -> Baseline:
    from kvtop.baseline import store
    from kvtop.baseline.model import BaselineError

    try:
        return store.load(spec)
    except BaselineError as exc:
        raise ConfigError(str(exc)) from None


def run_show(args: argparse.Namespace) -> int:
    from kvtop.baseline import store
    from kvtop.baseline.text import render_baseline

    baseline = load(args.name)
    path = str(store.baseline_path(args.name))
    emit(baseline.to_json(), args.as_json,
         lambda _doc: render_baseline(baseline, path))
    return EXIT_OK


def run_rm(args: argparse.Namespace) -> int:
    from kvtop.baseline import store
    from kvtop.baseline.model import BaselineError

    try:
        path = store.remove(args.name)
    except BaselineError as exc:
        raise ConfigError(str(exc)) from None
    print(display_text(f"removed {path}"))
    return EXIT_OK
