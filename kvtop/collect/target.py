"""Targets (the servers kvtop reads) and what one scrape of a target returned."""

from __future__ import annotations

import os
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal
from urllib.parse import parse_qsl, urlsplit, urlunsplit

from kvtop.collect.exposition import Exposition, to_text
from kvtop.collect.reading import ServerReading
from kvtop.files import UnreadableFile, read_regular
from kvtop.safe_text import MASK, Secret

__all__ = ["MASK", "Secret"]  # where readers of targets have always found them

FailureKind = Literal["down", "timeout", "auth", "bad_payload"]
DEFAULT_TARGET = "http://127.0.0.1:8000"


MAX_TOKEN_FILE_BYTES = 64 * 1024  # a token is a line; /dev/zero would never end


class TokenError(ValueError):
    """A token that can't be read; the message says why (never the token), ``field`` where
    it was asked for (``token_env`` or ``token_file``)."""

    def __init__(self, message: str, field: str = "token_file") -> None:
        super().__init__(message)
        self.field = field


def read_token(env: str | None = None, file: str | Path | None = None, *,
               default_env: str | None = None) -> Secret | None:
    """A token from an environment variable or a file (first line), never from argv. The file
    must be a regular file of at most 64 KiB: a FIFO or a device would block or never end.
    A variable named in ``env`` that is unset or empty (and no file gives a token) is an
    error, as a missing file is: the servers would silently get no token;
    ``default_env`` (``KVTOP_TOKEN``) is read only when set."""
    value = os.environ.get(env or default_env or "", "").strip()
    if value:
        return Secret(value)
    if file:
        lines = _read_token_file(Path(file).expanduser()).strip().splitlines()
        if lines and lines[0].strip():
            return Secret(lines[0].strip())
    if env:
        raise TokenError(f"the environment variable {env[:80]!r} is not set (or empty), so "
                         "there is no token to send", "token_env")
    return None


# Query arguments that carry a secret (?token=, ?access_token=, ?api_key=, ?X-Amz-Signature=).
_SECRET_ARG_PARTS = ("token", "secret", "passw", "apikey", "api_key", "auth", "credential",
                     "signature", "session")
_SECRET_ARGS = frozenset({"key", "sig", "pass", "pwd", "jwt"})
_USERINFO = re.compile(r"//[^/?#]*@")
NO_CREDENTIALS = ("credentials in a URL would show in process listings, screens and files; "
                  "use token_env / token_file (or --token-env / --token-file)")


def _secret_arg(name: str) -> bool:
    name = name.strip().lower().replace("-", "_")
    return (name in _SECRET_ARGS or name.endswith("_key")
            or any(part in name for part in _SECRET_ARG_PARTS))


class CredentialsInURL(ValueError):
    """A URL with a secret in it; the message says what to do and never repeats the URL."""


def check_no_credentials(url: str) -> None:
    """Refuse a URL that carries a secret: ``user:pass@`` or a query argument such as
    ``?token=``. argv is visible to every user of the machine, and URLs are shown on screens
    and written to snapshots and recordings."""
    before_query, _, rest = url.partition("?")
    if _USERINFO.search(before_query.partition("#")[0]):
        raise CredentialsInURL(NO_CREDENTIALS)
    for name, _ in parse_qsl(rest.partition("#")[0], keep_blank_values=True):
        if _secret_arg(name):
            raise CredentialsInURL(f"the URL's query argument {name[:40]!r} looks like a "
                                   f"secret: {NO_CREDENTIALS}")


def shown_spec(spec: str) -> str:
    """A URL as an error message may quote it: without user info or query."""
    return _USERINFO.sub("//***@", spec.partition("?")[0])


def _read_token_file(path: Path) -> str:
    try:
        data = read_regular(path, MAX_TOKEN_FILE_BYTES)
    except UnreadableFile as exc:
        raise TokenError(f"{exc}: {path}") from None
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError:
        raise TokenError(f"not UTF-8 text: {path}") from None


def normalise_url(spec: str) -> str:
    """``host:port`` or a URL -> a full URL; ``/metrics`` is appended when no path is given.
    A URL with credentials in it is refused (:func:`check_no_credentials`)."""
    spec = spec.strip()
    if "://" not in spec:
        spec = "http://" + spec
    check_no_credentials(spec)
    try:
        parts = urlsplit(spec)
        parts.port  # noqa: B018 - raises on a port that is not a number
    except ValueError as exc:
        raise ValueError(f"not a host:port or URL: {shown_spec(spec)!r} ({exc})") from None
    if parts.scheme.lower() not in ("http", "https"):
        raise ValueError(f"not an http:// or https:// URL: {shown_spec(spec)!r} (kvtop reads "
                         "/metrics over HTTP)")
    if not parts.hostname:
        raise ValueError(f"not a host:port or URL: {shown_spec(spec)!r}")
    path = parts.path if parts.path not in ("", "/") else "/metrics"
    return urlunsplit((parts.scheme, parts.netloc, path, parts.query, ""))


@dataclass(frozen=True, slots=True)
class Target:
    url: str  # full /metrics URL
    name: str | None = None  # display name from the config
    group: str | None = None
    token: Secret | None = field(default=None, repr=False)

    @classmethod
    def from_spec(cls, spec: str, **kwargs: object) -> Target:
        return cls(url=normalise_url(spec), **kwargs)  # type: ignore[arg-type]

    @property
    def base_url(self) -> str:
        """scheme://host:port of the server, for its other endpoints (/version)."""
        parts = urlsplit(self.url)
        return urlunsplit((parts.scheme, parts.netloc, "", "", ""))

    @property
    def label(self) -> str:
        """A short display name that still tells two targets on one host apart."""
        if self.name:
            return self.name
        parts = urlsplit(self.url)
        label = parts.netloc
        if parts.path != "/metrics":
            label += parts.path
        return label


@dataclass(slots=True)
class Scrape:
    """One attempt to read one target's /metrics: the text read, or (from a source that
    has them parsed already, such as Prometheus's API) the samples."""

    target: Target
    t: float  # unix seconds when the request started
    body: str | None = None
    failure: FailureKind | None = None
    error: str | None = None  # a readable reason, with a hint where one helps
    duration_s: float = 0.0
    version: str | None = None  # from /version when the server offers it
    samples: Exposition | None = None  # instead of body: what it would have parsed to
    reading: ServerReading | None = None  # the body read already (by the poller, off the loop)
    connected: bool = True  # False: no connection was made (refused, DNS, TLS handshake)

    @property
    def ok(self) -> bool:
        return self.failure is None and (self.body is not None or self.samples is not None)

    def text(self) -> str | None:
        """The body, or the samples written as exposition text (for files, on demand)."""
        if self.body is None and self.samples is not None:
            return to_text(self.samples)
        return self.body
