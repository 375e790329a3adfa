"""The scheduler: batching limits, chunked prefill, prefix counters, preemption, leaks.

What the simulated vLLM engine records, as kvtop's demo and tests read it back: each
request's times in vLLM's histograms, preemptions counted per event and per request, the
token and finish stream the OpenAI routes relay, prefix blocks shared only when they hold
nothing but a shared prompt, leaks of whole requests, and steps that cost time only when
something ran."""

from __future__ import annotations

import time

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from kvtop.sim.engine import Engine, EngineConfig, Request, RequestSpec, StepCost
from tests.scenarios.sim_invariants import check_pool_invariants
from tests.support.mutation_run import examples

SYSTEM_512 = tuple(("sys", j) for j in range(32))  # a 512-token shared system prompt


def drain(engine: Engine, limit: int = 100_000) -> None:
    for _ in range(limit):
        if engine.step() is None:
            return
        check_pool_invariants(engine)
    raise AssertionError("engine did not drain")


def test_prefix_counters_are_tokens_counted_at_admission() -> None:
    engine = Engine(EngineConfig(num_gpu_blocks=200))
    engine.add_request(RequestSpec(0.0, 600, 4, prefix_keys=SYSTEM_512))
    drain(engine)
    engine.add_request(RequestSpec(0.0, 700, 4, prefix_keys=SYSTEM_512))
    drain(engine)
    stats = engine.stats
    assert stats.prefix_queries == 600 + 700
    assert stats.prefix_hits == 512  # the 32 shared blocks of the second request
    assert stats.prompt_tokens == 1300
    assert stats.prompt_tokens_cached == 512
    assert engine.pool.usage() == 0.0


def test_no_prefix_counting_without_caching() -> None:
    engine = Engine(EngineConfig(num_gpu_blocks=200, enable_prefix_caching=False))
    for _ in range(2):
        engine.add_request(RequestSpec(0.0, 600, 4, prefix_keys=SYSTEM_512))
        drain(engine)
    assert engine.stats.prefix_queries == engine.stats.prefix_hits == 0


def test_chunked_prefill_respects_token_budget() -> None:
    engine = Engine(EngineConfig(num_gpu_blocks=1000, max_num_batched_tokens=2048))
    req = engine.add_request(RequestSpec(0.0, 5000, 3))
    assert req is not None
    engine.step()
    engine.step()
    assert req.num_computed == 4096 and req.num_output == 0
    engine.step()
    assert req.num_output == 1  # first token after the third chunk
    assert engine.stats.hist["iteration_tokens_total"].sum == 5000


def test_max_num_seqs_limits_running() -> None:
    engine = Engine(EngineConfig(num_gpu_blocks=1000, max_num_seqs=3))
    for _ in range(10):
        engine.add_request(RequestSpec(0.0, 20, 50))
    engine.step()
    assert len(engine.running) == 3 and len(engine.waiting) == 7
    drain(engine)
    assert engine.stats.finished["length"] == 10


def test_preemption_takes_the_most_recently_admitted() -> None:
    # 9 usable blocks of 16 tokens; three requests of 40 tokens take 3 blocks each.
    engine = Engine(EngineConfig(num_gpu_blocks=10, max_num_seqs=8))
    reqs = [engine.add_request(RequestSpec(0.0, 40, 200)) for _ in range(3)]
    engine.step()
    assert engine.pool.num_free_blocks == 0
    for _ in range(9):  # KV for tokens 41..48 fits; the 49th needs a fourth block
        engine.step()
    assert engine.stats.preemptions >= 1
    assert reqs[2] in engine.waiting and reqs[2].num_preemptions == 1
    assert reqs[2].num_computed == 0
    assert reqs[0].num_preemptions == 0
    drain(engine)
    assert engine.pool.usage() == 0.0


@pytest.mark.parametrize("reserve", [True, False])
def test_admission_waits_until_the_whole_prompt_fits(reserve: bool) -> None:
    # 19 usable blocks; A holds 13 (200 tokens + output), B's 160-token prompt needs 10.
    # vLLM 0.33 (scheduler_reserve_full_isl) keeps B waiting although its first 32-token
    # chunk would fit; without the gate B is admitted and fills the pool chunk by chunk.
    engine = Engine(EngineConfig(num_gpu_blocks=20, max_num_batched_tokens=32,
                                 reserve_full_sequence=reserve))
    a = engine.add_request(RequestSpec(0.0, 200, 8))
    for _ in range(7):  # A's prefill
        engine.step()
    b = engine.add_request(RequestSpec(0.0, 160, 8))
    engine.step()
    assert a in engine.running
    assert (b in engine.waiting) is reserve
    drain(engine)
    assert engine.pool.usage() == 0.0


def test_finish_by_eos_or_length_and_abort() -> None:
    engine = Engine(EngineConfig(num_gpu_blocks=100))
    engine.add_request(RequestSpec(0.0, 30, 100, output_len=5))
    engine.add_request(RequestSpec(0.0, 30, 5))
    victim = engine.add_request(RequestSpec(0.0, 30, 100))
    engine.step()
    assert victim is not None and engine.abort(victim.req_id)
    assert not engine.abort(victim.req_id)
    drain(engine)
    assert engine.stats.finished == {"stop": 1, "length": 1, "abort": 1, "error": 0,
                                     "repetition": 0}
    assert engine.pool.usage() == 0.0


def test_rejects_prompts_longer_than_the_model() -> None:
    engine = Engine(EngineConfig(num_gpu_blocks=10))  # 144 tokens of cache
    assert engine.add_request(RequestSpec(0.0, 144, 1)) is None
    req = engine.add_request(RequestSpec(0.0, 100, 500))
    assert req is not None and req.max_tokens == 44


def test_leak_leaves_exactly_the_leaked_blocks_at_idle() -> None:
    engine = Engine(EngineConfig(num_gpu_blocks=500))
    engine.leak_frac = 1.0
    for i in range(5):
        engine.add_request(RequestSpec(0.0, 100 + i, 20))
    drain(engine)
    leaked = len(engine.leaked_block_ids())
    assert leaked == 5 * 8  # (100..104 + 20) tokens = 8 blocks each
    assert engine.pool.num_used_blocks == leaked
    assert engine.pool.usage() == pytest.approx(leaked / 499, rel=1e-12)


def test_clock_advances_by_step_cost() -> None:
    cost = StepCost(base_ms=10, prefill_token_ms=1, decode_seq_ms=2, context_kilotoken_ms=0)
    engine = Engine(EngineConfig(num_gpu_blocks=100, cost=cost))
    engine.add_request(RequestSpec(0.0, 50, 3))
    assert engine.step() == pytest.approx(0.060)  # 10 + 50 prefill tokens
    assert engine.step() == pytest.approx(0.012)  # 10 + one decode sequence
    assert engine.clock == pytest.approx(0.072)
    engine.step()
    ttft = engine.stats.hist["time_to_first_token_seconds"]
    assert ttft.count == 1 and ttft.sum == pytest.approx(0.060)


request_st = st.tuples(
    st.integers(1, 300),  # prompt tokens
    st.integers(1, 60),  # max tokens
    st.booleans(),  # starts with the shared prefix
    st.integers(0, 30),  # arrival step
    st.booleans(),  # aborted two steps after arrival
)


@settings(max_examples=examples(40), deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    requests=st.lists(request_st, min_size=1, max_size=25),
    num_blocks=st.integers(24, 120),
    max_num_seqs=st.integers(1, 8),
    budget=st.sampled_from([16, 64, 512]),
    leak_frac=st.sampled_from([0.0, 0.5, 1.0]),
    caching=st.booleans(),
)
def test_invariants_hold_on_random_workloads(
    requests: list[tuple[int, int, bool, int, bool]], num_blocks: int, max_num_seqs: int,
    budget: int, leak_frac: float, caching: bool,
) -> None:
    engine = Engine(EngineConfig(num_gpu_blocks=num_blocks, max_num_seqs=max_num_seqs,
                                 max_num_batched_tokens=budget, enable_prefix_caching=caching))
    engine.leak_frac = leak_frac
    prefix = tuple(("p", j) for j in range(4))
    aborts: dict[int, list[int]] = {}
    # arrivals end by step 30; then enough steps for every token of every request several
    # times over (recompute after preemption), so only a leak can leave work undone
    steps = 400 + 4 * sum(prompt + max_tokens + 2 for prompt, max_tokens, *_ in requests)
    for step in range(steps):
        if step >= 400 and not engine.has_work:
            break
        for prompt, max_tokens, shared, at, abort in requests:
            if at == step:
                keys = prefix if shared and prompt > 64 else ()
                req = engine.add_request(RequestSpec(float(step), prompt, max_tokens,
                                                     prefix_keys=keys))
                if req is not None and abort:
                    aborts.setdefault(step + 2, []).append(req.req_id)
        for req_id in aborts.pop(step, []):
            engine.abort(req_id)
        engine.step()
        check_pool_invariants(engine)
        assert engine.stats.prefix_hits <= engine.stats.prefix_queries
    leaked = len(engine.leaked_block_ids())
    if not engine.has_work:
        # Idle: usage is exactly the leaked blocks (0.0 without a leak).
        assert engine.pool.num_used_blocks == leaked
        assert engine.pool.usage() == pytest.approx(leaked / (num_blocks - 1), rel=1e-12)
        if leak_frac == 0.0:
            assert engine.pool.usage() == 0.0
    else:
        # Only leaked blocks can keep an engine from finishing its work.
        assert leaked > 0


COST = StepCost(base_ms=10, prefill_token_ms=1, decode_seq_ms=2, context_kilotoken_ms=0)


SYSTEM = tuple(("sys", j) for j in range(4))  # a 64-token shared system prompt


def sums(engine: Engine) -> dict[str, tuple[int, float]]:
    return {name: (h.count, h.sum) for name, h in engine.stats.hist.items()}


def test_a_requests_times_go_into_vllms_histograms() -> None:
    # arrives at 99 s, admitted at 100 s; prefill 50 tokens (60 ms), two decodes (12 ms each)
    engine = Engine(EngineConfig(num_gpu_blocks=100, cost=COST), clock=100.0)
    engine.add_request(RequestSpec(99.0, 50, 3))
    drain(engine)
    assert engine.steps == 3 and engine.clock == pytest.approx(100.084)
    h = sums(engine)
    expected = {
        "e2e_request_latency_seconds": 1.084, "request_queue_time_seconds": 1.0,
        "request_inference_time_seconds": 0.084, "request_prefill_time_seconds": 0.060,
        "request_decode_time_seconds": 0.024, "request_time_per_output_token_seconds": 0.012,
        "time_to_first_token_seconds": 1.060,
    }
    for name, seconds in expected.items():
        assert h[name][0] == 1 and h[name][1] == pytest.approx(seconds), name
    assert h["inter_token_latency_seconds"] == (2, pytest.approx(0.024))
    assert h["request_params_n"] == (1, 1.0)
    assert h["request_prompt_tokens"] == (1, 50.0)
    assert h["request_generation_tokens"] == (1, 3.0)
    assert h["request_prefill_kv_computed_tokens"] == (1, 50.0)
    assert h["request_num_preemptions"] == (1, 0.0)


@pytest.mark.parametrize("tokens, per_output_token", [(1, None), (2, 0.012)])
def test_time_per_output_token_needs_a_second_token(tokens: int,
                                                     per_output_token: float | None) -> None:
    engine = Engine(EngineConfig(num_gpu_blocks=100, cost=COST))
    engine.add_request(RequestSpec(0.0, 50, tokens))
    drain(engine)
    count, total = sums(engine)["request_time_per_output_token_seconds"]
    assert (count, total) == ((0, 0.0) if per_output_token is None
                              else (1, pytest.approx(per_output_token)))


def test_a_request_aborted_before_it_ran_has_an_e2e_time_only() -> None:
    engine = Engine(EngineConfig(num_gpu_blocks=100, cost=COST), clock=5.0)
    req = engine.add_request(RequestSpec(4.0, 50, 3))
    assert req is not None and engine.abort(req.req_id) is True
    assert engine.abort(req.req_id) is False  # already gone
    h = sums(engine)
    assert h["e2e_request_latency_seconds"] == (1, 1.0)
    assert h["request_queue_time_seconds"][0] == h["time_to_first_token_seconds"][0] == 0
    assert h["request_prefill_kv_computed_tokens"] == (1, 50.0)  # nothing of it was cached


def test_a_cached_prefix_is_not_computed_again() -> None:
    engine = Engine(EngineConfig(num_gpu_blocks=200))
    engine.add_request(RequestSpec(0.0, 100, 2, prefix_keys=SYSTEM))
    drain(engine)
    engine.add_request(RequestSpec(0.0, 100, 2, prefix_keys=SYSTEM))
    drain(engine)
    assert sums(engine)["request_prefill_kv_computed_tokens"] == (2, 100.0 + (100 - 64))


def hits_of(engine: Engine, spec: RequestSpec) -> int:
    before = engine.stats.prefix_hits
    engine.add_request(spec)
    drain(engine)
    return engine.stats.prefix_hits - before


def test_a_block_is_shared_only_when_it_is_all_shared_prompt() -> None:
    # (vLLM computes at least the prompt's last token: an aligned prompt's last block is
    # never a hit)
    engine = Engine(EngineConfig(num_gpu_blocks=200))
    # A's prompt ends inside its third block: that block also holds A's output, A's own
    assert hits_of(engine, RequestSpec(0.0, 40, 20, prefix_keys=SYSTEM)) == 0
    assert hits_of(engine, RequestSpec(0.0, 56, 2, prefix_keys=SYSTEM)) == 32  # A's two
    other = tuple(("other-sys", j) for j in range(4))
    assert hits_of(engine, RequestSpec(0.0, 64, 2, prefix_keys=other)) == 0
    # B's prompt fills its third block exactly: all prompt, so C finds it
    engine = Engine(EngineConfig(num_gpu_blocks=200))
    assert hits_of(engine, RequestSpec(0.0, 48, 2, prefix_keys=SYSTEM)) == 0
    assert hits_of(engine, RequestSpec(0.0, 64, 2, prefix_keys=SYSTEM)) == 48


def test_preemptions_are_counted_per_event_and_per_request() -> None:
    # 9 usable blocks; three requests of 40 tokens growing to 240 must take turns
    engine = Engine(EngineConfig(num_gpu_blocks=10, max_num_seqs=8))
    reqs = [engine.add_request(RequestSpec(0.0, 40, 100)) for _ in range(3)]
    per_request: dict[int, int] = {}
    for _ in range(5000):
        if engine.step() is None:
            break
        for req in reqs:
            assert req is not None
            per_request[req.req_id] = req.num_preemptions
    assert max(per_request.values()) >= 2  # one request preempted twice or more
    total = sum(per_request.values())
    assert engine.stats.preemptions == total
    assert sums(engine)["request_num_preemptions"] == (3, float(total))


def test_tokens_and_finishes_are_told_as_they_happen() -> None:
    engine = Engine(EngineConfig(num_gpu_blocks=100))
    told: list[tuple[int, str | None]] = []

    def on_output(req: Request, reason: str | None) -> None:
        told.append((req.req_id, reason))

    engine.on_output = on_output
    done = engine.add_request(RequestSpec(0.0, 20, 2))
    gone = engine.add_request(RequestSpec(0.0, 20, 50))
    assert done is not None and gone is not None
    engine.step()
    engine.abort(gone.req_id)
    drain(engine)
    assert told == [(done.req_id, None), (gone.req_id, None), (gone.req_id, "abort"),
                    (done.req_id, None), (done.req_id, "length")]


def test_a_leak_takes_some_requests_not_all() -> None:
    engine = Engine(EngineConfig(num_gpu_blocks=2000), seed=7)
    engine.leak_frac = 0.5
    for _ in range(40):
        engine.add_request(RequestSpec(0.0, 32, 4))
    drain(engine)
    leaked = sum(req is not None for req, _ in engine.leaked)
    assert 5 < leaked < 35


def test_a_request_that_held_no_blocks_leaks_nothing() -> None:
    engine = Engine(EngineConfig(num_gpu_blocks=100))
    engine.leak_frac = 1.0
    waiting = engine.add_request(RequestSpec(0.0, 20, 5))
    assert waiting is not None and engine.abort(waiting.req_id)  # never admitted
    assert engine.leaked == []
    engine.lump_blocks = 10.0
    waiting = engine.add_request(RequestSpec(0.0, 20, 5))
    assert waiting is not None and engine.abort(waiting.req_id)
    assert engine.leaked == [] and engine.lump_blocks == 10.0


def test_a_step_that_only_preempts_costs_time_and_a_wedged_one_none() -> None:
    engine = Engine(EngineConfig(num_gpu_blocks=10, cost=COST))
    req = engine.add_request(RequestSpec(0.0, 16, 40))  # one full block, then a second
    assert req is not None and engine.step() is not None  # prefill: first token
    engine.take_free_blocks()  # the pool a long leak ends with
    batches = engine.stats.hist["iteration_tokens_total"].count
    cost = engine.step()  # token 17 needs a new block: the request preempts itself
    assert cost == pytest.approx(0.010) and req in engine.waiting
    assert engine.stats.hist["iteration_tokens_total"].count == batches  # no batch ran
    assert req.num_preemptions == 1
    clock, steps = engine.clock, engine.steps
    assert engine.step() is None  # nothing fits: no step, no time
    assert (engine.clock, engine.steps) == (clock, steps)


def test_attention_reads_cost_per_thousand_tokens_of_context() -> None:
    cost = StepCost(base_ms=0, prefill_token_ms=0, decode_seq_ms=0, context_kilotoken_ms=1.5)
    assert cost.seconds(0, 4, 2000) == pytest.approx(0.003, rel=1e-9)
    full = StepCost(base_ms=5, prefill_token_ms=0.04, decode_seq_ms=0.1,
                    context_kilotoken_ms=0.1)
    assert full.seconds(100, 8, 4000) == pytest.approx((5 + 4 + 0.8 + 0.4) / 1000, rel=1e-9)


def test_the_engine_start_time_is_the_one_given_else_now() -> None:
    assert Engine(EngineConfig(num_gpu_blocks=10), created=1234.5).created == 1234.5
    before = time.time()
    assert before <= Engine(EngineConfig(num_gpu_blocks=10)).created <= time.time()


def leaked_request_ids(seed: int | None) -> list[int]:
    config = EngineConfig(num_gpu_blocks=2000)
    engine = Engine(config) if seed is None else Engine(config, seed=seed)
    engine.leak_frac = 0.5
    for _ in range(30):
        engine.add_request(RequestSpec(0.0, 32, 4))
    drain(engine)
    return sorted(req.req_id for req, _ in engine.leaked if req is not None)


def test_a_seed_makes_a_leak_repeatable() -> None:
    assert leaked_request_ids(3) == leaked_request_ids(3)
    assert leaked_request_ids(3) != leaked_request_ids(4)
    assert leaked_request_ids(None) == leaked_request_ids(0)  # repeatable by default too
    assert leaked_request_ids(0) != leaked_request_ids(1)


def test_without_prefix_caching_nothing_is_reused() -> None:
    engine = Engine(EngineConfig(num_gpu_blocks=200, enable_prefix_caching=False))
    for _ in range(2):
        engine.add_request(RequestSpec(0.0, 100, 2, prefix_keys=SYSTEM))
        drain(engine)
    assert engine.stats.prompt_tokens_cached == 0
    assert sums(engine)["request_prefill_kv_computed_tokens"] == (2, 200.0)


def test_prefix_counters_in_tokens_and_blocks_and_the_batch_hit_rate() -> None:
    system = tuple(("sys", j) for j in range(32))  # 512 tokens
    engine = Engine(EngineConfig(num_gpu_blocks=400))
    for prompt in (600, 700, 650):
        engine.add_request(RequestSpec(0.0, prompt, 2, prefix_keys=system))
        drain(engine)
    stats = engine.stats
    assert (stats.prefix_queries, stats.prefix_hits) == (600 + 700 + 650, 2 * 512)
    assert (stats.prefix_query_blocks, stats.prefix_hit_blocks) == (37 + 43 + 40, 2 * 32)
    assert stats.prompt_tokens_cached == 2 * 512
    assert stats.last_batch_hit_rate == pytest.approx(512 / 650)  # SGLang's gauge: the last batch


def test_the_batch_hit_rate_counts_every_request_admitted_in_the_step() -> None:
    system = tuple(("sys", j) for j in range(8))  # 128 tokens
    engine = Engine(EngineConfig(num_gpu_blocks=30, max_num_batched_tokens=4096))
    engine.add_request(RequestSpec(0.0, 160, 2, prefix_keys=system))
    drain(engine)
    engine.add_request(RequestSpec(0.0, 160, 2, prefix_keys=system))  # hits 128
    engine.add_request(RequestSpec(0.0, 400, 2))  # 25 blocks: no room (head of line)
    engine.add_request(RequestSpec(0.0, 16, 2))
    engine.step()
    assert len(engine.running) == 1 and len(engine.waiting) == 2
    assert engine.stats.last_batch_hit_rate == pytest.approx(128 / 160)


def test_a_step_schedules_at_most_its_token_budget() -> None:
    engine = Engine(EngineConfig(num_gpu_blocks=200, max_num_batched_tokens=64))
    for _ in range(3):
        engine.add_request(RequestSpec(0.0, 30, 3))
    engine.step()  # 30 + 30 + the third's first 4 tokens
    assert engine.stats.hist["iteration_tokens_total"].sum == 64 and len(engine.running) == 3
    engine.step()  # two decodes and the third's remaining 26
    assert engine.stats.hist["iteration_tokens_total"].sum == 64 + 28


def test_a_default_engine_admits_a_prompt_only_when_all_of_it_fits() -> None:
    # vLLM 0.33's scheduler_reserve_full_isl is on by default; 19 usable blocks, A holds 13
    engine = Engine(EngineConfig(num_gpu_blocks=20, max_num_batched_tokens=32))
    engine.add_request(RequestSpec(0.0, 200, 8))
    for _ in range(7):
        engine.step()
    b = engine.add_request(RequestSpec(0.0, 160, 8))  # needs 10: its first chunk would fit
    engine.step()
    assert b in engine.waiting


def test_a_budget_spent_exactly_admits_no_one_and_one_token_left_is_used() -> None:
    engine = Engine(EngineConfig(num_gpu_blocks=100, max_num_batched_tokens=32))
    engine.add_request(RequestSpec(0.0, 32, 3))
    engine.add_request(RequestSpec(0.0, 8, 3))
    engine.step()
    assert len(engine.running) == 1  # the budget went to the first prompt
    engine = Engine(EngineConfig(num_gpu_blocks=100, max_num_batched_tokens=2))
    a = engine.add_request(RequestSpec(0.0, 1, 5))
    b = engine.add_request(RequestSpec(0.0, 1, 5))
    for _ in range(3):
        engine.step()
    assert a is not None and b is not None and (a.num_output, b.num_output) == (3, 3)


def test_a_step_costs_its_prefill_tokens_and_each_decode_with_its_context() -> None:
    cost = StepCost(base_ms=10, prefill_token_ms=1, decode_seq_ms=2, context_kilotoken_ms=1)
    engine = Engine(EngineConfig(num_gpu_blocks=100, cost=cost))
    engine.add_request(RequestSpec(0.0, 50, 5))
    engine.add_request(RequestSpec(0.0, 50, 5))
    assert engine.step() == pytest.approx(0.110)  # 100 prompt tokens
    assert engine.step() == pytest.approx((10 + 2 * 2 + 102 / 1000) / 1000)  # 2 decodes
    # a prompt's last token is prefill, never a decode, even alone in its step
    one = Engine(EngineConfig(num_gpu_blocks=100, cost=cost))
    one.add_request(RequestSpec(0.0, 1, 2))
    assert one.step() == pytest.approx(0.011)


def test_generation_throughput_is_the_last_steps_tokens_per_second() -> None:
    engine = Engine(EngineConfig(num_gpu_blocks=100, cost=COST))
    for _ in range(2):
        engine.add_request(RequestSpec(0.0, 50, 5))
    engine.step()  # both prefills end: a first token each
    assert engine.stats.last_gen_throughput == pytest.approx(2 / 0.110)
    engine.step()
    assert engine.stats.last_gen_throughput == pytest.approx(2 / 0.014)
    assert engine.stats.generation_tokens == 4


@pytest.mark.parametrize("prompt, accepted", [(0, False), (1, True), (143, True), (144, False)])
def test_a_prompt_must_have_a_token_and_fit_the_model(prompt: int, accepted: bool) -> None:
    engine = Engine(EngineConfig(num_gpu_blocks=10))  # 144 tokens of cache
    assert (engine.add_request(RequestSpec(0.0, prompt, 1)) is not None) is accepted


def test_a_lump_of_one_block_still_leaks_the_next_request() -> None:
    engine = Engine(EngineConfig(num_gpu_blocks=100))
    engine.lump_blocks = 1.0
    first = engine.add_request(RequestSpec(0.0, 40, 2))
    second = engine.add_request(RequestSpec(0.0, 40, 2))
    drain(engine)
    assert [req for req, _ in engine.leaked] == [first] and engine.lump_blocks == 0.0
    assert second is not None and len(engine.leaked_block_ids()) == 3


def test_blocks_taken_by_a_long_leak_are_leaked_blocks() -> None:
    engine = Engine(EngineConfig(num_gpu_blocks=10))
    engine.take_free_blocks()
    assert len(engine.leaked_block_ids()) == 9 and engine.pool.num_free_blocks == 0


def preempting_run() -> tuple[Engine, list[Request]]:
    # 9 usable blocks; three requests of 40 tokens growing to 140 must take turns
    engine = Engine(EngineConfig(num_gpu_blocks=10, max_num_seqs=8))
    reqs = [engine.add_request(RequestSpec(0.0, 40, 100)) for _ in range(3)]
    return engine, [r for r in reqs if r is not None]


def test_a_preempted_request_keeps_its_first_admission_and_prefix_lookup() -> None:
    engine, reqs = preempting_run()
    drain(engine)
    assert sum(r.num_preemptions for r in reqs) >= 2
    queue = engine.stats.hist["request_queue_time_seconds"]
    assert (queue.count, queue.sum) == (3, 0.0)  # all three were admitted at once, at 0
    assert engine.stats.prefix_queries == 3 * 40  # vLLM counts a re-admission apart


def test_the_step_that_preempts_serves_the_request_and_admits_no_one() -> None:
    engine, (a, b, c) = preempting_run()
    engine.step()
    while engine.stats.preemptions == 0:
        computed = a.num_computed
        engine.step()
    # the first running request got its block from the last one, in the same step
    assert c in engine.waiting and c.num_computed == 0
    assert a.num_computed == computed + 1 and b in engine.running
    assert len(engine.running) == 2  # nobody admitted in a step that preempted


def test_every_running_request_gets_a_token_each_step() -> None:
    engine = Engine(EngineConfig(num_gpu_blocks=200))
    reqs = [engine.add_request(RequestSpec(0.0, 20, 10)) for _ in range(3)]
    for _ in range(4):
        engine.step()
    assert [r.num_output for r in reqs if r is not None] == [4, 4, 4]


def test_running_prefills_take_their_chunks_from_the_same_budget() -> None:
    engine = Engine(EngineConfig(num_gpu_blocks=100, max_num_batched_tokens=64))
    engine.add_request(RequestSpec(0.0, 100, 2))
    engine.add_request(RequestSpec(0.0, 100, 2))
    engine.step()  # the first 64 tokens of the first prompt
    engine.step()  # its last 36, and the second prompt's first 28
    assert engine.stats.hist["iteration_tokens_total"].sum == 128


def test_a_preempted_request_is_not_readmitted_in_the_same_step() -> None:
    # 10 usable blocks; B's chunked prefill outgrows the pool beside A and preempts itself.
    # Without the whole-prompt gate B's next chunk would fit at once, but vLLM admits no one
    # in a step that preempted.
    engine = Engine(EngineConfig(num_gpu_blocks=11, max_num_seqs=3, max_num_batched_tokens=32,
                                 reserve_full_sequence=False, enable_prefix_caching=False))
    a = engine.add_request(RequestSpec(0.0, 54, 7))
    b = engine.add_request(RequestSpec(0.0, 125, 2))
    while engine.stats.preemptions == 0:
        engine.step()
    assert a in engine.running and b in engine.waiting and b.num_computed == 0
