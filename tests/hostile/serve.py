"""A hostile and a healthy server in their own process, for tests that run kvtop as a user
does (tmux): ``python -m tests.hostile.serve`` prints one JSON line
``{"hostile": url, "healthy": url}`` and serves until stdin closes."""

from __future__ import annotations

import asyncio
import json
import sys

from tests.fakes.faultserver import FaultServer
from tests.hostile.hostile import healthy_body, hostile_body


async def serve() -> None:
    async with FaultServer(bodies=[hostile_body()]) as hostile, \
            FaultServer(bodies=[healthy_body()]) as healthy:
        print(json.dumps({"hostile": hostile.url(), "healthy": healthy.url()}), flush=True)
        await asyncio.get_running_loop().run_in_executor(None, sys.stdin.read)


if __name__ == "__main__":
    asyncio.run(serve())
