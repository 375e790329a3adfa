"""A vLLM executor without a model, so that the real ``vllm serve`` runs on a CPU-only machine.

vLLM's engine core sizes its KV pool from what the executor reports (a KV-cache spec per layer
and the bytes free for it), then hands the executor one ``SchedulerOutput`` per step and expects
back the token sampled for every request whose prompt is fully computed. This executor answers
exactly those calls, with no tensors: the pool is sized by vLLM's own code from a budget of
``KVTOP_TWIN_BLOCKS`` blocks, and a "forward pass" returns a random token id. Everything else in
the server (HTTP API, AsyncLLM, engine core, scheduler, KV-cache manager, stat loggers,
``/metrics``) is vLLM's.

    PYTHONPATH=<kvtop checkout> VLLM_TARGET_DEVICE=cpu HF_HUB_OFFLINE=1 \\
      vllm serve MODEL_DIR --skip-tokenizer-init \\
        --distributed-executor-backend twin.executor.TwinExecutor ...

MODEL_DIR is a folder written by ``twin.model.write_model_dir``. Knobs, read in the engine-core
process (where vLLM builds the executor):

    KVTOP_TWIN_BLOCKS       KV blocks to offer (default 600)
    KVTOP_TWIN_STEP_S       seconds each step takes (default 0), to make a run human-scale
    KVTOP_TWIN_LEAK_FRAC    > 0: this fraction of finished requests never frees its blocks
    KVTOP_TWIN_EOS_PROB     chance that a sampled token is EOS (default 0: runs to max_tokens)
    KVTOP_TWIN_KV_COUNTS    a file: count the KV events the block pool emits into it
                            (twin/kv_counts.py), and the hashes of leaked blocks
"""

from __future__ import annotations

import os
import random
import time
from concurrent.futures import Future
from pathlib import Path
from typing import Any, TypeVar

import torch
from vllm.v1.core.sched.output import SchedulerOutput
from vllm.v1.executor.abstract import Executor
from vllm.v1.kv_cache_interface import FullAttentionSpec, KVCacheSpec
from vllm.v1.outputs import ModelRunnerOutput

from twin.kv_counts import KvCounts
from twin.leak import FreeLeak
from twin.model import (
    BLOCK_BYTES,
    BLOCK_SIZE,
    EOS_TOKEN_ID,
    FIRST_TEXT_TOKEN_ID,
    HEAD_SIZE,
    NUM_KV_HEADS,
    VOCAB_SIZE,
    layer_names,
)

T = TypeVar("T")


def _knob(name: str, default: float) -> float:
    return float(os.environ.get(name) or default)


def _answer(value: T, non_block: bool) -> T | Future[T]:
    """``value`` as the caller asked for it: itself, or an already finished future."""
    if not non_block:
        return value
    future: Future[T] = Future()
    future.set_result(value)
    return future


class FakeForwardPass:
    """Which requests sample a token this step, and which token.

    A request samples once the tokens computed by the end of this step cover its whole
    sequence so far (prompt and outputs); a chunk of a longer prompt samples nothing, as in
    vLLM's GPU model runner. Prompt lengths are learnt when a request is first scheduled.
    """

    def __init__(self, *, eos_prob: float, seed: int = 0) -> None:
        self.eos_prob = eos_prob
        self.rng = random.Random(seed)
        self.prompt_len: dict[str, int] = {}

    def run(self, plan: SchedulerOutput) -> ModelRunnerOutput:
        for rid in plan.finished_req_ids:
            self.prompt_len.pop(rid, None)
        before: dict[str, tuple[int, int]] = {}  # computed tokens, outputs so far
        for new in plan.scheduled_new_reqs:
            self.prompt_len[new.req_id] = len(new.prompt_token_ids or ())
            before[new.req_id] = (new.num_computed_tokens, 0)
        cached = plan.scheduled_cached_reqs
        for i, rid in enumerate(cached.req_ids):
            before[rid] = (cached.num_computed_tokens[i], cached.num_output_tokens[i])
        ids = list(plan.num_scheduled_tokens)
        sampled = [self._tokens(rid, *before[rid], plan.num_scheduled_tokens[rid])
                   for rid in ids]
        return ModelRunnerOutput(req_ids=ids,
                                 req_id_to_index={rid: i for i, rid in enumerate(ids)},
                                 sampled_token_ids=sampled)

    def _tokens(self, rid: str, computed: int, outputs: int, scheduled: int) -> list[int]:
        if computed + scheduled < self.prompt_len[rid] + outputs:
            return []  # a prompt chunk: nothing to sample yet
        if self.eos_prob and self.rng.random() < self.eos_prob:
            return [EOS_TOKEN_ID]
        return [self.rng.randrange(FIRST_TEXT_TOKEN_ID, VOCAB_SIZE)]


class TwinExecutor(Executor):
    """Answers the engine core's calls itself; any other worker RPC is a no-op."""

    uses_ray = False
    supports_pp = False

    def _init_executor(self) -> None:
        self.num_blocks = int(_knob("KVTOP_TWIN_BLOCKS", 600))
        self.step_s = _knob("KVTOP_TWIN_STEP_S", 0.0)
        self.forward = FakeForwardPass(eos_prob=_knob("KVTOP_TWIN_EOS_PROB", 0.0))
        self.pending: ModelRunnerOutput | None = None
        leak_frac = _knob("KVTOP_TWIN_LEAK_FRAC", 0.0)
        counts_file = os.environ.get("KVTOP_TWIN_KV_COUNTS")
        counts = KvCounts(Path(counts_file)).install() if counts_file else None
        if leak_frac > 0:
            FreeLeak(leak_frac, seed=1, on_leak=counts.leaked if counts else None).install()

    # -- start-up: what vLLM sizes the pool from ----------------------------------------

    def get_kv_cache_specs(self) -> list[dict[str, KVCacheSpec]]:
        spec = FullAttentionSpec(block_size=BLOCK_SIZE, num_kv_heads=NUM_KV_HEADS,
                                 head_size=HEAD_SIZE, dtype=torch.float16)
        return [dict.fromkeys(layer_names(), spec)]

    def determine_available_memory(self) -> list[int]:
        return [self.num_blocks * BLOCK_BYTES]

    def get_supported_kv_cache_layouts(self) -> list[list[str]]:
        return [["NHD"]]

    def set_kv_cache_layout(self, layout_name: str, cp_kv_cache_interleave_size: int) -> None:
        pass

    def initialize_from_config(self, kv_cache_configs: list[Any]) -> None:
        pass

    def compile_or_warm_up_model(self) -> None:
        pass

    @property
    def supported_tasks(self) -> tuple[str, ...]:  # type: ignore[override]
        return ("generate",)

    # -- each step ----------------------------------------------------------------------

    def execute_model(self, scheduler_output: SchedulerOutput,  # type: ignore[override]
                      non_block: bool = False) -> Any:
        self.pending = self.forward.run(scheduler_output)
        if self.step_s and scheduler_output.num_scheduled_tokens:
            time.sleep(self.step_s)
        return _answer(None, non_block)  # None: the engine core asks sample_tokens next

    def sample_tokens(self, grammar_output: Any,  # type: ignore[override]
                      non_block: bool = False) -> Any:
        return _answer(self.pending, non_block)

    def take_draft_token_ids(self) -> None:
        return None

    # -- everything else ----------------------------------------------------------------

    def collective_rpc(self, method: Any, timeout: float | None = None,  # type: ignore[override]
                       args: tuple[Any, ...] = (), kwargs: dict[str, Any] | None = None,
                       non_block: bool = False, **_: Any) -> Any:
        return _answer([None], non_block)  # one worker, which has nothing to do

    def check_health(self) -> None:
        pass

    def shutdown(self) -> None:
        pass
