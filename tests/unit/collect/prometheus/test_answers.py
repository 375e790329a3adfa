"""What Prometheus said, quoted: one line, masked with the target's own token (even one too
short to be masked everywhere), then cut."""

from __future__ import annotations

from kvtop.collect.prometheus.answers import QUOTE_CHARS, last_errors, quote
from kvtop.safe_text import Secret

SHORT = "k7t0ken"  # 7 characters: masked only where its own client quotes it


def test_a_quote_is_one_line_masked_with_the_clients_token_then_cut() -> None:
    token = Secret(SHORT)
    assert quote(f"401\n  for   {SHORT}", token) == "401 for ***"
    assert quote(f"401 for {SHORT}", None) == f"401 for {SHORT}"
    long = quote("x" * (QUOTE_CHARS - 4) + SHORT, token)
    assert long == "x" * (QUOTE_CHARS - 4) + "***"


def test_prometheus_last_scrape_errors_are_quoted_masked_per_instance() -> None:
    data = {"activeTargets": [
        {"labels": {"job": "vllm", "instance": "h:8000"}, "lastError": f"bad {SHORT}"},
        {"labels": {"job": "vllm", "instance": "h:8001"}, "lastError": ""},
        {"labels": {"job": 1, "instance": "h:8002"}, "lastError": "x"},
        {"labels": "none", "lastError": "x"}, "not a target"]}
    assert last_errors(data, Secret(SHORT)) == {("vllm", "h:8000"): "bad ***"}
    assert last_errors({"activeTargets": "none"}, None) == {}
    assert last_errors([], None) == {}
