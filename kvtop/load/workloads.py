"""What the load driver sends: an endless stream of planned requests (lengths, never text).

* ``mixed``: three classes in equal shares, the mix that exposes KV reclaim bugs fastest:
  short prompt / short output, long prompt / short output, short prompt / long output.
* ``shared-prefix``: one fixed long context followed by a varying question, so the prefix
  cache should hit on nearly all of it.
* traces: the real public traces kvtop's simulator replays (``mooncake``, ``azure``, or
  ``trace:FILE`` for such a file: Mooncake JSON Lines, gzipped or not, or the Azure CSV),
  with their arrival times and prompt/output lengths; Mooncake's 512-token block hashes
  become shared prompt segments, so requests share exactly the prefixes the trace says.

Lengths are fitted to the model: prompt + output never exceeds its context length. Numbers
per class: docs/rehearse.md.
"""

from __future__ import annotations

import random
from collections.abc import Hashable, Iterator
from dataclasses import dataclass
from pathlib import Path

from kvtop.sim.workloads import (
    AZURE_FILE,
    AZURE_SHIPPED,
    MOONCAKE_BLOCK_TOKENS,
    MOONCAKE_FILE,
    MOONCAKE_SHIPPED,
    TraceRow,
    load_azure,
    load_mooncake,
    trace_path,
)

NAMED = ("mixed", "shared-prefix", "mooncake", "azure")
DEFAULT_MODEL_LEN = 4096  # when the server does not say
SHORT_PROMPT = (64, 256)
SHORT_OUTPUT = (32, 128)
LONG_OUTPUT = (512, 1024)
LONG_PROMPT_FRAC = (0.25, 0.5)  # of the context length...
LONG_PROMPT_MAX = 8192  # ...and never more than this
SHARED_PREFIX_MAX = 4096  # the shared context: half the context length, at most this
QUESTION = (16, 128)
SHARED_OUTPUT = (32, 256)
TRACE_LENGTH_CLASSES = ((1024, "trace-short"), (4096, "trace-medium"))  # else "trace-long"


class WorkloadError(ValueError):
    """A workload that cannot be made (unknown name, missing or unreadable trace)."""


@dataclass(frozen=True, slots=True)
class Planned:
    """One request to send: its class (for the report), lengths, the shared segments its
    prompt starts with, and for trace workloads its arrival (seconds from the start)."""

    cls: str
    prompt_tokens: int
    max_tokens: int
    shared: tuple[tuple[Hashable, int], ...] = ()
    at: float | None = None


@dataclass
class Workload:
    """A named, endless stream of planned requests."""

    name: str
    plans: Iterator[Planned]
    timed: bool = False  # arrivals come from the workload (a trace), not from --rate
    mean_rate: float | None = None  # requests/s of a trace as replayed
    expected_hit_rate: float | None = None  # prefix-cache hits the workload should give

    def __iter__(self) -> Iterator[Planned]:
        return self.plans

    def __next__(self) -> Planned:
        return next(self.plans)


def make_workload(spec: str, *, model_len: int | None, seed: int = 0,
                  rate: float | None = None) -> Workload:
    """A workload by name or ``trace:FILE``; ``rate`` rescales a trace to that mean rate."""
    fit = _Fit(model_len or DEFAULT_MODEL_LEN)
    rng = random.Random(seed)
    if spec == "mixed":
        return Workload("mixed", _mixed(fit, rng))
    if spec == "shared-prefix":
        prefix = min(SHARED_PREFIX_MAX, fit.model_len // 2)
        mean_prompt = prefix + sum(QUESTION) / 2
        return Workload("shared-prefix", _shared_prefix(fit, rng, prefix),
                        expected_hit_rate=prefix / mean_prompt)
    if spec in ("mooncake", "azure"):
        return _trace(spec, _named_trace(spec), fit, rate)
    if spec.startswith("trace:"):
        path = Path(spec[len("trace:"):]).expanduser()
        return _trace(spec, path, fit, rate)
    raise WorkloadError(f"unknown workload {spec!r}: choose {', '.join(NAMED)} or trace:FILE")


@dataclass(frozen=True)
class _Fit:
    """Clamps lengths so prompt + output fits the model's context."""

    model_len: int

    def __call__(self, cls: str, prompt: int, output: int,
                 shared: tuple[tuple[Hashable, int], ...] = (), at: float | None = None
                 ) -> Planned:
        output = max(1, min(output, self.model_len // 2))
        prompt = max(1, min(prompt, self.model_len - output - 1))
        return Planned(cls, prompt, output, shared, at)


def _mixed(fit: _Fit, rng: random.Random) -> Iterator[Planned]:
    low, high = LONG_PROMPT_FRAC
    long_prompt = (int(fit.model_len * low), int(fit.model_len * high))
    long_prompt = (min(long_prompt[0], LONG_PROMPT_MAX // 2), min(long_prompt[1], LONG_PROMPT_MAX))
    long_output = (min(LONG_OUTPUT[0], fit.model_len // 8), min(LONG_OUTPUT[1], fit.model_len // 4))
    classes = (("short", SHORT_PROMPT, SHORT_OUTPUT),
               ("long-prompt", long_prompt, SHORT_OUTPUT),
               ("long-output", SHORT_PROMPT, long_output))
    while True:
        cls, prompt, output = rng.choice(classes)
        yield fit(cls, rng.randint(*prompt), rng.randint(*output))


def _shared_prefix(fit: _Fit, rng: random.Random, prefix: int) -> Iterator[Planned]:
    shared = ((("shared-context",), prefix),)
    while True:
        question = rng.randint(*QUESTION)
        yield fit("shared-prefix", prefix + question, rng.randint(*SHARED_OUTPUT), shared)


def _named_trace(name: str) -> Path:
    """The trace kvtop ships (or the one in $KVTOP_TRACES_DIR)."""
    names = (MOONCAKE_FILE, MOONCAKE_SHIPPED) if name == "mooncake" else \
        (AZURE_FILE, AZURE_SHIPPED)
    try:
        return trace_path(*names)
    except FileNotFoundError as exc:
        raise WorkloadError(f"{exc}; or pass --workload trace:FILE") from None


def _read_trace(path: Path) -> tuple[TraceRow, ...]:
    if not path.is_file():
        raise WorkloadError(f"trace file {path} not found")
    mooncake = any(path.name.endswith(ext) for ext in (".jsonl", ".jsonl.gz", ".json"))
    try:
        rows = load_mooncake(path) if mooncake else load_azure(path)
    except (OSError, ValueError, KeyError, TypeError, EOFError) as exc:
        kind = "a Mooncake JSON Lines" if mooncake else "an Azure CSV"
        raise WorkloadError(f"cannot read {path} as {kind} trace: "
                            f"{type(exc).__name__}: {exc}") from None
    if not rows:
        raise WorkloadError(f"trace {path} holds no requests")
    return rows


def _trace(name: str, path: Path, fit: _Fit, rate: float | None) -> Workload:
    rows = _read_trace(path)
    span = max(rows[-1].arrival - rows[0].arrival, 1.0)
    native = len(rows) / span
    span += 1 / native  # one mean gap between a lap's last request and the next lap's first
    speedup = rate / native if rate else 1.0
    return Workload(name, _replay(rows, span, speedup, fit), timed=True,
                    mean_rate=native * speedup)


def _replay(rows: tuple[TraceRow, ...], span: float, speedup: float, fit: _Fit
            ) -> Iterator[Planned]:
    """The trace for ever, each lap after the last, arrivals compressed by ``speedup``."""
    start = rows[0].arrival
    lap = 0
    while True:
        for row in rows:
            at = (lap * span + row.arrival - start) / speedup
            shared = tuple(((lap, h), MOONCAKE_BLOCK_TOKENS) for h in row.hash_ids)
            yield fit(_length_class(row.prompt_len), row.prompt_len, row.output_len,
                      shared, at)
        lap += 1


def _length_class(prompt: int) -> str:
    for limit, cls in TRACE_LENGTH_CLASSES:
        if prompt < limit:
            return cls
    return "trace-long"
