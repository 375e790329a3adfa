"""Read many servers' ``/metrics`` at once: one shared aiohttp session, one task per target.

Every attempt becomes a :class:`~kvtop.collect.target.Scrape`; nothing here raises on a bad
server (:mod:`kvtop.collect.http` classifies each failure: ``Scrape.failure``).

A good body is read (parsed and adapted) by the poller, and handed on as
``Scrape.reading``: one over ``OFF_LOOP_CHARS`` in a worker thread, so a big or hostile body
never holds the event loop (the other targets, the keys) while it is read. The parser's
limits bound that work (~0.5 s of CPU at worst); a normal body (10-50 KB, ~0.1-0.3 ms) is
read in the loop, where a thread hop would cost more than the reading. Reading one target's
big bodies may take at most ``1 / READ_SHARE`` of a core: a body that costs 0.5 s to read
is read every 5 s at most, whatever the interval.

Narrowed reads (``Poller(narrow=...)``): a server built on prometheus_client renders only
the series named by ``name[]`` query arguments, at its ASGI/WSGI exposition handler. vLLM
mounts that handler under ``/metrics/`` (the exact ``/metrics`` is
prometheus-fastapi-instrumentator's route, which renders everything, uncompressed), so a
narrowed read asks ``<path>/?name[]=…`` for the samples kvtop's adapters read: ~10 KB
instead of ~50 KB, half of vLLM's own CPU per scrape. The first read names every sample
any adapter reads; once a server answers, only its adapter's. A server that cannot (SGLang
and vLLM with several API servers use prometheus_client's multiprocess collector, which
answers a named request with nothing; llama.cpp has no such route) is read at its URL as
given from then on, after one immediate retry; a failure makes the next attempt ask again,
since the server behind the URL may have changed.

At most ``MAX_IN_FLIGHT`` requests are in flight at once; the others wait their turn
before their deadline starts. With thousands of targets, the event loop's own work (~0.5 ms
of CPU per connection) would otherwise run every deadline out: 10,000 refused ports read
as thousands of "timeouts" (256 at once still let a loaded machine run some out). A hung
server holds its place until its deadline, but failing targets back off (to one attempt
in 30 s): it takes several hundred hung servers to slow the rest.

Schedule (``Poller.run``): each target has its own task; an attempt starts ``interval_s``
after the previous one *started* (or right after it ended when it ran longer), so attempts
for one target never overlap. A failing target backs off: the n-th consecutive failure waits
``interval * 2**(n-1)`` (±20 % jitter, never under ``interval``, at most ``max_backoff_s``);
the first success resets it.

The poller belongs to one event loop (the aiohttp session binds to it, and is made on first
use): create it anywhere, use and close it in one loop.
"""

from __future__ import annotations

import asyncio
import collections
import functools
import logging
import random
import time
from collections.abc import Iterable
from dataclasses import dataclass, field
from urllib.parse import quote, urlsplit, urlunsplit

import aiohttp

from kvtop.collect.adapters import WANTED, names_for
from kvtop.collect.http import (
    DEFAULT_MAX_BYTES,
    VERSION_TIMEOUT_S,
    make_session,
    read_version,
    scrape,
    within,
)
from kvtop.collect.source import OnScrape, deliver, read_scrape
from kvtop.collect.target import Scrape, Target

log = logging.getLogger(__name__)

DEFAULT_INTERVAL_S = 1.0
DEFAULT_MAX_BACKOFF_S = 30.0
OFF_LOOP_CHARS = 64 * 1024  # bodies longer than this are read in a worker thread
READ_SHARE = 10  # the next read of a target waits at least this many times its last read
MIN_INTERVAL_S = 0.05
MAX_IN_FLIGHT = 128

# ---------------------------------------------------------------------------- narrowed reads


def narrowed_url(url: str, names: Iterable[str]) -> str:
    """``url`` asking a prometheus_client exposition handler for only these sample names:
    the path gets a trailing ``/`` (where vLLM mounts that handler) and one ``name[]``
    argument per name, sorted, after any query the URL already has."""
    parts = urlsplit(url)
    path = parts.path if parts.path.endswith("/") else parts.path + "/"
    wanted = _names_query(frozenset(names))
    query = f"{parts.query}&{wanted}" if parts.query else wanted
    return urlunsplit((parts.scheme, parts.netloc, path, query, ""))


@functools.lru_cache(maxsize=16)
def _names_query(names: frozenset[str]) -> str:
    """Quoted once per set of names (~60 quote() calls: 10,000 targets must not pay them
    each)."""
    return "&".join(f"name%5B%5D={quote(name, safe='')}" for name in sorted(names))


# ---------------------------------------------------------------------------- the poller


@dataclass(slots=True)
class PollState:
    """What the poller remembers about one target between attempts."""

    failures: int = 0  # consecutive failed attempts; 0 after a success
    version: str | None = None
    last_ok_t: float | None = None  # unix time of the last successful scrape
    next_due: float | None = None  # loop.time() of the next planned attempt
    need_version: bool = True
    # Whether the narrowed URL works here: None not known yet, False ask for everything.
    narrows: bool | None = None
    narrowed_url: str | None = None  # once it works: asking for this server's names only
    read_s: float = 0.0  # seconds the last body took to read in a worker thread (else 0)
    jitter: float = 1.0
    lock: asyncio.Lock = field(default_factory=asyncio.Lock, repr=False)


def backoff_delay(
    failures: int, interval_s: float, max_backoff_s: float, jitter: float = 1.0
) -> float:
    """Seconds from one attempt's start to the next: ``interval_s`` while healthy, doubling
    per consecutive failure (times ``jitter``), never under the interval nor over the cap."""
    if failures <= 0:
        return interval_s
    cap = max(max_backoff_s, interval_s)
    base = interval_s * 2.0 ** min(failures - 1, 30)
    return max(interval_s, min(cap, base * jitter))


class Poller:
    """Polls many targets concurrently through one shared aiohttp session (its own, made on
    first use in the running loop, unless one is given).

    With ``narrow``, each target is asked for only the samples kvtop's adapters read (see
    the module's notes); the bodies delivered then hold just those.

    ``timeout_s`` defaults to ``clamp(2 × interval, 2 s, 5 s)``, following the interval when
    it changes: a loaded vLLM can take over a second to render /metrics (its GIL is busy),
    so at 1 Hz a 1 s timeout would flap, while 5 s still flags a dead host quickly. A long
    timeout slows only the target it hits.
    """

    def __init__(
        self,
        targets: Iterable[Target],
        *,
        interval_s: float = DEFAULT_INTERVAL_S,
        timeout_s: float | None = None,
        max_bytes: int = DEFAULT_MAX_BYTES,
        insecure: bool = False,
        max_backoff_s: float = DEFAULT_MAX_BACKOFF_S,
        session: aiohttp.ClientSession | None = None,
        seed: int | None = None,
        narrow: bool = False,
    ) -> None:
        # As given, so poll_once answers one Scrape per entry; a duplicate shares its state
        # and run() polls it once.
        self._targets: list[Target] = list(targets)
        self._states = {t: PollState() for t in self._targets}
        self._interval_s = _valid_interval(interval_s)
        self._timeout_s = timeout_s
        self.max_bytes = max_bytes
        self.max_backoff_s = max_backoff_s
        self._insecure = insecure
        self._narrow = narrow
        self._owns_session = session is None
        self._session = session
        self._rng = random.Random(seed)
        self._wake = asyncio.Event()
        self._in_flight = Gate(MAX_IN_FLIGHT)
        self._tasks: dict[Target, asyncio.Task[None]] = {}
        self._on_scrape: OnScrape | None = None

    # -- settings ---------------------------------------------------------------------

    @property
    def interval_s(self) -> float:
        return self._interval_s

    @interval_s.setter
    def interval_s(self, value: float) -> None:
        """Takes effect at once: sleeping targets wake and re-plan with the new interval."""
        self._interval_s = _valid_interval(value)
        self._wake.set()
        self._wake = asyncio.Event()

    @property
    def timeout_s(self) -> float:
        if self._timeout_s is not None:
            return self._timeout_s
        return min(5.0, max(2.0, 2.0 * self._interval_s))

    @timeout_s.setter
    def timeout_s(self, value: float | None) -> None:
        self._timeout_s = value

    @property
    def session(self) -> aiohttp.ClientSession:
        if self._session is None:
            self._session = make_session(insecure=self._insecure)
        return self._session

    @property
    def targets(self) -> tuple[Target, ...]:
        return tuple(self._targets)

    def state(self, target: Target) -> PollState:
        return self._states[target]

    def add_target(self, target: Target) -> None:
        """Start polling ``target`` (at once when ``run`` is going); a known one is ignored."""
        if target in self._states:
            return
        self._targets.append(target)
        self._states[target] = PollState()
        if self._on_scrape is not None:
            self._tasks[target] = asyncio.create_task(self._loop(target, self._on_scrape))

    def remove_target(self, target: Target) -> None:
        """Stop polling ``target``; its attempt in flight, if any, is cancelled."""
        if target not in self._states:
            return
        self._targets = [t for t in self._targets if t != target]
        del self._states[target]
        task = self._tasks.pop(target, None)
        if task is not None:
            task.cancel()

    # -- polling ----------------------------------------------------------------------

    async def poll_once(self) -> list[Scrape]:
        """Every target once, concurrently; one result per target given, in their order."""
        return list(await asyncio.gather(*(self._attempt(t) for t in self._targets)))

    async def run(self, on_scrape: OnScrape, *, stop: asyncio.Event | None = None) -> None:
        """Poll every target on its own schedule, calling ``on_scrape`` after each attempt,
        until ``stop`` is set or this coroutine is cancelled."""
        if self._on_scrape is not None:
            raise RuntimeError("Poller.run is already running")
        self._on_scrape = on_scrape
        self._tasks = {t: asyncio.create_task(self._loop(t, on_scrape)) for t in self._states}
        try:
            await (stop or asyncio.Event()).wait()
        finally:
            self._on_scrape = None
            tasks = list(self._tasks.values())
            self._tasks.clear()
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)

    async def _loop(self, target: Target, on_scrape: OnScrape) -> None:
        loop = asyncio.get_running_loop()
        while target in self._states:
            started = loop.time()
            try:
                result = await self._attempt(target)
                await deliver(on_scrape, result)
            except Exception:  # a bug must not stop this target's polling
                log.exception("polling %s failed", target.label)
            await self._pause(target, started)

    async def _attempt(self, target: Target) -> Scrape:
        state = self._states.get(target) or PollState()
        async with state.lock:  # poll_once during run never overlaps an attempt
            result = await self._read(target, state)
            if result.ok:
                if state.need_version:  # first success, or first after a failure
                    # a version once known is kept (the trackers keep it too)
                    state.version = await read_version(
                        self.session, target, timeout_s=min(VERSION_TIMEOUT_S, self.timeout_s)
                    ) or state.version
                    state.need_version = False
                result.version = state.version
                state.read_s = await interpret(result)
            if result.ok:
                state.failures, state.last_ok_t = 0, result.t
            else:
                state.failures += 1
                state.need_version = True
                state.jitter = self._rng.uniform(0.8, 1.2)
        return result

    async def _read(self, target: Target, state: PollState) -> Scrape:
        """One scrape, narrowed where the server allows it (see the module's notes)."""
        narrowed = self._narrow and state.narrows is not False
        if narrowed:
            result = await self._scrape(target, state.narrowed_url or _first_narrowed(target))
            if result.ok:
                if state.narrows is None:
                    state.narrows = True
                    state.narrowed_url = narrowed_url(target.url, names_for(result.body or ""))
                return result
            # A server that answered but not usably may not filter; a timeout is no sign,
            # and where no connection could be made, no other path answers either.
            unproven = (state.narrows is None and result.failure != "timeout"
                        and result.connected)
            if not (unproven or result.failure == "bad_payload"):
                state.narrows = state.narrowed_url = None
                return result
        result = await self._scrape(target)
        if not result.ok:
            state.narrows = state.narrowed_url = None
        elif narrowed:
            state.narrows = False
        return result

    async def _scrape(self, target: Target, url: str | None = None) -> Scrape:
        async with self._in_flight:
            return await scrape(self.session, target, timeout_s=self.timeout_s,
                                max_bytes=self.max_bytes, url=url)

    async def _pause(self, target: Target, started: float) -> None:
        """Sleep until the next attempt is due, re-planning when the interval changes."""
        loop = asyncio.get_running_loop()
        while (state := self._states.get(target)) is not None:
            delay = max(READ_SHARE * state.read_s, backoff_delay(
                state.failures, self._interval_s, self.max_backoff_s, state.jitter
            ))
            state.next_due = started + delay
            remaining = state.next_due - loop.time()
            if remaining <= 0:
                return
            try:
                await within(remaining, self._wake.wait())
            except (TimeoutError, asyncio.TimeoutError):
                return

    # -- lifetime ---------------------------------------------------------------------

    async def aclose(self) -> None:
        for task in self._tasks.values():
            task.cancel()
        if self._owns_session and self._session is not None:
            await self._session.close()
            self._session = None

    async def __aenter__(self) -> Poller:
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.aclose()


class Gate:
    """At most ``size`` holders at once, the others served first come, first served.

    asyncio.Semaphore before Python 3.12 removes a cancelled waiter from the middle of its
    queue and scans past woken ones: with 10,000 targets waiting, stopping took seconds.
    Here a waiter that leaves is skipped when its turn comes."""

    def __init__(self, size: int) -> None:
        self._free = size
        self._waiters: collections.deque[asyncio.Future[None]] = collections.deque()

    async def __aenter__(self) -> None:
        if self._free > 0 and not self._waiters:
            self._free -= 1
            return
        turn = asyncio.get_running_loop().create_future()
        self._waiters.append(turn)
        try:
            await turn
        except asyncio.CancelledError:
            if turn.done() and not turn.cancelled():  # the turn came as we left: pass it on
                self._release()
            raise

    async def __aexit__(self, *exc_info: object) -> None:
        self._release()

    def _release(self) -> None:
        while self._waiters:
            turn = self._waiters.popleft()
            if not turn.done():
                turn.set_result(None)
                return
        self._free += 1


async def interpret(result: Scrape) -> float:
    """Make a good scrape's reading (:func:`~kvtop.collect.source.read_scrape`). Returns the
    seconds a big body took to read in a worker thread (waits for the GIL count too: a busy
    process reads big bodies less often), 0 for a body read in the loop (~0.1-0.3 ms:
    nothing to pace)."""
    assert result.body is not None
    if len(result.body) > OFF_LOOP_CHARS:
        return await asyncio.to_thread(_timed_read, result)
    read_scrape(result)
    return 0.0


def _timed_read(result: Scrape) -> float:
    started = time.perf_counter()
    read_scrape(result)
    return time.perf_counter() - started


@functools.lru_cache(maxsize=1 << 15)  # a fleet of 10,000 must not evict its own
def _first_narrowed(target: Target) -> str:
    """The narrowed URL before the server's kind is known: every adapter's names."""
    return narrowed_url(target.url, WANTED)


def _valid_interval(value: float) -> float:
    value = float(value)
    if not value > 0:  # also rejects NaN
        raise ValueError(f"interval must be > 0 s, got {value}")
    return max(MIN_INTERVAL_S, value)
