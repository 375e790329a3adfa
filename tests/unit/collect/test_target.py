"""Targets and their tokens as a user gives them: ``host:port`` or a URL read as the server's
/metrics, a token from an environment variable or the first line of a small regular file,
and a URL carrying a secret refused without repeating it (the token itself: test_safe_text.py)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from kvtop.collect.exposition import parse
from kvtop.collect.target import (
    CredentialsInURL,
    Scrape,
    Secret,
    Target,
    TokenError,
    check_no_credentials,
    normalise_url,
    read_token,
    shown_spec,
)

TOKEN = "tok-4f2a9c"


# -- reading a token -----------------------------------------------------------------------


def test_a_token_comes_from_the_environment_first_then_the_files_first_line(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    file = tmp_path / "token"
    file.write_text(f"  {TOKEN}  \nsecond line\n")
    monkeypatch.setenv("KV_TOKEN", " from-env ")
    assert read_token("KV_TOKEN", file) == Secret("from-env")
    monkeypatch.setenv("KV_TOKEN", "   ")  # set but blank: the file's
    assert read_token("KV_TOKEN", file) == Secret(TOKEN)
    assert read_token("UNSET_TOKEN_VARIABLE", str(file)) == Secret(TOKEN)
    assert read_token(None, None) is None
    assert read_token(None, default_env="UNSET_TOKEN_VARIABLE") is None  # KVTOP_TOKEN, unset


def test_a_named_variable_that_is_unset_is_an_error_not_a_silent_missing_token(
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("UNSET_TOKEN_VARIABLE", raising=False)
    with pytest.raises(TokenError, match="'UNSET_TOKEN_VARIABLE' is not set") as unset:
        read_token("UNSET_TOKEN_VARIABLE", default_env="KVTOP_TOKEN")
    assert unset.value.field == "token_env"
    monkeypatch.setenv("UNSET_TOKEN_VARIABLE", " ")
    with pytest.raises(TokenError, match="is not set \\(or empty\\)"):
        read_token("UNSET_TOKEN_VARIABLE")


def test_a_token_file_under_home_is_found(tmp_path: Path,
                                          monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HOME", str(tmp_path))
    (tmp_path / "token").write_text(TOKEN)
    assert read_token(None, "~/token") == Secret(TOKEN)


@pytest.mark.parametrize("text", ["", "\n\n", "  \t \n"])
def test_a_token_file_with_nothing_on_its_first_line_is_no_token(tmp_path: Path,
                                                                 text: str) -> None:
    file = tmp_path / "token"
    file.write_text(text)
    assert read_token(None, file) is None


def test_a_token_file_that_cannot_be_used_says_why_never_what_is_in_it(
        tmp_path: Path) -> None:
    big = tmp_path / "big"
    big.write_bytes(TOKEN.encode() + b"x" * (64 * 1024))
    latin = tmp_path / "latin"
    latin.write_bytes(b"caf\xe9")
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)  # nobody writes to it: reading would block
    cases = [(big, f"larger than 64 KiB: {big}"), (latin, f"not UTF-8 text: {latin}"),
             (fifo, f"not a regular file: {fifo}"), (tmp_path, f"not a regular file: {tmp_path}"),
             (tmp_path / "absent", f"No such file or directory: {tmp_path / 'absent'}")]
    for path, says in cases:
        with pytest.raises(TokenError) as raised:
            read_token(None, path)
        assert str(raised.value) == says and TOKEN not in str(raised.value)
    exactly = tmp_path / "exactly"
    exactly.write_bytes(TOKEN.encode() + b"\n" + b"x" * (64 * 1024 - len(TOKEN) - 1))
    assert read_token(None, exactly) == Secret(TOKEN)  # 64 KiB is allowed
    with pytest.raises(TokenError, match="null"):
        read_token(None, "bad\x00path")


@pytest.mark.skipif(not Path("/proc/self/mem").exists(), reason="Linux's /proc")
def test_a_token_file_that_fails_to_read_says_why() -> None:
    with pytest.raises(TokenError) as raised:  # a regular file whose first read fails (EIO)
        read_token(None, "/proc/self/mem")
    assert str(raised.value) == "Input/output error: /proc/self/mem"


# -- URLs ----------------------------------------------------------------------------------


@pytest.mark.parametrize(("spec", "url"), [
    ("gpu-1:8000", "http://gpu-1:8000/metrics"),
    (" gpu-1:8000 ", "http://gpu-1:8000/metrics"),
    ("https://gpu-1", "https://gpu-1/metrics"),
    ("HTTPS://gpu-1/", "https://gpu-1/metrics"),
    ("http://gpu-1:8000/custom/metrics", "http://gpu-1:8000/custom/metrics"),
    ("gpu-1:8000/metrics?name[]=x#frag", "http://gpu-1:8000/metrics?name[]=x"),
    ("[::1]:8000", "http://[::1]:8000/metrics"),
])
def test_a_target_is_the_servers_metrics_url(spec: str, url: str) -> None:
    assert normalise_url(spec) == url == Target.from_spec(spec).url


@pytest.mark.parametrize(("spec", "says"), [
    ("gpu-1:port", "not a host:port or URL: 'http://gpu-1:port' (Port could not be cast"),
    ("http://", "not a host:port or URL: 'http://'"),
    ("http://:8000/metrics", "not a host:port or URL: 'http://:8000/metrics'"),
    ("ftp://gpu-1/metrics?x=1",
     "not an http:// or https:// URL: 'ftp://gpu-1/metrics' (kvtop reads /metrics over HTTP)"),
])
def test_a_target_that_is_no_http_server_is_refused_with_the_spec(spec: str,
                                                                  says: str) -> None:
    with pytest.raises(ValueError) as raised:
        normalise_url(spec)
    assert str(raised.value).startswith(says)


@pytest.mark.parametrize("url", [
    "http://u:pw@gpu-1:8000/metrics", "http://u@gpu-1/metrics",
    "http://gpu-1/metrics?token=s", "http://gpu-1/metrics?Access-Token=s",
    "http://gpu-1/metrics?apikey=s", "http://gpu-1/metrics?my_key=s",
    "http://gpu-1/metrics?key=s", "http://gpu-1/metrics?sig=s", "http://gpu-1/metrics?pwd=s",
    "http://gpu-1/metrics?jwt=s", "http://gpu-1/metrics?password=s",
    "http://gpu-1/metrics?client_secret=s", "http://gpu-1/metrics?x-goog-credential=s",
    "http://gpu-1/metrics?session_id=s", "http://gpu-1/metrics?a=1&auth=s#frag",
    "http://gpu-1/metrics?access-key=s", "http://gpu-1/metrics?token=",
    "http://gpu-1/metrics?password",  # the secret to follow: refused before it is typed
])
def test_a_url_carrying_a_secret_is_refused_without_repeating_it(url: str) -> None:
    with pytest.raises(CredentialsInURL) as raised:
        check_no_credentials(url)
    assert "token_env / token_file" in str(raised.value) and "=s" not in str(raised.value)
    assert "u:pw" not in str(raised.value)


@pytest.mark.parametrize("url", [
    "http://gpu-1:8000/metrics?name[]=x&format=text", "http://gpu-1/path@v2/metrics",
    "http://gpu-1/metrics#token=in-a-fragment", "http://gpu-1/metrics?monkey=1",
    "http://gpu-1/metrics?a=1#&token=in-a-fragment",
])
def test_ordinary_urls_are_no_secret(url: str) -> None:
    check_no_credentials(url)


def test_the_secret_query_argument_is_named_short() -> None:
    with pytest.raises(CredentialsInURL) as raised:
        check_no_credentials("http://h/m?" + "x" * 60 + "_token=s")
    assert f"query argument {'x' * 40!r} looks like a secret" in str(raised.value)


def test_a_spec_in_a_message_shows_no_user_info_or_query() -> None:
    assert shown_spec("http://u:pw@gpu-1:8000/metrics?token=s") == (
        "http://***@gpu-1:8000/metrics")
    assert shown_spec("gpu-1:8000/metrics") == "gpu-1:8000/metrics"


def test_a_scrape_read_through_prometheus_is_written_as_text() -> None:
    samples = parse('vllm:num_requests_running{engine="0"} 3.0\n')
    scrape = Scrape(Target("http://h/metrics"), 1.0, samples=samples)
    assert scrape.ok and scrape.text() == 'vllm:num_requests_running{engine="0"} 3.0\n'
    assert Scrape(Target("http://h/metrics"), 1.0, body="x 1\n").text() == "x 1\n"
    assert Scrape(Target("http://h/metrics"), 1.0, failure="down").text() is None
