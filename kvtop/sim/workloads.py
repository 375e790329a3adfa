"""Request streams for the simulator: synthetic, or replayed from real public traces (shipped
in kvtop/sim/traces/, or others of the same format in $KVTOP_TRACES_DIR).

Every workload is an endless iterator of `RequestSpec` in arrival order (simulated
seconds). Shared prompt prefixes are expressed as `prefix_keys`, one key per full
16-token block, so prefix caching sees exactly the sharing the workload has.
"""

from __future__ import annotations

import csv
import gzip
import json
import math
import os
import random
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from datetime import date
from functools import lru_cache
from pathlib import Path
from typing import Any, Literal

from kvtop.sim.engine import RequestSpec

TRACES_ENV = "KVTOP_TRACES_DIR"  # a folder with traces under their source names, instead
SHIPPED_DIR = Path(__file__).with_name("traces")  # the whole of each trace (README.md there)
MOONCAKE_FILE = "mooncake_conversation_trace.jsonl.gz"
MOONCAKE_SHIPPED = MOONCAKE_FILE
AZURE_FILE = "AzureLLMInferenceTrace_conv.csv"
AZURE_SHIPPED = "AzureLLMInferenceTrace_conv.csv.gz"
MOONCAKE_BLOCK_TOKENS = 512  # the trace hashes prompts in 512-token blocks
MOONCAKE_BUCKET_S = 3.0  # its arrivals are quantised to ~3 s buckets
WORKLOADS = ("synthetic", "mooncake", "azure", "none")
_AZURE_EPOCH = date(2023, 1, 1)


def trace_path(name: str, shipped_name: str, directory: Path | None = None) -> Path:
    """The trace ``name`` in ``directory`` or $KVTOP_TRACES_DIR when either is given, else the
    copy shipped inside the package."""
    env = os.environ.get(TRACES_ENV)
    folder = directory or (Path(env).expanduser() if env else None)
    path = folder / name if folder is not None else SHIPPED_DIR / shipped_name
    if not path.is_file():
        where = f" (from ${TRACES_ENV})" if directory is None and env else ""
        raise FileNotFoundError(f"trace {path} not found{where}")
    return path


def _lognormal(rng: random.Random, mean: float, sigma: float) -> float:
    return rng.lognormvariate(math.log(mean) - sigma * sigma / 2, sigma)


@dataclass(frozen=True)
class SyntheticSpec:
    rate: float = 8.0  # mean requests per simulated second
    arrival: Literal["poisson", "bursty"] = "poisson"
    burst_factor: float = 4.0  # bursty: rate during a burst, as a multiple of `rate`
    burst_len: float = 10.0  # bursty: seconds per burst; quiet gaps keep the mean at `rate`
    prompt_mean: float = 500.0  # user part of the prompt, tokens (lognormal)
    prompt_sigma: float = 0.8
    output_mean: float = 200.0
    output_sigma: float = 0.8
    max_prompt: int = 8000
    max_output: int = 2000
    groups: int = 4  # distinct system prompts
    system_prompt_len: int = 512
    shared_frac: float = 0.6  # requests that start with one of the system prompts
    eos_frac: float = 0.8  # requests that end with EOS before max_tokens
    abort_frac: float = 0.0  # clients that give up after `abort_after` seconds
    abort_after: float = 5.0


def synthetic(
    spec: SyntheticSpec | None = None, *, seed: int = 0, block_size: int = 16
) -> Iterator[RequestSpec]:
    """Poisson or bursty arrivals, lognormal lengths, groups sharing a system prompt."""
    spec = spec or SyntheticSpec()
    rng = random.Random(seed)
    system_blocks = spec.system_prompt_len // block_size
    prefixes = [tuple(("sys", seed, g, j) for j in range(system_blocks))
                for g in range(spec.groups)]
    for t in _arrivals(spec, rng):
        shared = bool(prefixes) and rng.random() < spec.shared_frac
        user = min(spec.max_prompt, max(1, round(_lognormal(rng, spec.prompt_mean,
                                                            spec.prompt_sigma))))
        out = min(spec.max_output, max(1, round(_lognormal(rng, spec.output_mean,
                                                           spec.output_sigma))))
        eos = rng.random() < spec.eos_frac
        abort = spec.abort_after if rng.random() < spec.abort_frac else None
        yield RequestSpec(
            arrival=t,
            prompt_len=user + (spec.system_prompt_len if shared else 0),
            max_tokens=round(out * rng.uniform(1.5, 4.0)) if eos else out,
            output_len=out,
            prefix_keys=rng.choice(prefixes) if shared else (),
            abort_after=abort,
        )


def _arrivals(spec: SyntheticSpec, rng: random.Random) -> Iterator[float]:
    t = 0.0
    if spec.arrival == "poisson":
        while True:
            t += rng.expovariate(spec.rate)
            yield t
    burst_rate = spec.rate * spec.burst_factor
    gap = spec.burst_len * (spec.burst_factor - 1)
    while True:
        end = t + spec.burst_len
        while (t := t + rng.expovariate(burst_rate)) < end:
            yield t
        t = end + gap


@dataclass(frozen=True)
class TraceRow:
    arrival: float  # seconds since the trace started
    prompt_len: int
    output_len: int
    hash_ids: tuple[int, ...] = ()


@lru_cache(maxsize=4)
def load_mooncake(path: Path) -> tuple[TraceRow, ...]:
    opener = gzip.open if path.suffix == ".gz" else open  # as published: plain JSON Lines
    with opener(path, "rt") as f:
        rows = [json.loads(line) for line in f if line.strip()]
    return tuple(TraceRow(r["timestamp"] / 1000, r["input_length"], r["output_length"],
                          tuple(r["hash_ids"])) for r in rows)


@lru_cache(maxsize=4)
def load_azure(path: Path) -> tuple[TraceRow, ...]:
    rows = []
    opener = gzip.open if path.suffix == ".gz" else open
    with opener(path, "rt", newline="") as f:
        for r in csv.DictReader(f):
            rows.append((_azure_seconds(r["TIMESTAMP"]), int(r["ContextTokens"]),
                         int(r["GeneratedTokens"])))
    if not rows:
        return ()  # its reader names it: a trace that holds no requests
    t0 = min(t for t, _, _ in rows)
    return tuple(TraceRow(t - t0, p, o) for t, p, o in sorted(rows))


def _azure_seconds(stamp: str) -> float:
    """'2023-11-16 18:15:46.6805900' (7 fractional digits) to seconds."""
    day, clock = stamp.split()
    h, m, s = clock.split(":")
    days = (date.fromisoformat(day) - _AZURE_EPOCH).days  # small, to keep the 100 ns digits
    return days * 86400 + int(h) * 3600 + int(m) * 60 + float(s)


def mooncake(
    *, directory: Path | None = None, rate_scale: float = 1.0, token_scale: float = 0.125,
    seed: int = 0, block_size: int = 16, spread: bool = True, max_tokens: int = 2048,
) -> Iterator[RequestSpec]:
    """Replay the Mooncake conversation trace with its real prefix sharing.

    Each 512-token hash id becomes 512*token_scale/block_size block keys, so requests that
    share hash ids share KV blocks. `token_scale` shrinks prompts to fit a small pool,
    `rate_scale` < 1 subsamples requests and > 1 compresses time; `spread` smears each 3 s
    arrival bucket uniformly over its 3 s. Loops for ever with fresh prefixes per pass.
    """
    rows = load_mooncake(trace_path(MOONCAKE_FILE, MOONCAKE_SHIPPED, directory))
    children = max(1, round(MOONCAKE_BLOCK_TOKENS * token_scale) // block_size)
    replayed = _replay(rows, rate_scale, random.Random(seed))
    if spread:
        replayed = _spread(replayed, MOONCAKE_BUCKET_S / max(rate_scale, 1.0))
    for lap, t, row in replayed:
        prompt = max(1, round(row.prompt_len * token_scale))
        keys = tuple(("mc", seed, lap, h, j) for h in row.hash_ids for j in range(children))
        yield RequestSpec(t, prompt, max(row.output_len, max_tokens), row.output_len,
                          keys[: prompt // block_size])


def _spread(replayed: Iterator[tuple[int, float, TraceRow]], width: float
            ) -> Iterator[tuple[int, float, TraceRow]]:
    """Space the arrivals that share one timestamp evenly over the next `width` seconds."""
    bucket: list[tuple[int, float, TraceRow]] = []
    for item in replayed:
        if bucket and item[1] != bucket[0][1]:
            yield from _spaced(bucket, width)
            bucket = []
        bucket.append(item)


def _spaced(bucket: list[tuple[int, float, TraceRow]], width: float
            ) -> Iterator[tuple[int, float, TraceRow]]:
    for k, (lap, t, row) in enumerate(bucket):
        yield lap, t + width * k / len(bucket), row


def azure(
    *, directory: Path | None = None, rate_scale: float = 1.0, token_scale: float = 1.0,
    seed: int = 0, block_size: int = 16, max_tokens: int = 2048,
    groups: int = 0, system_prompt_len: int = 0,
) -> Iterator[RequestSpec]:
    """Replay the Azure 2023 conversation trace: real arrivals and lengths, no sharing
    unless `groups` system prompts of `system_prompt_len` tokens are laid over it."""
    rows = load_azure(trace_path(AZURE_FILE, AZURE_SHIPPED, directory))
    rng = random.Random(seed)
    prefixes = [tuple(("az", seed, g, j) for j in range(system_prompt_len // block_size))
                for g in range(groups)]
    for _, t, row in _replay(rows, rate_scale, rng):
        prompt = max(1, round(row.prompt_len * token_scale))
        keys = rng.choice(prefixes) if prefixes else ()
        prompt = max(prompt, len(keys) * block_size + 1)
        yield RequestSpec(t, prompt, max(row.output_len, max_tokens), row.output_len, keys)


def _replay(rows: Sequence[TraceRow], rate_scale: float, rng: random.Random
            ) -> Iterator[tuple[int, float, TraceRow]]:
    """(lap, arrival, row) for ever: subsample below rate 1, compress time above it."""
    keep = min(1.0, rate_scale)
    speedup = max(1.0, rate_scale)
    span = rows[-1].arrival + MOONCAKE_BUCKET_S
    lap = 0
    while True:
        for row in rows:
            if keep >= 1.0 or rng.random() < keep:
                yield lap, (lap * span + row.arrival) / speedup, row
        lap += 1


def make_workload(
    kind: str, *, seed: int = 0, block_size: int = 16, **params: Any
) -> Iterator[RequestSpec]:
    """A workload by name ("synthetic", "mooncake", "azure", or "none": only what the
    OpenAI routes are sent) with its keyword params (a config's, untyped: the named
    workload's signature takes or refuses them)."""
    if kind == "none":
        return iter(())
    if kind == "synthetic":
        return synthetic(SyntheticSpec(**params), seed=seed,
                         block_size=block_size)
    if kind == "mooncake":
        return mooncake(seed=seed, block_size=block_size, **params)
    if kind == "azure":
        return azure(seed=seed, block_size=block_size, **params)
    raise ValueError(f"unknown workload {kind!r}; choose from {', '.join(WORKLOADS)}")
