"""Scrapes of one target 10 s apart, built from a few numbers (usage, running, tokens), and
the worst-verdict run they make: what the tests of derive/worst.py and `kvtop check` feed."""

from __future__ import annotations

from kvtop.collect.source import read_scrape
from kvtop.collect.target import Scrape, Target
from kvtop.derive.leak_params import LeakParams
from kvtop.derive.verdicts import LeakVerdict
from kvtop.derive.worst import CheckRun

TARGET = Target.from_spec("127.0.0.1:8000")


T0 = 1_767_225_600.0  # 2026-01-01T00:00:00Z


STEP = 10.0


def body(usage: float, *, running: float = 0.0, tokens: float = 0.0, model: str = "m",
         engine: str = "0") -> str:
    """A vLLM engine of 1000 blocks: ``usage`` of them in use, ``running`` requests,
    ``tokens`` generated so far."""
    labels = f'engine="{engine}",model_name="{model}"'
    return "\n".join([
        f'vllm:cache_config_info{{{labels},num_gpu_blocks="1000",block_size="16"}} 1.0',
        f"vllm:kv_cache_usage_perc{{{labels}}} {usage}",
        f"vllm:num_requests_running{{{labels}}} {running}",
        f"vllm:num_requests_waiting{{{labels}}} 0.0",
        f"vllm:generation_tokens_total{{{labels}}} {tokens}",
        f'vllm:request_success_total{{{labels},finished_reason="stop"}} 0.0']) + "\n"


def idle_holding(count: int, start: float = T0) -> list[Scrape]:
    """40 blocks held with nothing running: WATCH after 20 s, LEAK after 60 s."""
    return [read_scrape(Scrape(TARGET, start + STEP * i, body=body(0.04))) for i in range(count)]


def quiet(count: int) -> list[Scrape]:
    """Nothing running and nothing held: a healthy idle engine."""
    return [read_scrape(Scrape(TARGET, T0 + STEP * i, body=body(0.0))) for i in range(count)]


def stalling(count: int, *, progress: int = 3, target: Target = TARGET) -> list[Scrape]:
    """Requests running; tokens come out for the first ``progress`` scrapes, then none."""
    return [read_scrape(Scrape(target, T0 + STEP * i,
                   body=body(0.5, running=3, tokens=100 + 50 * min(i, progress - 1))))
            for i in range(count)]


def judged(scrapes: list[Scrape], params: LeakParams | None = None) -> CheckRun:
    run = CheckRun(params)
    for scrape in scrapes:
        run.feed(scrape)
    return run


def engine(run: CheckRun) -> dict[str, object]:
    [target] = run.to_json()["targets"]
    [only] = target["engines"]
    return only


def warmup(reason: str = "warming up") -> LeakVerdict:
    return LeakVerdict("warmup", reason, None, None, None)


def leak(state: str, blocks: float | None = None, reason: str = "") -> LeakVerdict:
    return LeakVerdict(state, reason or state, blocks, None, None)  # type: ignore[arg-type]
