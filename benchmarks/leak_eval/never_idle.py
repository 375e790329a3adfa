"""Never-idle leak benchmark (issue 30): kvtop's detector on servers that never go idle.

Run: ``python -m benchmarks.leak_eval.never_idle [--part PART|all] [--quick] [--out DIR]
[--jobs N] [--only a,b] [--reuse] [--record-only]``, PART one of tune, held, fresh, final,
last, post.

Makes the cases of `never_idle_cases.py` (kvtop's simulator, and vLLM 0.33's own scheduler
where the twin interpreter is installed), replays each through the code of ``kvtop check
--replay`` and scores, per part: for leaks of at least 3 % of the pool (measured, one hour
after the start), the share that reach WATCH within 30 min and LEAK within 60 min; the same
for smaller leaks; false LEAKs (on look-alikes, and before any leak's start); which
look-alikes reach WATCH and why; the leaked-block estimate at the first LEAK. Recordings
go to DIR (default: a folder under the system temp dir), never into the repository. Tune on
``--part tune``; score a held-aside part (``held``, ``fresh``, ``final``, ``last``,
``post``) only at the end (``--record-only`` makes its recordings without scoring them).
Method and results: docs/leak-evaluation.md.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from concurrent.futures import ProcessPoolExecutor, as_completed
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from benchmarks.leak_eval.never_idle_cases import (
    LEAK_RUN_S,
    PARTS,
    Case,
    Part,
    cases,
    generate,
)
from benchmarks.leak_eval.run import commit
from kvtop.derive.worst import CheckRun
from kvtop.store.recording import read_recording
from twin.serve import twin_python

GOAL_SIZE = 0.03  # leaks of at least this share of the pool are the goal's
WATCH_S, LEAK_S = 1800.0, 3600.0  # the goal: WATCH within 30 min, LEAK within 60 min
GOAL_RATE = 0.9


@dataclass
class Result:
    name: str
    part: str
    family: str
    what: str
    engine: str
    blocks: int
    leaking: bool
    size: float = 0.0  # share of the pool leaked one hour after the start (the truth)
    watch_s: float | None = None  # from the leak start to the first WATCH-or-LEAK
    leak_s: float | None = None  # ...to the first LEAK
    false_watch: int = 0  # scrapes at WATCH-or-LEAK on healthy data
    false_leak: int = 0  # scrapes at LEAK on healthy data
    first_watch_reason: str = ""  # on healthy data
    estimate: float | None = None  # kvtop's leaked blocks at the first LEAK
    truth_at_leak: float | None = None
    idle_scrapes: int = 0  # scrapes with nothing running
    scrapes: int = 0
    max_usage: float = 0.0
    preemptions: float = 0.0
    seconds: float = 0.0
    states: dict[str, int] = field(default_factory=dict)

    def error(self) -> float | None:
        if self.estimate is None or not self.truth_at_leak:
            return None
        return (self.estimate - self.truth_at_leak) / self.truth_at_leak


def score(case: Case, recording: Path, truth: dict[str, Any]) -> Result:
    result = Result(case.name, case.part, case.family, case.what, case.engine, case.blocks,
                    case.leaking)
    rows = {row[0]: row for row in truth["scrapes"]}
    start = truth["leak_start_t"]
    run = CheckRun()
    first_preempt: float | None = None
    for scrape in read_recording(recording).in_time_order():
        run.feed(scrape)
        engines = run.trackers[scrape.target.url].state.engines
        if not engines or engines[0].leak is None:
            continue
        stats, verdict, row = engines[0], engines[0].leak, rows[scrape.t]
        result.scrapes += 1
        result.idle_scrapes += row[3] == 0
        result.states[verdict.state] = result.states.get(verdict.state, 0) + 1
        result.max_usage = max(result.max_usage, stats.kv_usage or 0.0)
        if stats.preemptions_total is not None:
            first_preempt = first_preempt if first_preempt is not None else (
                stats.preemptions_total)
            result.preemptions = stats.preemptions_total - first_preempt
        alarm = verdict.state in ("watch", "leak")
        healthy = start is None or scrape.t < start
        if healthy:
            result.false_watch += alarm
            result.false_leak += verdict.state == "leak"
            if alarm and not result.first_watch_reason:
                result.first_watch_reason = verdict.reason
            continue
        after = scrape.t - start
        if after <= LEAK_RUN_S:
            result.size = row[1] / case.blocks
        if alarm and result.watch_s is None:
            result.watch_s = after
        if verdict.state == "leak" and result.leak_s is None:
            result.leak_s = after
            result.estimate, result.truth_at_leak = verdict.leaked_blocks, row[1]
    return result


def run_one(case: Case, out: Path, reuse: bool, record_only: bool = False) -> Result | None:
    began = time.perf_counter()
    rec, truth = out / f"{case.name}.jsonl.gz", out / f"{case.name}.truth.json"
    if not (reuse and rec.exists() and truth.exists()):
        # kvtop's writer never overwrites a file: a run made anew clears the last one's.
        rec.unlink(missing_ok=True)
        truth.unlink(missing_ok=True)
        rec, truth = generate(case, out)
    if record_only:
        return None
    result = score(case, rec, json.loads(truth.read_text()))
    result.seconds = time.perf_counter() - began
    return result


def _minutes(seconds: float | None) -> str:
    return "—" if seconds is None else f"{seconds / 60:.0f}"


def table(results: list[Result]) -> str:
    lines = ["| case | engine | pool | what | size at 60 min | WATCH / LEAK after, min "
             "| estimate at LEAK | false WATCH / LEAK scrapes | idle scrapes | max usage "
             "| preemptions |", "|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in results:
        size = f"{r.size:.1%}" if r.leaking else "healthy"
        delays = f"{_minutes(r.watch_s)} / {_minutes(r.leak_s)}" if r.leaking else "—"
        err = r.error()
        estimate = "—" if err is None else f"{err:+.0%}"
        lines.append(f"| {r.name} | {r.engine} | {r.blocks} | {r.what} | {size} | {delays} "
                     f"| {estimate} | {r.false_watch} / {r.false_leak} | {r.idle_scrapes} "
                     f"| {r.max_usage:.2f} | {r.preemptions:.0f} |")
    return "\n".join(lines)


def _within(value: float | None, limit: float) -> bool:
    return value is not None and value <= limit


def summary(results: list[Result], part: str) -> list[str]:
    leaks = [r for r in results if r.leaking]
    big = [r for r in leaks if r.size >= GOAL_SIZE]
    small = [r for r in leaks if r.size < GOAL_SIZE]
    healthy = [r for r in results if not r.leaking]
    lines = [f"### Part: {part} ({len(leaks)} leaks, {len(healthy)} look-alikes)"]
    for label, group in ((f"leaks >= {GOAL_SIZE:.0%} of the pool", big),
                         (f"leaks < {GOAL_SIZE:.0%}", small)):
        if not group:
            continue
        watch = sum(_within(r.watch_s, WATCH_S) for r in group)
        leak = sum(_within(r.leak_s, LEAK_S) for r in group)
        both = sum(_within(r.watch_s, WATCH_S) and _within(r.leak_s, LEAK_S) for r in group)
        delays = [r.leak_s / 60 for r in group if r.leak_s is not None]
        med = f"{statistics.median(delays):.0f} min" if delays else "—"
        lines.append(f"- {label}: WATCH <= 30 min {watch}/{len(group)}, LEAK <= 60 min "
                     f"{leak}/{len(group)}, both {both}/{len(group)} "
                     f"({both / len(group):.0%}); median LEAK delay {med}")
    false_leak = [r.name for r in results if r.false_leak]
    lines.append(f"- false LEAK: {len(false_leak)} runs ({', '.join(false_leak) or 'none'})")
    watched = [r for r in healthy if r.false_watch]
    lines.append(f"- look-alikes reaching WATCH: {len(watched)} of {len(healthy)}")
    lines += [f"  - {r.name} ({r.family}), {r.false_watch} scrapes: {r.first_watch_reason}"
              for r in watched]
    pre = [r for r in leaks if r.false_watch]
    lines += [f"  - before the leak of {r.name}, {r.false_watch} scrapes: "
              f"{r.first_watch_reason}" for r in pre]
    errors = [e for r in big if (e := r.error()) is not None]
    if errors:
        within = sum(abs(e) <= 0.2 for e in errors)
        lines.append(f"- estimate at the first LEAK (leaks >= {GOAL_SIZE:.0%}): within 20 % "
                     f"{within}/{len(errors)}, median |error| "
                     f"{statistics.median(abs(e) for e in errors):.0%}")
    idle = sum(r.idle_scrapes for r in results)
    lines.append(f"- idle scrapes: {idle} of {sum(r.scrapes for r in results)}")
    if big:
        met = sum(_within(r.watch_s, WATCH_S) and _within(r.leak_s, LEAK_S) for r in big)
        ok = met / len(big) >= GOAL_RATE and not false_leak
        lines.append(f"- goal (>= {GOAL_RATE:.0%} of the >= 3 % leaks in time, 0 false LEAK): "
                     f"{'MET' if ok else 'MISSED'}")
    return lines


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--part", choices=(*PARTS, "all"), default="tune")
    ap.add_argument("--quick", action="store_true",
                    help="a smoke run: a leak and a look-alike on the smallest pool (~20 s)")
    ap.add_argument("--out", type=Path,
                    default=Path(tempfile.gettempdir()) / "kvtop-leak-never-idle")
    ap.add_argument("--jobs", type=int, default=2)
    ap.add_argument("--only", help="comma-separated case names")
    ap.add_argument("--reuse", action="store_true",
                    help="score the recordings already in --out (they are seeded)")
    ap.add_argument("--record-only", action="store_true",
                    help="make the recordings, score nothing (a held-aside part, early)")
    args = ap.parse_args()
    parts: list[Part] = list(PARTS) if args.part == "all" else [args.part]
    chosen = [c for part in parts for c in cases(part)
              if (c.quick or not args.quick) and (not args.only or c.name in args.only.split(","))]
    if not twin_python().exists():
        print("no twin interpreter: skipping the twin cases", file=sys.stderr)
        chosen = [c for c in chosen if c.engine != "twin"]
    args.out.mkdir(parents=True, exist_ok=True)
    began = time.perf_counter()
    done: dict[str, Result] = {}
    # The twin's first (longest), so that the two workers finish together.
    order = sorted(chosen, key=lambda c: (c.engine != "twin", -c.blocks))
    with ProcessPoolExecutor(max_workers=args.jobs) as pool:
        futures = {pool.submit(run_one, c, args.out, args.reuse, args.record_only): c
                   for c in order}
        for future in as_completed(futures):
            result = future.result()
            if result is None:
                print(f"  {futures[future].name}: recorded", file=sys.stderr, flush=True)
                continue
            done[result.name] = result
            print(f"  {result.name}: {result.seconds:.0f} s", file=sys.stderr, flush=True)
    if args.record_only:
        print(f"{len(chosen)} recordings in {args.out}, {time.perf_counter() - began:.0f} s")
        return 0
    results = [done[c.name] for c in chosen]
    (args.out / "results.json").write_text(json.dumps([asdict(r) for r in results]))
    print(table(results))
    for part in parts:
        print()
        print("\n".join(summary([r for r in results if r.part == part], part)))
    print(f"\ncommit {commit()}; {len(results)} cases in {time.perf_counter() - began:.0f} s; "
          f"recordings in {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
