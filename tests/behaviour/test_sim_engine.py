"""What the simulated vLLM engine records, as kvtop's demo and tests read it back: each
request's times in vLLM's histograms, preemptions counted per event and per request, the
token and finish stream the OpenAI routes relay, prefix blocks shared only when they hold
nothing but a shared prompt, leaks of whole requests, and steps that cost time only when
something ran."""

from __future__ import annotations

import pytest

from kvtop.sim.engine import Engine, EngineConfig, Request, RequestSpec, StepCost

COST = StepCost(base_ms=10, prefill_token_ms=1, decode_seq_ms=2, context_kilotoken_ms=0)
SYSTEM = tuple(("sys", j) for j in range(4))  # a 64-token shared system prompt


def drain(engine: Engine, limit: int = 10_000) -> None:
    for _ in range(limit):
        if engine.step() is None:
            return
    raise AssertionError("engine did not drain")


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
    cost = engine.step()  # token 17 needs a new block: the request preempts itself
    assert cost == pytest.approx(0.010) and req in engine.waiting
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
