"""Instances that churn (pods rescheduled: 100 new instances every refresh, the old ones
gone), read by the real ``kvtop check --prometheus`` for a long run: memory stays under its
bound (it grew 60 -> 321 MB in 80 s, and CPU per refresh 6x, as every instance ever seen
was kept and re-reported)."""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import json
import sys
import time
from urllib.parse import parse_qs

import pytest

from kvtop.collect.adapters import WANTED
from kvtop.collect.exposition import parse
from tests.fakes.faultserver import FaultServer, Request
from tests.support.paths import fixture_text

pytestmark = pytest.mark.slow

NEW_PER_REFRESH = 100
RSS_BOUND_MB = 320  # measured: a plateau at 261-267 MB (2,048 instances and trackers kept)
SAMPLES = parse(fixture_text("vllm-0.33.0-v1-twin-under-load.txt"), keep=WANTED).samples


class Churning:
    """Prometheus's API as kvtop calls it, naming 100 new instances at every refresh."""

    def __init__(self) -> None:
        self.refreshes = itertools.count()

    def respond(self, request: Request) -> tuple[int, bytes]:
        form = {k: v[-1] for k, v in parse_qs(request.body.decode()).items()}
        if request.path.endswith("/status/runtimeinfo"):
            return _ok({"storageRetention": "1s"})  # so check watches live
        if request.path.endswith("/targets"):
            return _ok({"activeTargets": []})
        query, at = form.get("query", ""), float(form.get("time") or form.get("end") or 0)
        if query.startswith("count by"):
            return _ok({"resultType": "vector", "result": [
                {"metric": {"job": "vllm", "instance": "seed:1"}, "value": [at, "1"]}]})
        if query.startswith("up") or request.path.endswith("/query_range"):
            return _ok({"resultType": "matrix", "result": []})
        n = next(self.refreshes)
        return _ok({"resultType": "matrix", "result": [
            {"metric": {"__name__": s.name, **s.labels, "job": "vllm",
                        "instance": f"pod-{n}-{i}:8000"}, "values": [[at - 0.5, repr(s.value)]]}
            for i in range(NEW_PER_REFRESH) for s in SAMPLES]})


def _ok(data: object) -> tuple[int, bytes]:
    return 200, json.dumps({"status": "success", "data": data}).encode()


def _rss_mb(pid: int) -> float:
    with open(f"/proc/{pid}/status") as status:
        return int(next(x for x in status if x.startswith("VmRSS:")).split()[1]) / 1024


async def test_check_reading_a_churning_fleet_keeps_memory_bounded() -> None:
    churn = Churning()
    async with FaultServer(mode="api", api=churn.respond) as server:
        proc = await asyncio.create_subprocess_exec(
            sys.executable, "-m", "kvtop", "check", "--prometheus", server.base_url,
            "--duration", "40s", "--interval", "0.2", "--json",
            stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE)
        rss = []
        started = time.monotonic()
        while proc.returncode is None and time.monotonic() - started < 150:
            rss.append(_rss_mb(proc.pid))
            with contextlib.suppress(asyncio.TimeoutError):
                await asyncio.wait_for(proc.wait(), 1.0)
        out, err = await proc.communicate()
    assert proc.returncode == 3, err.decode()  # no engine judged: no usable data
    refreshes = next(churn.refreshes)
    assert refreshes >= 30, refreshes  # 3,000+ instances named, more than are kept
    assert max(rss) < RSS_BOUND_MB, rss
    half = len(rss) // 2
    assert max(rss[half:]) <= 1.1 * rss[half], rss  # flat once the bounds are reached
    assert json.loads(out)["verdict"] == "unknown"
