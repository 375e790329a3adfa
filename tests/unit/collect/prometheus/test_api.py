"""kvtop.collect.prometheus.api: the Prometheus HTTP API calls, against a real HTTP server on
127.0.0.1 answering as a hostile Prometheus would. (The source's tests in
tests/unit/collect/prometheus/test_source.py reach these calls through every query the source
makes.)"""

from __future__ import annotations

import pytest

from kvtop.collect.prometheus.answers import PrometheusError
from kvtop.collect.prometheus.api import PrometheusAPI, load_settings
from kvtop.collect.target import Secret
from kvtop.safe_text import MIN_KNOWN_SECRET
from tests.fakes.faultserver import FaultServer, Request

# One character short of the tokens kvtop masks everywhere it writes: only the settings'
# own token masks this one.
SHORT_TOKEN = "t0k3n-7"


def json_escaped(text: str) -> str:
    """``text`` as JSON may write it, every character a \\u escape: the raw answer then
    never holds the token's bytes, only the decoded error does."""
    return "".join(f"\\u{ord(char):04x}" for char in text)


async def test_an_error_echoing_a_short_token_in_json_escapes_is_quoted_masked() -> None:
    assert len(SHORT_TOKEN) == MIN_KNOWN_SECRET - 1

    def echo(request: Request) -> tuple[int, bytes]:
        said = f'{{"status": "error", "error": "bad header {json_escaped(SHORT_TOKEN)}"}}'
        return 400, said.encode()

    async with FaultServer(mode="api", api=echo) as server:
        base = server.base_url
        settings = load_settings(base, token=Secret(SHORT_TOKEN))
        api = PrometheusAPI(settings, timeout_s=5.0, insecure=False)
        try:
            with pytest.raises(PrometheusError) as raised:
                await api.call("query", {"query": "up", "time": "0"})
        finally:
            await api.aclose()
    assert server.requests[-1].headers["authorization"] == f"Bearer {SHORT_TOKEN}"
    assert (raised.value.kind, str(raised.value)) == (
        "bad_payload", f"Prometheus {base}: HTTP 400: bad header ***")
