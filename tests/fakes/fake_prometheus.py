"""A fake Prometheus HTTP API on 127.0.0.1 (FaultServer's "api" mode): answers the queries
kvtop makes as Prometheus does, for two vLLM instances that serve a real scrape, and sends
whatever raw answer a test sets in their place (malformed, huge)."""

from __future__ import annotations

import json
from urllib.parse import parse_qs

from kvtop.collect.adapters import WANTED
from kvtop.collect.exposition import parse
from tests.fakes.faultserver import FaultServer, Request
from tests.support.paths import fixture_text

LOAD = "vllm-0.33.0-v1-twin-under-load.txt"
INSTANCES = ("10.0.0.1:8000", "10.0.0.2:8000")
JOB = "vllm"
KINDS = ("discover", "up", "metrics", "range", "targets")


def success(data: object) -> bytes:
    return json.dumps({"status": "success", "data": data}).encode()


def answer(result: object, result_type: str = "matrix") -> bytes:
    return success({"resultType": result_type, "result": result})


def series(metric: object, values: object) -> dict[str, object]:
    return {"metric": metric, "values": values}


class FakePrometheus:
    """Counts the answers of each kind; ``hostile[kind]`` is sent instead of that kind's
    real answer while set; ``config_of[instance]`` changes that instance's
    cache_config_info labels (``{"num_gpu_blocks": "inf"}``)."""

    def __init__(self) -> None:
        self.hostile: dict[str, bytes] = {}
        self.config_of: dict[str, dict[str, str]] = {}
        self.answered = dict.fromkeys(KINDS, 0)
        self.samples = parse(fixture_text(LOAD), keep=WANTED).samples
        self.server = FaultServer(mode="api", api=self.respond)

    async def __aenter__(self) -> FakePrometheus:
        await self.server.start()
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.server.close()

    @property
    def url(self) -> str:
        return self.server.base_url

    def respond(self, request: Request) -> tuple[int, bytes]:
        form = {k: v[-1] for k, v in parse_qs(request.body.decode()).items()}
        kind = _kind(request.path, form.get("query", ""))
        self.answered[kind] += 1
        if kind in self.hostile:
            return 200, self.hostile[kind]
        return 200, self._answer(kind, float(form.get("time") or form.get("end") or 0))

    def _answer(self, kind: str, at: float) -> bytes:
        instances = [{"job": JOB, "instance": i} for i in INSTANCES]
        if kind == "discover":
            return answer([{"metric": m, "value": [at, "85"]} for m in instances], "vector")
        if kind == "up":
            return answer([series({"__name__": "up", **m}, [[at - 0.5, "1"]])
                           for m in instances])
        if kind == "targets":
            return success({"activeTargets": []})
        points = [[at - 0.5, None]] if kind == "metrics" else [[at - 30, None], [at - 15, None]]
        return answer([
            series({"__name__": s.name, **s.labels, **self._odd(s.name, m["instance"]), **m},
                   [[t, repr(s.value)] for t, _ in points])
            for m in instances for s in self.samples])

    def _odd(self, name: str, instance: str) -> dict[str, str]:
        return self.config_of.get(instance, {}) if name == "vllm:cache_config_info" else {}


def _kind(path: str, query: str) -> str:
    if path.endswith("/targets"):
        return "targets"
    if path.endswith("/query_range"):
        return "range"
    if query.startswith("count by"):
        return "discover"
    return "up" if query.startswith("up") else "metrics"
