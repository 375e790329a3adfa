"""Targets (the servers kvtop reads) and what one scrape of a target returned."""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal
from urllib.parse import urlsplit, urlunsplit

from kvtop.collect.exposition import Exposition, to_text
from kvtop.collect.reading import ServerReading

FailureKind = Literal["down", "timeout", "auth", "bad_payload"]
DEFAULT_TARGET = "http://127.0.0.1:8000"


class Secret:
    """A bearer token that never shows itself in repr, str, logs or JSON."""

    __slots__ = ("_value",)

    def __init__(self, value: str) -> None:
        self._value = value

    def reveal(self) -> str:
        return self._value

    def __repr__(self) -> str:
        return "Secret('***')"

    __str__ = __repr__

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Secret) and other._value == self._value

    def __hash__(self) -> int:
        return hash(self._value)


def read_token(env: str | None = None, file: str | Path | None = None) -> Secret | None:
    """A token from an environment variable or a file (first line), never from argv."""
    if env:
        value = os.environ.get(env, "").strip()
        if value:
            return Secret(value)
    if file:
        value = Path(file).expanduser().read_text(encoding="utf-8").strip().splitlines()
        if value and value[0].strip():
            return Secret(value[0].strip())
    return None


def normalise_url(spec: str) -> str:
    """``host:port`` or a URL -> a full URL; ``/metrics`` is appended when no path is given."""
    spec = spec.strip()
    if "://" not in spec:
        spec = "http://" + spec
    try:
        parts = urlsplit(spec)
        parts.port  # noqa: B018 - raises on a port that is not a number
    except ValueError as exc:
        raise ValueError(f"not a host:port or URL: {spec!r} ({exc})") from None
    if not parts.hostname:
        raise ValueError(f"not a host:port or URL: {spec!r}")
    if parts.username or parts.password:
        # argv is visible to every user of the machine, and URLs end up in files
        raise ValueError("credentials in a URL would show in process listings and files; "
                         "use token_env / token_file (or --token-env / --token-file)")
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
