"""One simulated server without HTTP: engine + arriving workload + faults + clock.

The clock is simulated seconds since the server started. `advance_to` interleaves
arrivals, client aborts, faults and engine steps in time order; when the engine has
nothing to do (or is stalled) the clock jumps to the next event. Ground truth for tests
comes from `truth()`, never from `/metrics`.
"""

from __future__ import annotations

import heapq
import time
from collections.abc import Callable, Hashable, Iterable, Iterator, Mapping
from dataclasses import dataclass
from types import MappingProxyType

from kvtop.sim.engine import Engine, EngineConfig, Request, RequestSpec
from kvtop.sim.faults import Fault, FaultKind, FaultSchedule, FaultState

# Told of each token (reason None) and of the end ("length", "stop", "abort", or "lost"
# when the server restarted) of a request submitted through `Simulation.submit`.
Listener = Callable[[Request, "str | None"], None]


@dataclass(frozen=True)
class Truth:
    """What the simulated server really holds; `/metrics` should agree with it."""

    sim_time: float
    created: float
    restarts: int
    stalled: bool
    leak_frac: float
    num_gpu_blocks: int
    block_size: int
    used_blocks: int
    free_blocks: int
    cached_free_blocks: int
    leaked_blocks: int
    leaked_requests: int
    kv_usage: float
    running: int
    waiting: int
    prefix_queries: int
    prefix_hits: int
    preemptions: int
    prompt_tokens: int
    generation_tokens: int
    finished: Mapping[str, int]
    steps: int

    @property
    def hit_rate(self) -> float | None:
        """Lifetime prefix-cache hit rate in tokens (hits / queries)."""
        return self.prefix_hits / self.prefix_queries if self.prefix_queries else None


class Simulation:
    def __init__(
        self,
        config: EngineConfig,
        requests: Iterable[RequestSpec],
        faults: Iterable[Fault] = (),
        *,
        seed: int = 0,
        wall_clock: Callable[[], float] = time.time,
    ) -> None:
        self.config = config
        self.seed = seed
        self.restarts = 0
        self.rejected = 0
        self.state = FaultState()
        self._wall_clock = wall_clock
        self._arrivals: Iterator[RequestSpec] = iter(requests)
        self._next_arrival = next(self._arrivals, None)
        self._aborts: list[tuple[float, int]] = []
        self._faults = FaultSchedule(faults)
        self._resume_at = float("inf")
        self._listeners: dict[int, Listener] = {}
        self.engine = self._new_engine(0.0)
        self._fire_due()  # faults and arrivals at t=0 are in force from the start

    @property
    def clock(self) -> float:
        return self.engine.clock

    def add_fault(self, fault: Fault) -> None:
        self._faults.add(fault)

    def inject(self, kind: FaultKind, value: float | str | None = None) -> None:
        """Apply a fault now (tests and interactive use)."""
        self._apply(Fault(self.clock, kind, value))

    def restart(self) -> None:
        """A new engine: empty pool, counters at zero, new `_created` timestamps. Requests
        submitted through the API are lost (their listeners hear "lost")."""
        self.restarts += 1
        self._aborts.clear()
        # a listener is dropped when its request ends: each one left has a request running
        lost = [(self.engine.requests[req_id], listener)
                for req_id, listener in self._listeners.items()]
        self._listeners.clear()
        self.engine = self._new_engine(self.clock)
        self.engine.leak_frac = self.state.leak_frac
        for req, listener in lost:
            listener(req, "lost")

    def submit(self, prompt_len: int, max_tokens: int, prefix_keys: tuple[Hashable, ...],
               listener: Listener) -> Request | None:
        """A request arriving now from outside the workload (the OpenAI routes): the
        engine runs it to `max_tokens`, calling ``listener(req, None)`` per token and
        ``listener(req, reason)`` when it ends. None when vLLM would reject it."""
        spec = RequestSpec(self.clock, prompt_len, max_tokens, prefix_keys=prefix_keys)
        req = self.engine.add_request(spec)
        if req is None:
            self.rejected += 1
            return None
        self._listeners[req.req_id] = listener
        return req

    def abort(self, req: Request) -> None:
        """The client went away: end `req` if it still runs in this engine."""
        if self.engine.requests.get(req.req_id) is req:
            self.engine.abort(req.req_id)

    def _new_engine(self, clock: float) -> Engine:
        engine = Engine(self.config, clock=clock, created=self._wall_clock(),
                        seed=self.seed + self.restarts)
        engine.on_output = self._on_output
        return engine

    def _on_output(self, req: Request, reason: str | None) -> None:
        listener = self._listeners.get(req.req_id)
        if listener is None:
            return
        if reason is not None:
            del self._listeners[req.req_id]
        listener(req, reason)

    def advance_to(self, t: float, max_steps: int | None = None) -> bool:
        """Run until the clock reaches `t`; False if `max_steps` steps ran out first."""
        steps = 0
        while self.clock < t:
            self._fire_due()
            if max_steps is not None and steps >= max_steps:
                return False
            if not self.state.stalled and self.engine.step() is not None:
                steps += 1
                continue
            self.engine.clock = max(self.clock, min(self._next_event(), t))
        self._fire_due()
        return True

    def truth(self) -> Truth:
        engine, pool, stats = self.engine, self.engine.pool, self.engine.stats
        return Truth(
            sim_time=self.clock,
            created=engine.created,
            restarts=self.restarts,
            stalled=self.state.stalled,
            leak_frac=self.state.leak_frac,
            num_gpu_blocks=pool.num_gpu_blocks,
            block_size=self.config.block_size,
            used_blocks=pool.num_used_blocks,
            free_blocks=pool.num_free_blocks,
            cached_free_blocks=pool.num_cached_free_blocks(),
            leaked_blocks=len(engine.leaked_block_ids()),
            leaked_requests=sum(req is not None for req, _ in engine.leaked),
            kv_usage=pool.usage(),
            running=len(engine.running),
            waiting=len(engine.waiting),
            prefix_queries=stats.prefix_queries,
            prefix_hits=stats.prefix_hits,
            preemptions=stats.preemptions,
            prompt_tokens=stats.prompt_tokens,
            generation_tokens=stats.generation_tokens,
            finished=MappingProxyType(dict(stats.finished)),
            steps=engine.steps,
        )

    def _next_event(self) -> float:
        arrival = self._next_arrival.arrival if self._next_arrival else float("inf")
        abort = self._aborts[0][0] if self._aborts else float("inf")
        return min(arrival, abort, self._faults.next_time(), self._resume_at)

    def _fire_due(self) -> None:
        now = self.clock
        for fault in self._faults.pop_due(now):
            self._apply(fault)
        if self._resume_at <= now:
            self._apply(Fault(self._resume_at, "resume"))
        while self._next_arrival is not None and self._next_arrival.arrival <= now:
            self._arrive(self._next_arrival)
            self._next_arrival = next(self._arrivals, None)
        while self._aborts and self._aborts[0][0] <= now:
            self.engine.abort(heapq.heappop(self._aborts)[1])

    def _arrive(self, spec: RequestSpec) -> None:
        req = self.engine.add_request(spec)
        if req is None:
            self.rejected += 1
        elif spec.abort_after is not None:
            heapq.heappush(self._aborts, (spec.arrival + spec.abort_after, req.req_id))

    def _apply(self, fault: Fault) -> None:
        self.state.apply(fault)
        if fault.kind == "restart":
            self.restart()
        if fault.kind == "stall":
            duration = fault.value
            self._resume_at = float("inf") if duration is None else fault.at + float(duration)
        elif fault.kind == "lump":
            self.engine.lump_blocks += float(fault.value or 0.0)
        elif fault.kind == "wedge":
            self.engine.take_free_blocks()
            self._resume_at = float("inf")
        elif fault.kind in ("resume", "restart"):
            self._resume_at = float("inf")
        self.engine.leak_frac = self.state.leak_frac
