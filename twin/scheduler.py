"""vLLM 0.33's scheduler, KV-cache manager, block pool, prefix hashing, output processor and
Prometheus stat logger, stepped by hand in this process with a model-less forward pass.

Every KV number comes from the installed vllm; only "run the model" is replaced by a sampler
that returns one token id per request whose prompt is fully computed. A step is what
``EngineCore.step`` and ``LLMEngine.step`` do together: schedule, execute, update from the
output, process the outputs, record the stats.

Run it only under the twin interpreter and only in a child process of kvtop's tools: vLLM
registers its collectors in prometheus_client's process-global registry.
"""

from __future__ import annotations

import random
import tempfile
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

from twin.model import (
    BLOCK_SIZE,
    EOS_TOKEN_ID,
    FIRST_TEXT_TOKEN_ID,
    HEAD_SIZE,
    MODEL_NAME,
    NUM_KV_HEADS,
    VOCAB_SIZE,
    layer_names,
    use_vllm_environment,
    write_model_dir,
)

use_vllm_environment(quiet=True)

import prometheus_client  # noqa: E402
import torch  # noqa: E402
import vllm  # noqa: E402
from vllm.config import CacheConfig, ModelConfig, SchedulerConfig, VllmConfig  # noqa: E402
from vllm.sampling_params import RequestOutputKind, SamplingParams  # noqa: E402
from vllm.utils.hashing import get_hash_fn_by_name  # noqa: E402
from vllm.v1.core.block_pool import BlockPool  # noqa: E402
from vllm.v1.core.kv_cache_utils import get_request_block_hasher, init_none_hash  # noqa: E402
from vllm.v1.core.sched.scheduler import Scheduler  # noqa: E402
from vllm.v1.engine import EngineCoreRequest  # noqa: E402
from vllm.v1.engine.output_processor import OutputProcessor  # noqa: E402
from vllm.v1.kv_cache_interface import (  # noqa: E402
    FullAttentionSpec,
    KVCacheConfig,
    KVCacheGroupSpec,
)
from vllm.v1.metrics.loggers import PrometheusStatLogger, StatLoggerManager  # noqa: E402
from vllm.v1.metrics.stats import IterationStats  # noqa: E402
from vllm.v1.outputs import ModelRunnerOutput  # noqa: E402
from vllm.v1.request import Request  # noqa: E402
from vllm.v1.structured_output import StructuredOutputManager  # noqa: E402

VLLM_VERSION = vllm.__version__
Sampler = Callable[[Request], list[int]]  # the tokens a request samples this step ([] or one)


@dataclass(frozen=True, slots=True)
class StepReport:
    """What one engine step did."""

    scheduled_tokens: int
    preempted: int
    finished: int
    prefix_queries: int  # tokens looked up in the prefix cache this step
    prefix_hits: int


class SchedulerTwin:
    """One engine: a pool of ``num_blocks`` blocks of 16 tokens, prefix caching on."""

    def __init__(self, *, num_blocks: int, max_num_seqs: int = 32,
                 max_num_batched_tokens: int = 1024, max_model_len: int = 4096,
                 seed: int = 0, eos_prob: float = 0.0) -> None:
        self.rng = random.Random(seed)
        self.eos_prob = eos_prob
        self._model_dir = tempfile.TemporaryDirectory(prefix="kvtop-twin-model-")
        self.config = _vllm_config(Path(self._model_dir.name), max_num_seqs,
                                   max_num_batched_tokens, max_model_len, seed)
        # What EngineCore._initialize_kv_caches settles on, with the pool size given.
        self.config.cache_config.num_gpu_blocks = num_blocks
        kv_config = KVCacheConfig(
            num_blocks=num_blocks, kv_cache_tensors=[],
            kv_cache_groups=[KVCacheGroupSpec(layer_names(), FullAttentionSpec(
                block_size=BLOCK_SIZE, num_kv_heads=NUM_KV_HEADS, head_size=HEAD_SIZE,
                dtype=torch.float16))])
        self.scheduler = Scheduler(
            vllm_config=self.config, kv_cache_config=kv_config,
            structured_output_manager=StructuredOutputManager(self.config),
            block_size=BLOCK_SIZE, hash_block_size=BLOCK_SIZE, log_stats=True)
        hash_fn = get_hash_fn_by_name(self.config.cache_config.prefix_caching_hash_algo)
        init_none_hash(hash_fn)
        self.block_hasher = get_request_block_hasher(
            BLOCK_SIZE, hash_fn, self.config.num_hash_lookahead_tokens)
        self.outputs = OutputProcessor(tokenizer=None, log_stats=True)
        self.stat_loggers = StatLoggerManager(
            vllm_config=self.config, engine_idxs=[0],
            custom_stat_loggers=[PrometheusStatLogger], enable_default_loggers=False)
        self.stat_loggers.log_engine_initialized()
        self._next_id = 0

    # -- requests -----------------------------------------------------------------------

    def add_request(self, prompt: Sequence[int], max_tokens: int,
                    request_id: str | None = None) -> str:
        """Queue a request of these prompt token ids; it stops at ``max_tokens`` or on EOS.
        (EOS is a stop token id: with no tokenizer nothing else would set it.)"""
        if request_id is None:
            request_id = f"twin-{self._next_id}"
            self._next_id += 1
        params = SamplingParams(max_tokens=max_tokens, stop_token_ids=[EOS_TOKEN_ID],
                                detokenize=False, output_kind=RequestOutputKind.FINAL_ONLY)
        request = EngineCoreRequest(
            request_id=request_id, prompt_token_ids=list(prompt), mm_features=None,
            sampling_params=params, pooling_params=None, arrival_time=time.time(),
            lora_request=None, cache_salt=None, data_parallel_rank=None,
            external_req_id=request_id)
        self.outputs.add_request(request, prompt=None)
        self.scheduler.add_request(Request.from_engine_core_request(request, self.block_hasher))
        return request_id

    def has_work(self) -> bool:
        return bool(self.scheduler.has_unfinished_requests())

    def counts(self) -> tuple[int, int]:
        """(running, waiting) requests."""
        running, waiting = self.scheduler.get_request_counts()
        return running, waiting

    # -- the pool -----------------------------------------------------------------------

    @property
    def pool(self) -> BlockPool:
        return self.scheduler.kv_cache_manager.block_pool

    def usage(self) -> float:
        return float(self.pool.get_usage())

    def usable_blocks(self) -> int:
        """The pool less vLLM's null block, which is never handed out."""
        return int(self.pool.num_gpu_blocks) - 1

    def used_blocks(self) -> int:
        return self.usable_blocks() - int(self.pool.get_num_free_blocks())

    # -- stepping -----------------------------------------------------------------------

    def random_token(self, request: Request) -> list[int]:
        """The default sampler: nothing for a prompt chunk, else a random id (or EOS)."""
        if request.is_prefill_chunk:
            return []
        if self.eos_prob and self.rng.random() < self.eos_prob:
            return [EOS_TOKEN_ID]
        return [self.rng.randrange(FIRST_TEXT_TOKEN_ID, VOCAB_SIZE)]

    def step(self, sample: Sampler | None = None) -> StepReport:
        """One engine step, and the front end's processing and stats for it."""
        sample = sample or self.random_token
        plan = self.scheduler.schedule()
        ids = list(plan.num_scheduled_tokens)
        result = ModelRunnerOutput(
            req_ids=ids, req_id_to_index={rid: i for i, rid in enumerate(ids)},
            sampled_token_ids=[sample(self.scheduler.requests[rid]) for rid in ids])
        finished = queries = hits = 0
        for core_outputs in self.scheduler.update_from_output(plan, result).values():
            iteration = IterationStats() if core_outputs.outputs else None
            self.outputs.process_outputs(core_outputs.outputs,
                                         engine_core_timestamp=core_outputs.timestamp,
                                         iteration_stats=iteration)
            self.outputs.update_scheduler_stats(core_outputs.scheduler_stats)
            finished += sum(1 for out in core_outputs.outputs if out.finished)
            stats = core_outputs.scheduler_stats
            if stats is not None:
                queries += stats.prefix_cache_stats.queries
                hits += stats.prefix_cache_stats.hits
                self.stat_loggers.record(scheduler_stats=stats, iteration_stats=iteration)
        return StepReport(plan.total_num_scheduled_tokens, len(plan.preempted_req_ids or ()),
                          finished, queries, hits)

    def metrics_text(self) -> str:
        """``/metrics`` as vLLM's stat logger renders it now."""
        return prometheus_client.generate_latest(prometheus_client.REGISTRY).decode()


def _vllm_config(model_dir: Path, max_num_seqs: int, max_num_batched_tokens: int,
                 max_model_len: int, seed: int) -> VllmConfig:
    model = ModelConfig(model=str(write_model_dir(model_dir)), served_model_name=MODEL_NAME,
                        skip_tokenizer_init=True, dtype="float16", seed=seed,
                        max_model_len=max_model_len)
    scheduler = SchedulerConfig(max_num_seqs=max_num_seqs,
                                max_num_batched_tokens=max_num_batched_tokens,
                                max_model_len=max_model_len, enable_chunked_prefill=True,
                                is_encoder_decoder=False)
    cache = CacheConfig(block_size=BLOCK_SIZE, gpu_memory_utilization=0.9, cache_dtype="auto",
                        enable_prefix_caching=True)
    return VllmConfig(model_config=model, scheduler_config=scheduler, cache_config=cache)

