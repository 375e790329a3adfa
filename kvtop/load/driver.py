"""The load driver: sends a workload's requests within a rate and a concurrency, and says
how each one went.

* ``--concurrency N`` alone: a closed loop, N requests in flight, each sent when the last
  one of its slot ends.
* ``--rate R``: an open loop, arrivals evenly spaced 1/R apart (so no window ever holds
  more than its share), at most N in flight; an arrival that finds N in flight is
  *dropped* and logged as such, never queued in the driver and sent late.
* a trace workload: the trace's own arrivals (rescaled to R on average when given), at
  most N in flight.

A request that fails before any answer (connection refused or reset) or that the server
asks to repeat (HTTP 429, 502, 503, 504) is retried up to ``retries`` times, after
``retry_after_s``; in an open loop a retry takes the place of the next arrival, so it never
adds to the rate. Retries are logged as later attempts and kept out of the main numbers.
Times are in the target's time (:class:`RunClock`): wall seconds times the time scale.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Literal

import aiohttp

from kvtop.load.openai_client import (
    CompletionResult,
    completion_request,
    stream_completion,
)
from kvtop.load.prompts import PromptMaker
from kvtop.load.workloads import Planned, Workload

Outcome = Literal["ok", "error", "timeout", "dropped", "cut"]


class RunClock:
    """Seconds since the run started in the target's time: wall seconds times ``scale``
    (1 for a real server, S for ``kvtop sim --speed S``)."""

    def __init__(self, scale: float = 1.0) -> None:
        self.scale = scale
        self._wall0 = time.perf_counter()
        self.unix0 = time.time()

    def now(self) -> float:
        return (time.perf_counter() - self._wall0) * self.scale

    def wall(self, seconds: float) -> float:
        """Wall seconds that ``seconds`` of target time take."""
        return seconds / self.scale

    def since_start(self, unix_t: float) -> float:
        """Target seconds since the start of a moment stamped with ``time.time()``."""
        return (unix_t - self.unix0) * self.scale

    async def sleep_until(self, t: float, stop: asyncio.Event | None = None) -> None:
        """Sleep until target time ``t``, or until ``stop`` is set."""
        delay = self.wall(t - self.now())
        if delay <= 0:
            return
        if stop is None:
            await asyncio.sleep(delay)
            return
        with contextlib.suppress(asyncio.TimeoutError):  # TimeoutError itself from 3.11
            await asyncio.wait_for(stop.wait(), delay)


@dataclass(frozen=True)
class DriverSettings:
    api_base: str  # ".../v1"
    model: str
    rate: float | None = None  # requests/s in target time; None: closed loop (or a trace)
    concurrency: int = 8  # most requests in flight, ever
    request_timeout_s: float = 300.0  # target time
    retries: int = 1
    retry_after_s: float = 1.0
    chat: bool = False
    token_ids: bool = False  # prompts as token ids (servers without a tokenizer)
    ignore_eos: bool = True
    seed: int = 0


@dataclass(slots=True)
class RequestRecord:
    """One attempt, for the per-request log (docs/rehearse.md): never any text."""

    id: int
    attempt: int
    cls: str
    t: float  # planned arrival: target seconds since the start of the run
    time: float  # unix seconds when it was sent (or dropped)
    status: Outcome
    planned_prompt_tokens: int
    max_tokens: int
    http_status: int | None = None
    error: str | None = None
    prompt_tokens: int | None = None
    completion_tokens: int | None = None
    ttft_s: float | None = None
    tpot_s: float | None = None
    itl_max_s: float | None = None
    total_s: float | None = None
    queued_s: float | None = None  # planned arrival to sending
    finish_reason: str | None = None
    retryable: bool = False  # not logged: whether the driver may send it again

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {}
        for name in LOGGED_FIELDS:
            value = getattr(self, name)
            out[name] = round(value, 6) if isinstance(value, float) else value
        return out

    def fill(self, result: CompletionResult) -> None:
        self.status = result.status
        self.http_status, self.error = result.http_status, result.error
        self.prompt_tokens = result.prompt_tokens
        self.completion_tokens = result.completion_tokens
        self.ttft_s, self.tpot_s = result.ttft_s, result.tpot_s
        self.itl_max_s, self.total_s = result.itl_max_s, result.total_s
        self.finish_reason = result.finish_reason
        self.retryable = result.retryable


LOGGED_FIELDS = tuple(name for name in RequestRecord.__slots__
                      if name != "retryable")


@dataclass
class _Retry:
    plan: Planned
    id: int
    attempt: int
    due: float


@dataclass
class DriverCounts:
    """What the driver has done so far (first attempts and retries apart)."""

    sent: int = 0
    dropped: int = 0
    retries: int = 0
    in_flight: int = 0
    max_in_flight: int = 0
    by_status: dict[str, int] = field(default_factory=dict)


class LoadDriver:
    """Sends ``workload`` until ``run``'s stop event; ``finish`` ends what is in flight."""

    def __init__(self, settings: DriverSettings, workload: Workload,
                 session: aiohttp.ClientSession, clock: RunClock,
                 on_record: Callable[[RequestRecord], None], *, token: str | None = None
                 ) -> None:
        self.settings = settings
        self.workload = workload
        self.session = session
        self.clock = clock
        self.on_record = on_record
        self.counts = DriverCounts()
        self._token = token
        self._prompts = PromptMaker(seed=settings.seed, token_ids=settings.token_ids)
        self._ids = itertools.count(1)
        self._retries: deque[_Retry] = deque()
        self._tasks: set[asyncio.Task[None]] = set()

    async def run(self, stop: asyncio.Event) -> None:
        """Send until ``stop`` is set; requests in flight then are left to ``finish``."""
        if self.workload.timed or self.settings.rate:
            await self._open_loop(stop)
        else:
            workers = [asyncio.create_task(self._worker(stop))
                       for _ in range(self.settings.concurrency)]
            self._tasks.update(workers)
            await stop.wait()

    async def finish(self, grace_s: float) -> None:
        """Wait up to ``grace_s`` (target time) for requests in flight, then cut them."""
        tasks = [t for t in self._tasks if not t.done()]
        if tasks and grace_s > 0:
            await asyncio.wait(tasks, timeout=self.clock.wall(grace_s))
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        self._tasks.clear()

    # -- loops ---------------------------------------------------------------------

    async def _open_loop(self, stop: asyncio.Event) -> None:
        start = self.clock.now()
        slot = 0
        plan: Planned | None = None
        while not stop.is_set():
            plan = plan or next(self.workload)
            at = start + self._offset(plan, slot)
            await self.clock.sleep_until(at, stop)
            if stop.is_set():
                break
            slot += 1
            retry = self._due_retry()
            if retry is not None:
                self._start(retry.plan, retry.id, retry.attempt, self.clock.now())
                if not self.workload.timed:
                    continue  # the retry took this arrival's place
            self._start(plan, next(self._ids), 1, at)
            plan = None

    def _offset(self, plan: Planned, slot: int) -> float:
        """Target seconds from the start to an arrival: a trace's own, else slot / rate."""
        if plan.at is not None:
            return plan.at
        assert self.settings.rate  # an open loop without a trace has a rate
        return slot / self.settings.rate

    def _due_retry(self) -> _Retry | None:
        if self._retries and self._retries[0].due <= self.clock.now():
            return self._retries.popleft()
        return None

    def _start(self, plan: Planned, request_id: int, attempt: int, planned_t: float) -> None:
        if self.counts.in_flight >= self.settings.concurrency:
            self._record_dropped(plan, request_id, attempt, planned_t)
            return
        task = asyncio.create_task(self._send_and_retry(plan, request_id, attempt, planned_t))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _send_and_retry(self, plan: Planned, request_id: int, attempt: int,
                              planned_t: float) -> None:
        record = await self._send(plan, request_id, attempt, planned_t)
        if self._should_retry(record):
            due = self.clock.now() + self.settings.retry_after_s
            self._retries.append(_Retry(plan, request_id, attempt + 1, due))

    async def _worker(self, stop: asyncio.Event) -> None:
        while not stop.is_set():
            plan, request_id, attempt = next(self.workload), next(self._ids), 1
            record = await self._send(plan, request_id, attempt, self.clock.now())
            while self._should_retry(record):
                await self.clock.sleep_until(self.clock.now() + self.settings.retry_after_s,
                                             stop)
                if stop.is_set():  # the stop ended the wait: nothing is sent after it
                    return
                attempt += 1
                record = await self._send(plan, request_id, attempt, self.clock.now())

    def _should_retry(self, record: RequestRecord) -> bool:
        """Whether the attempt may be sent again: once the run stops, no loop sends it."""
        return (record.status == "error" and record.retryable
                and record.attempt <= self.settings.retries)

    # -- one request ------------------------------------------------------------------

    async def _send(self, plan: Planned, request_id: int, attempt: int,
                    planned_t: float) -> RequestRecord:
        settings, counts = self.settings, self.counts
        record = RequestRecord(request_id, attempt, plan.cls, planned_t, time.time(), "cut",
                               plan.prompt_tokens, plan.max_tokens)
        prompt = self._prompts.make(plan.prompt_tokens, plan.shared)
        path, body = completion_request(settings.model, prompt, plan.max_tokens,
                                        chat=settings.chat, ignore_eos=settings.ignore_eos)
        counts.in_flight += 1
        counts.max_in_flight = max(counts.max_in_flight, counts.in_flight)
        counts.sent += 1
        counts.retries += attempt > 1
        sent_t = self.clock.now()
        record.queued_s = max(0.0, sent_t - planned_t)
        result = CompletionResult()
        try:
            await stream_completion(
                self.session, settings.api_base + path, body, token=self._token,
                timeout_s=self.clock.wall(settings.request_timeout_s), clock=self.clock.now,
                result=result)
            record.fill(result)
        except asyncio.CancelledError:  # cut by the end of the run: what it had got so far
            record.fill(result)
            record.status, record.total_s = "cut", self.clock.now() - sent_t
            raise
        finally:  # every attempt is logged, a cut one too
            counts.in_flight -= 1
            counts.by_status[record.status] = counts.by_status.get(record.status, 0) + 1
            self.on_record(record)
        return record

    def _record_dropped(self, plan: Planned, request_id: int, attempt: int,
                        planned_t: float) -> None:
        self.counts.dropped += 1
        self.counts.by_status["dropped"] = self.counts.by_status.get("dropped", 0) + 1
        self.on_record(RequestRecord(request_id, attempt, plan.cls, planned_t, time.time(),
                                     "dropped", plan.prompt_tokens, plan.max_tokens))
