"""Scrapes derived from the real ones where no real capture exists, each edit explained."""

from __future__ import annotations

from tests.support.paths import fixture_text


def vllm_08_idle() -> str:
    """An idle vLLM 0.8.x (V1, before `engine` labels): the real 0.10.1.1 idle scrape without
    its `engine="0"` labels and the `kv_cache_usage_perc` family that 0.8 did not have yet.

    Its names say only "0.7 or later" (kvtop infers ``"0.7+"``); V1 from 0.8.3 holds one
    null block, so idle reads 1 of its 600 blocks (the usage is 1/600) and the idle floor is
    1 block.
    """
    text = fixture_text("vllm-0.10.1.1-v1-twin-idle.txt").replace('engine="0",', "")
    return "".join(line for line in text.splitlines(keepends=True)
                   if "vllm:kv_cache_usage_perc" not in line)
