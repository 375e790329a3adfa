"""A server, proxy or Prometheus that echoes the Authorization header never makes kvtop show
the token: masked before any quote is cut, on every path (snapshot JSON and stderr, `s`
snapshot files, recordings); URLs that carry a secret are refused with a usage message."""

from __future__ import annotations

import asyncio
import gzip
import json
import os
import sys
from pathlib import Path

import pytest

from kvtop.collect.prometheus import load_settings
from kvtop.collect.target import Secret, normalise_url
from kvtop.safe_text import mask
from tests.fakes.faultserver import FaultServer
from tests.hostile.hostile import TOKEN, TOKEN_HEAD, FakePrometheus

ENV = {"KVTOP_TOKEN": TOKEN}
# The JSON message is "x" * pad + " you sent " + header; kvtop quotes 120 characters of it.
# These pads put the cut 8 characters into the token (Bearer ... / token=...).
PAD_BEARER = 120 - len(" you sent Bearer ") - 8
PAD_BARE = 120 - len(" you sent token=") - 8


async def run_kvtop(*args: str, env: dict[str, str] | None = None) -> tuple[int, str, str]:
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "kvtop", *args, stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE, env={**os.environ, **(env or {})})
    out, err = await asyncio.wait_for(proc.communicate(), timeout=60)
    return proc.returncode or 0, out.decode(), err.decode()


def no_token(*texts: str) -> bool:
    return not any(TOKEN_HEAD in text for text in texts)


def test_redact_masks_the_token_and_a_header_cut_short() -> None:
    secret = Secret(TOKEN)
    assert mask(f"you sent {TOKEN}!", secret) == "you sent ***!"
    assert mask("Authorization: Bearer tok-01", None) == "Authorization: Bearer ***"
    assert mask('{"authorization": "bearer abc"}', None) == '{"authorization": "bearer ***"}'
    hint = "HTTP 401: the server wants a bearer token; set it"  # kvtop's own words stay
    assert mask(hint, secret) == hint


@pytest.mark.parametrize("bare", [False, True], ids=["bearer", "bare-token"])
async def test_an_echoed_token_straddling_the_cut_leaks_nothing(bare: bool,
                                                                tmp_path: Path) -> None:
    query = f"bare=1&pad={PAD_BARE}" if bare else f"pad={PAD_BEARER}"
    recording = tmp_path / "rec.jsonl.gz"
    async with FaultServer() as server:
        url = server.url("echo_auth", query)
        code, out, err = await run_kvtop("snapshot", url, "--samples", "1", "--json",
                                         "--no-gpu", env=ENV)
        rec_code, _, rec_err = await run_kvtop("record", url, "-o", str(recording),
                                               "--duration", "1s", "--interval", "0.3",
                                               env=ENV)
        assert server.requests[0].headers["authorization"] == f"Bearer {TOKEN}"
    assert code == 3, err
    (target,) = json.loads(out)["targets"]
    assert target["status"] == "down" and "you sent" in target["error"]
    assert "***" in target["error"]  # the quote reaches the mask, so it was cut after it
    assert no_token(out, err), target["error"]
    assert rec_code == 0, rec_err
    recorded = gzip.decompress(recording.read_bytes()).decode()
    assert '"error"' in recorded and no_token(recorded, rec_err)


async def test_a_body_that_echoes_the_token_is_masked_before_it_is_kept() -> None:
    async with FaultServer() as server:
        url = server.url("echo_auth_ok")
        code, out, err = await run_kvtop("snapshot", url, "--samples", "1", "--json",
                                         "--no-gpu", env=ENV)
    assert code == 0, err
    (engine,) = json.loads(out)["targets"][0]["engines"]
    assert engine["model"] == "m ***"
    assert no_token(out, err)


async def test_prometheus_echoing_the_header_in_its_error(tmp_path: Path) -> None:
    config = tmp_path / "config.toml"
    async with FakePrometheus(error_mode=True) as prom:
        config.write_text(f'[prometheus]\nurl = "{prom.url}"\ntoken_env = "PROM_TOKEN"\n')
        code, out, err = await run_kvtop("snapshot", "--config", str(config), "--json",
                                         "--no-gpu", env={"PROM_TOKEN": TOKEN})
        assert prom.seen_auth[0] == f"Bearer {TOKEN}"
    assert code == 3 and out == ""
    assert "you sent Bearer ***" in err  # what Prometheus said, masked
    assert no_token(err)
    assert "\x1b" not in err and "\\x1b]52" in err  # and written out


async def test_prometheus_last_error_echoing_the_header(tmp_path: Path) -> None:
    config = tmp_path / "config.toml"
    async with FakePrometheus() as prom:
        config.write_text(f'[prometheus]\nurl = "{prom.url}"\ntoken_env = "PROM_TOKEN"\n')
        code, out, err = await run_kvtop("snapshot", "--config", str(config), "--json",
                                         "--no-gpu", env={"PROM_TOKEN": TOKEN})
    assert code == 3, err  # the down instance
    targets = {t["label"]: t for t in json.loads(out)["targets"]}
    down = targets[prom.down]
    assert down["status"] == "down" and "you sent Bearer ***" in down["error"]
    assert targets[prom.healthy]["status"] == "up"  # read beside it
    assert no_token(out, err)


@pytest.mark.parametrize("url", [
    "gpu-1:8000/metrics?token=abc123", "https://gpu-1/metrics?access_token=abc123",
    "gpu-1:8000?api_key=abc123", "gpu-1:8000/metrics?X-Amz-Signature=abc123",
    "http://user:abc123@gpu-1:8000",
])
def test_urls_that_carry_a_secret_are_refused(url: str) -> None:
    with pytest.raises(ValueError, match="token_env / token_file") as refused:
        normalise_url(url)
    assert "abc123" not in str(refused.value)
    with pytest.raises(ValueError, match="token_env / token_file"):
        load_settings(url.replace("gpu-1:8000", "prom:9090"))


def test_ordinary_query_arguments_are_kept() -> None:
    assert normalise_url("gpu-1:8000/metrics?name[]=x") == "http://gpu-1:8000/metrics?name[]=x"


async def test_the_commands_refuse_a_secret_in_a_url_with_a_usage_message(
        tmp_path: Path) -> None:
    code, out, err = await run_kvtop("snapshot", "127.0.0.1:9/metrics?token=abc123")
    assert code == 2 and "query argument 'token' looks like a secret" in err
    assert "abc123" not in out + err
    config = tmp_path / "config.toml"
    config.write_text('[[targets]]\nurl = "127.0.0.1:9/metrics?access_token=abc123"\n')
    code, out, err = await run_kvtop("snapshot", "--config", str(config))
    assert code == 2 and "access_token" in err and "abc123" not in out + err
