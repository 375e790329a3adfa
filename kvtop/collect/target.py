"""Targets (the servers kvtop reads) and what one scrape of a target returned."""

from __future__ import annotations

import os
import re
import ssl
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


# -- request headers and CA bundles ----------------------------------------------------------

# Headers whose values say nothing secret: shown and sent as written. Every other header's
# value is a Secret, masked wherever kvtop writes anything (a gateway's key, a tenant id).
HARMLESS_HEADERS = frozenset({"accept", "accept-language", "cache-control", "pragma",
                              "user-agent", "x-request-id"})
# Headers kvtop must set itself: the request would break or be read wrongly otherwise
# (kvtop decodes gzip itself; Host picks the server; the token has its own options).
OWN_HEADERS = frozenset({"accept-encoding", "authorization", "connection", "content-length",
                         "host", "transfer-encoding", "te", "upgrade"})
_HEADER_NAME = re.compile(r"[!#$%&'*+.^_`|~0-9A-Za-z-]{1,128}")  # RFC 9110 token
MAX_HEADER_VALUE = 8192
HEADER_FORMS = ("NAME:VALUE, NAME:$VAR (from the environment) or NAME:@FILE (its first line)")

Header = tuple[str, "str | Secret"]


class HeaderError(ValueError):
    """A header that can't be sent; the message names it, never its value."""


def parse_header(spec: str, *, literal_secrets: bool) -> Header:
    """``NAME:VALUE`` (``NAME:$VAR``: the environment variable's value; ``NAME:@FILE``: the
    file's first line) as a (name, value) pair, the value a :class:`Secret` unless the
    name is harmless. ``literal_secrets`` False (the command line, which every user of the
    machine can read) refuses a secret value written out."""
    name, colon, value = spec.partition(":")
    name, value = name.strip(), value.strip()
    if not colon or not _HEADER_NAME.fullmatch(name):
        raise HeaderError(f"not a header: {display_name(name)!r} (write {HEADER_FORMS})")
    if name.lower() in OWN_HEADERS:
        hint = " (the token: token_env / token_file)" if name.lower() == "authorization" else ""
        raise HeaderError(f"header {name!r} is set by kvtop itself{hint}")
    harmless = name.lower() in HARMLESS_HEADERS
    if value[:1] in ("$", "@"):
        value = _referenced(name, value)
    elif not harmless and not literal_secrets and value:
        raise HeaderError(f"header {name!r}: its value would show in process listings; "
                          f"write {name}:$VAR or {name}:@FILE")
    if len(value) > MAX_HEADER_VALUE or not value.isprintable():
        raise HeaderError(f"header {name!r}: the value must be one line of printable text "
                          f"(at most {MAX_HEADER_VALUE:,} characters)")
    return name, value if harmless else Secret(value)


def display_name(name: str) -> str:
    return name[:40].encode("ascii", "backslashreplace").decode()


def _referenced(name: str, reference: str) -> str:
    where = reference[1:].strip()
    if reference[0] == "$":
        value = os.environ.get(where, "").strip()
        if not value:
            raise HeaderError(f"header {name!r}: the environment variable {where[:80]!r} is "
                              "not set (or empty)")
        return value
    try:
        lines = _read_token_file(Path(where).expanduser()).strip().splitlines()
    except TokenError as exc:
        raise HeaderError(f"header {name!r}: {exc}") from None
    if not lines or not lines[0].strip():
        raise HeaderError(f"header {name!r}: the file is empty: {where}")
    return lines[0].strip()


def check_cacert(path: str | Path) -> str:
    """A CA bundle (PEM) to verify a target's TLS with, instead of the system's; its path,
    once the file was read as one. ValueError says why not."""
    path = Path(path).expanduser()
    if not path.is_file():
        raise ValueError(f"no such file: {path}" if not path.exists() else f"not a file: {path}")
    try:
        ssl.create_default_context(cafile=str(path))
    except (ssl.SSLError, OSError, UnicodeDecodeError) as exc:
        detail = getattr(exc, "reason", None) or getattr(exc, "strerror", None) or exc
        raise ValueError(f"not a PEM CA bundle: {path} ({detail})") from None
    return str(path)


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
    headers: tuple[Header, ...] = field(default=(), repr=False)  # sent with every request
    cacert: str | None = None  # a CA bundle that verifies this target's TLS instead

    @classmethod
    def from_spec(cls, spec: str, *, name: str | None = None, group: str | None = None,
                  token: Secret | None = None, headers: tuple[Header, ...] = (),
                  cacert: str | None = None) -> Target:
        return cls(url=normalise_url(spec), name=name, group=group, token=token,
                   headers=headers, cacert=cacert)

    @property
    def secrets(self) -> tuple[Secret, ...]:
        """What this target sends that must never show: the token, secret header values."""
        found = tuple(value for _, value in self.headers if isinstance(value, Secret))
        return found if self.token is None else (self.token, *found)

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
