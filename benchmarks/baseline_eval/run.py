"""How often ``kvtop compare`` cries wolf, and how often it catches a real change.

False alarms: N healthy runs of the simulated server that differ only in their seed (their
arrivals, lengths and prefixes), every pair compared both ways, counting comparisons where
any figure is flagged worse (and, separately, any figure flagged at all) and how often the
rank test alone fell under alpha. Detection: each change of scenarios.CHANGES run with
other seeds than the baseline's, counting how often the figures it should move are flagged.

    python -m benchmarks.baseline_eval.run --runs 40 --detect-seeds 5 [--minutes 20]

Numbers are quoted in docs/baseline-format.md.
"""

from __future__ import annotations

import argparse
import itertools
import time
from collections import Counter

from benchmarks.baseline_eval.scenarios import CHANGES, HEALTHY, baseline
from benchmarks.quick import parse_args, quick_option
from kvtop.baseline.compare import ALPHA, compare
from kvtop.baseline.model import Baseline

EXPECTED = {  # the figures each change must flag worse
    "leak": {"leak"},
    "fewer_blocks": {"kv_usage"},
    "prefix_caching_off": {"hit_rate", "kv_usage", "ttft_p99"},
    "double_rate": {"kv_usage", "waiting", "ttft_p99"},
}


def flags(base: Baseline, now: Baseline) -> tuple[dict[str, str], dict[str, float]]:
    (engine,) = compare(base, now).engines
    verdicts = {f.spec.key: f.verdict for f in engine.figures}
    verdicts["leak"] = engine.leak_verdict
    pvalues = {f.spec.key: f.p_value for f in engine.figures if f.p_value is not None}
    return verdicts, pvalues


def false_alarms(runs: int, minutes: float) -> None:
    started = time.process_time()
    summaries = [baseline(HEALTHY.but(seed=seed, minutes=minutes)) for seed in range(runs)]
    print(f"{runs} healthy runs of {minutes:g} min in "
          f"{time.process_time() - started:.0f} s CPU")
    worse_runs = any_runs = 0
    worse, flagged, significant, judged = Counter(), Counter(), Counter(), Counter()
    pairs = list(itertools.permutations(range(runs), 2))
    for a, b in pairs:
        verdicts, pvalues = flags(summaries[a], summaries[b])
        moved = {k: v for k, v in verdicts.items() if v not in ("same", "unknown")}
        worse_runs += any(v == "worse" for v in moved.values())
        any_runs += bool(moved)
        worse.update(k for k, v in moved.items() if v == "worse")
        flagged.update(moved.keys())
        judged.update(pvalues)
        significant.update(k for k, p in pvalues.items() if p < ALPHA)
    print(f"\n{len(pairs)} comparisons of healthy runs (every ordered pair):")
    print(f"  any figure worse:   {worse_runs} ({100 * worse_runs / len(pairs):.2f} %)")
    print(f"  any figure flagged: {any_runs} ({100 * any_runs / len(pairs):.2f} %)")
    print(f"\n  {'figure':22} {'p<alpha':>9} {'flagged':>9} {'worse':>7}  (of comparisons judged)")
    for key in judged:
        n = judged[key]
        print(f"  {key:22} {100 * significant[key] / n:8.2f}% {100 * flagged[key] / n:8.2f}% "
              f"{100 * worse[key] / n:6.2f}%")


def detection(seeds: int, minutes: float) -> None:
    print(f"\nDetection, baseline seed s vs the change with seed s + 100, {seeds} seeds:")
    prefix_base = HEALTHY.but(prefix_heavy=True)
    for name, spec in CHANGES.items():
        caught, flagged_worse = 0, Counter()
        for seed in range(seeds):
            base = baseline((prefix_base if name == "prefix_caching_off" else HEALTHY)
                            .but(seed=seed, minutes=minutes))
            verdicts, _ = flags(base, baseline(spec.but(seed=seed + 100, minutes=minutes)))
            worse = {k for k, v in verdicts.items() if v == "worse"}
            caught += EXPECTED[name] <= worse
            flagged_worse.update(worse)
        listed = ", ".join(f"{k} {n}/{seeds}" for k, n in flagged_worse.most_common())
        print(f"  {name:20} all expected flagged {caught}/{seeds}; worse: {listed}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=40)
    parser.add_argument("--detect-seeds", type=int, default=5)
    parser.add_argument("--minutes", type=float, default=HEALTHY.minutes,
                        help="length of every run (default 20, kvtop's default duration)")
    quick_option(parser, runs=2, detect_seeds=1, minutes=3.0)
    args = parse_args(parser)
    false_alarms(args.runs, args.minutes)
    detection(args.detect_seeds, args.minutes)


if __name__ == "__main__":
    main()
