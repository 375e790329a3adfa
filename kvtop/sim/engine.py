"""A vLLM V1 engine at block granularity: scheduler, prefix caching, preemption, clock.

Follows vllm/v1/core/sched/scheduler.py (0.33): each step first serves the running
requests in order (a request that cannot get a block preempts the most recently admitted
running request, by recompute), then, if nobody was preempted, admits waiting requests
FCFS while `max_num_seqs` and the token budget allow (chunked prefill). A step costs
simulated time from a simple GPU cost model, so the clock advances like a real server's.
"""

from __future__ import annotations

import random
import time
from collections import deque
from collections.abc import Callable, Hashable
from dataclasses import dataclass, field

from kvtop.sim.blocks import BlockPool, KVBlock, KVCacheManager, PoolEvent, Residency, chain_hash
from kvtop.sim.stats import EngineStats

MAX_KV_BATCHES = 10_000  # steps of KV events kept for a publisher that has not taken them


@dataclass(frozen=True)
class StepCost:
    """Seconds per engine step: fixed overhead, prefill compute, decode batch and KV reads."""

    base_ms: float = 5.0
    prefill_token_ms: float = 0.04
    decode_seq_ms: float = 0.1
    context_kilotoken_ms: float = 0.1  # attention reads grow with the decode batch's context

    def seconds(self, prefill_tokens: int, decode_seqs: int, decode_context: int) -> float:
        ms = (self.base_ms + self.prefill_token_ms * prefill_tokens
              + self.decode_seq_ms * decode_seqs
              + self.context_kilotoken_ms * decode_context / 1000)
        return ms / 1000


@dataclass(frozen=True)
class EngineConfig:
    num_gpu_blocks: int = 2000
    block_size: int = 16
    max_num_seqs: int = 64
    max_num_batched_tokens: int = 2048
    max_model_len: int | None = None  # None: what the KV cache can hold
    enable_prefix_caching: bool = True
    # vLLM's scheduler_reserve_full_isl (default on): admit a request only when its whole
    # prompt (plus output so far, if resumed) fits, not just the first prefill chunk.
    reserve_full_sequence: bool = True
    cost: StepCost = field(default_factory=StepCost)
    kv_cache_metrics: bool = False  # vLLM's --kv-cache-metrics (sample rate 1): residency
    kv_events: bool = False  # record the pool's KV events, one batch per step

    @property
    def model_len(self) -> int:
        """vLLM refuses to start when one request could not fit the cache; so do we."""
        capacity = (self.num_gpu_blocks - 1) * self.block_size
        return min(self.max_model_len or capacity, capacity)


@dataclass(frozen=True)
class RequestSpec:
    """One request as a client sends it; `prefix_keys` name its shareable full blocks."""

    arrival: float
    prompt_len: int
    max_tokens: int
    output_len: int | None = None  # EOS after this many tokens; None runs to max_tokens
    prefix_keys: tuple[Hashable, ...] = ()
    abort_after: float | None = None  # the client gives up this long after arrival


@dataclass(eq=False)
class Request:
    req_id: int
    prompt_len: int
    max_tokens: int
    stop_at: int
    prefix_keys: tuple[Hashable, ...]
    arrival: float
    num_output: int = 0
    num_computed: int = 0
    num_preemptions: int = 0
    cached_tokens: int = 0
    block_hashes: list[int] = field(default_factory=list)
    scheduled_at: float | None = None
    first_token_at: float | None = None
    last_token_at: float | None = None
    num_tokens: int = field(init=False)  # prompt + output; kept, not derived: hot path

    def __post_init__(self) -> None:
        self.num_tokens = self.prompt_len + self.num_output

    def block_key(self, index: int, block_size: int) -> Hashable:
        """Content of full block `index`: shared prompt blocks have workload keys."""
        if index < len(self.prefix_keys) and (index + 1) * block_size <= self.prompt_len:
            return self.prefix_keys[index]
        return ("u", self.req_id, index)


class Engine:
    def __init__(
        self, config: EngineConfig, *, clock: float = 0.0, created: float | None = None,
        seed: int = 0,
    ) -> None:
        self.config = config
        self.pool = BlockPool(config.num_gpu_blocks, config.enable_prefix_caching)
        self.kv = KVCacheManager(self.pool, config.block_size)
        self.clock = clock
        self.created = time.time() if created is None else created
        self.waiting: deque[Request] = deque()
        self.running: list[Request] = []
        self.requests: dict[int, Request] = {}
        self.leaked: list[tuple[Request | None, list[KVBlock]]] = []
        self.leak_frac = 0.0
        self.lump_blocks = 0.0  # blocks the next requests to end still leak at once
        self.stats = EngineStats(config.model_len)
        self.steps = 0
        # Told of every token (reason None) and finish (the reason) as it happens: how the
        # simulator's OpenAI routes stream a request's output with the engine's timing.
        self.on_output: Callable[[Request, str | None], None] | None = None
        self._rng = random.Random(seed)
        self._next_id = 0
        # (clock, events) per step that changed the prefix cache, for a KV-event publisher
        self.kv_batches: deque[tuple[float, list[PoolEvent]]] = deque(maxlen=MAX_KV_BATCHES)
        if config.kv_events:
            self.pool.events = []
        if config.kv_cache_metrics:
            self.pool.residency = Residency(lambda: self.clock, self.stats.observe)

    @property
    def has_work(self) -> bool:
        return bool(self.running or self.waiting)

    def add_request(self, spec: RequestSpec) -> Request | None:
        """Queue a request; None when vLLM would reject it (prompt too long for the model)."""
        model_len = self.config.model_len
        if not 0 < spec.prompt_len < model_len:
            return None
        max_tokens = max(1, min(spec.max_tokens, model_len - spec.prompt_len))
        stop_at = min(spec.output_len or max_tokens, max_tokens)
        req = Request(self._next_id, spec.prompt_len, max_tokens, max(stop_at, 1),
                      spec.prefix_keys, spec.arrival)
        self._next_id += 1
        self.requests[req.req_id] = req
        self.waiting.append(req)
        return req

    def abort(self, req_id: int) -> bool:
        req = self.requests.get(req_id)
        if req is None:
            return False
        self._finish(req, "abort")
        return True

    def step(self) -> float | None:
        """Run one engine step; its cost in seconds, or None when nothing could run."""
        if not self.has_work:
            return None
        scheduled, preempted = self._schedule()
        if not scheduled and not preempted:
            return None
        cost = self.config.cost.seconds(*self._batch_shape(scheduled))
        self.clock += cost
        self.steps += 1
        if scheduled:
            self.stats.observe("iteration_tokens_total", sum(n for _, n in scheduled))
        generated = 0
        for req, n in scheduled:
            req.num_computed += n
            if req.num_computed >= req.num_tokens:  # prefill done or a decode step
                self._emit_token(req)
                generated += 1
        self.stats.last_gen_throughput = generated / cost
        if self.pool.events:
            self.kv_batches.append((self.clock, self.pool.events))
            self.pool.events = []
        return cost

    def take_free_blocks(self) -> None:
        """Leak every free block at once: the pool a long leak ends with."""
        blocks = self.pool.allocate(self.pool.num_free_blocks)
        if blocks:
            self.leaked.append((None, blocks))

    def leaked_block_ids(self) -> set[int]:
        """Blocks still referenced only by requests that finished without freeing them."""
        live = {b.block_id for blocks in self.kv.req_blocks.values() for b in blocks}
        return {b.block_id for _, blocks in self.leaked for b in blocks} - live

    # -- scheduling ------------------------------------------------------------------

    def _schedule(self) -> tuple[list[tuple[Request, int]], bool]:
        budget = self.config.max_num_batched_tokens
        scheduled: list[tuple[Request, int]] = []
        preempted = False
        i = 0
        while i < len(self.running) and budget > 0:
            req = self.running[i]
            n = min(req.num_tokens - req.num_computed, budget)
            if n <= 0:
                i += 1
                continue
            new_blocks = self._allocate(req, n)
            while new_blocks is None:
                victim = self.running.pop()  # the most recently admitted
                self._preempt(victim)
                preempted = True
                if victim is req:
                    break
                new_blocks = self._allocate(req, n)
            if new_blocks is None:
                break
            scheduled.append((req, n))
            budget -= n
            i += 1
        if not preempted:
            budget = self._admit_waiting(scheduled, budget)
        return scheduled, preempted

    def _admit_waiting(self, scheduled: list[tuple[Request, int]], budget: int) -> int:
        admitted = queried = hits = 0
        while self.waiting and budget > 0 and len(self.running) < self.config.max_num_seqs:
            req = self.waiting[0]
            self._extend_hashes(req)
            computed, n_hit = self.kv.get_computed_blocks(req.block_hashes, req.num_tokens)
            n = min(req.num_tokens - n_hit, budget)
            if self.kv.allocate_slots(req.req_id, req.block_hashes, req.num_tokens, n_hit, n,
                                      computed, self.config.reserve_full_sequence) is None:
                break  # head-of-line: FCFS waits for capacity
            self.waiting.popleft()
            self.running.append(req)
            req.num_computed = n_hit
            if req.scheduled_at is None:
                req.scheduled_at = self.clock
            if req.num_preemptions == 0:
                req.cached_tokens = n_hit
                self._record_prefix_lookup(req, n_hit)
                admitted, queried, hits = admitted + 1, queried + req.num_tokens, hits + n_hit
            scheduled.append((req, n))
            budget -= n
        if admitted:
            self.stats.last_batch_hit_rate = hits / queried
        return budget

    def _record_prefix_lookup(self, req: Request, n_hit: int) -> None:
        """vLLM 0.33 counts tokens at admission, keeping re-admitted preempted requests apart."""
        if not self.config.enable_prefix_caching:
            return
        bs = self.config.block_size
        self.stats.prefix_queries += req.num_tokens
        self.stats.prefix_hits += n_hit
        self.stats.prefix_query_blocks += req.num_tokens // bs
        self.stats.prefix_hit_blocks += n_hit // bs

    def _allocate(self, req: Request, n: int) -> list[KVBlock] | None:
        if len(req.block_hashes) < req.num_tokens // self.config.block_size:
            self._extend_hashes(req)
        return self.kv.allocate_slots(req.req_id, req.block_hashes, req.num_tokens,
                                      req.num_computed, n)

    def _extend_hashes(self, req: Request) -> None:
        bs = self.config.block_size
        hashes = req.block_hashes
        while len(hashes) < req.num_tokens // bs:
            parent = hashes[-1] if hashes else None
            hashes.append(chain_hash(parent, req.block_key(len(hashes), bs)))

    def _preempt(self, req: Request) -> None:
        self.kv.free(req.req_id)
        req.num_computed = 0
        req.num_preemptions += 1
        self.stats.preemptions += 1
        self.waiting.appendleft(req)

    def _batch_shape(self, scheduled: list[tuple[Request, int]]) -> tuple[int, int, int]:
        prefill = decode = context = 0
        for req, n in scheduled:
            if n == 1 and req.num_output > 0 and req.num_computed == req.num_tokens - 1:
                decode += 1
                context += req.num_tokens
            else:
                prefill += n
        return prefill, decode, context

    # -- outputs -----------------------------------------------------------------------

    def _emit_token(self, req: Request) -> None:
        now = self.clock
        req.num_output += 1
        req.num_tokens += 1
        self.stats.generation_tokens += 1
        if req.first_token_at is None:
            req.first_token_at = now
            self.stats.prompt_tokens += req.prompt_len
            self.stats.prompt_tokens_cached += req.cached_tokens
            self.stats.observe("time_to_first_token_seconds", now - req.arrival)
        else:
            self.stats.observe("inter_token_latency_seconds", now - (req.last_token_at or now))
        req.last_token_at = now
        if self.on_output is not None:
            self.on_output(req, None)
        if req.num_output >= req.stop_at:
            self._finish(req, "length" if req.num_output >= req.max_tokens else "stop")

    def _finish(self, req: Request, reason: str) -> None:
        if req in self.waiting:
            self.waiting.remove(req)
        else:
            self.running.remove(req)
        del self.requests[req.req_id]
        lump = self.lump_blocks > 0
        if lump or (self.leak_frac > 0 and self._rng.random() < self.leak_frac):
            blocks = self.kv.forget(req.req_id)
            if blocks:
                self.leaked.append((req, blocks))
            if lump:
                self.lump_blocks = max(0.0, self.lump_blocks - len(blocks))
        else:
            self.kv.free(req.req_id)
        self.stats.finished[reason] += 1
        self._observe_finished(req)
        if self.on_output is not None:
            self.on_output(req, reason)

    def _observe_finished(self, req: Request) -> None:
        now, observe = self.clock, self.stats.observe
        observe("e2e_request_latency_seconds", now - req.arrival)
        observe("request_prompt_tokens", req.prompt_len)
        observe("request_generation_tokens", req.num_output)
        observe("request_max_num_generation_tokens", req.max_tokens)
        observe("request_params_max_tokens", req.max_tokens)
        observe("request_params_n", 1)
        observe("request_num_preemptions", req.num_preemptions)
        observe("request_prefill_kv_computed_tokens", req.prompt_len - req.cached_tokens)
        if req.scheduled_at is None:
            return
        observe("request_queue_time_seconds", req.scheduled_at - req.arrival)
        observe("request_inference_time_seconds", now - req.scheduled_at)
        if req.first_token_at is None:
            return
        decode_time = now - req.first_token_at
        observe("request_prefill_time_seconds", req.first_token_at - req.scheduled_at)
        observe("request_decode_time_seconds", decode_time)
        if req.num_output > 1:
            observe("request_time_per_output_token_seconds", decode_time / (req.num_output - 1))
