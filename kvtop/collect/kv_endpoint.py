"""Where a target's KV events come from, how its channel stands, and a batch with its
target: what the config, the command line, the sources and the views need of vLLM's ZeroMQ
publisher without importing ZeroMQ (``kvtop.collect.kv_subscriber`` reads the sockets).

vLLM publishes rank 0 on the endpoint's port and data-parallel rank r on its port + r (and
replays on the replay port + r). docs/kv-anatomy.md describes the channel's states.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Literal
from urllib.parse import urlsplit

if TYPE_CHECKING:
    from kvtop.collect.kv_events import KvEventBatch
    from kvtop.collect.target import Target

MAX_RANKS = 64

RankState = Literal["connecting", "connected", "disconnected"]
ChannelState = Literal["connecting", "connected", "disconnected", "failed"]


@dataclass(frozen=True, slots=True)
class TargetKvEvents:
    """A KV event batch with the target it belongs to: from a subscriber, or read back from
    a recording."""

    target: Target
    batch: KvEventBatch

    @property
    def t(self) -> float:
        return self.batch.t


OnKvEvents = Callable[[TargetKvEvents], None]


@dataclass(frozen=True, slots=True)
class KvEventsEndpoint:
    """Where an engine publishes: ``url`` for rank 0, rank r on its port + r."""

    url: str  # tcp://host:port
    replay: str | None = None  # tcp://host:port of the replay socket
    ranks: int = 1
    bind: bool = False  # kvtop listens and vLLM connects (its endpoint names a host)
    topic: str = ""

    def rank_url(self, url: str, rank: int) -> str:
        parts = urlsplit(url)
        return f"tcp://{parts.netloc.rsplit(':', 1)[0]}:{(parts.port or 0) + rank}"


def _tcp_url(text: object, what: str) -> str:
    if not isinstance(text, str) or not text.startswith("tcp://"):
        raise ValueError(f"{what} must be tcp://host:port")
    try:
        parts = urlsplit(text)
        port = parts.port
    except ValueError as exc:
        raise ValueError(f"{what}: {exc}") from None
    if not parts.hostname or not port or parts.path or parts.query:  # port 0: none to reach
        raise ValueError(f"{what} must be tcp://host:port")
    return text


def parse_endpoint(url: object, *, replay: object = None, ranks: object = 1,
                   bind: object = False) -> KvEventsEndpoint:
    """An endpoint from a config or the command line; ValueError says what is wrong."""
    url = _tcp_url(url, "kv_events")
    if replay is not None:
        replay = _tcp_url(replay, "kv_events replay")
    if isinstance(ranks, bool) or not isinstance(ranks, int) or not 1 <= ranks <= MAX_RANKS:
        raise ValueError(f"kv_events ranks must be a whole number from 1 to {MAX_RANKS}")
    if not isinstance(bind, bool):
        raise ValueError("kv_events listen must be true or false")
    for base in (url, replay):
        if base is not None and (urlsplit(base).port or 0) + ranks - 1 > 65535:
            raise ValueError(f"kv_events: {ranks} ranks from {base} pass port 65535")
    return KvEventsEndpoint(url, replay, ranks, bind)


def parse_endpoint_argument(text: str) -> KvEventsEndpoint:
    """``--kv-events URL[,REPLAY]``: the publisher, and its replay socket after a comma."""
    url, _, replay = text.partition(",")
    return parse_endpoint(url.strip(), replay=replay.strip() or None)


@dataclass(slots=True)
class RankStatus:
    """One rank's channel, as the subscriber sees it."""

    rank: int
    state: RankState = "connecting"
    batches: int = 0
    last_seq: int | None = None
    first_seq: int | None = None
    gaps: int = 0  # sequence gaps seen
    recovered: int = 0  # batches replay filled in
    lost: int = 0  # batches neither stream nor replay had
    restarts: int = 0
    bad_frames: int = 0  # messages that were not (topic, seq, payload)
    malformed: int = 0  # batches whose payload did not decode
    replay_failures: int = 0  # replays that timed out or failed
    last_t: float | None = None


@dataclass(slots=True)
class KvChannel:
    """One target's KV event channel as the app and the commands show it: where it reads,
    each rank's status (the subscriber updates them as it runs) and, when the channel could
    not be opened or stopped, why (outside text: shown through safe_text)."""

    endpoint: KvEventsEndpoint
    ranks: list[RankStatus] = field(default_factory=list)
    error: str | None = None

    @property
    def state(self) -> ChannelState:
        """failed; connecting (no rank yet); disconnected (a rank lost its publisher);
        connected (every rank)."""
        if self.error is not None:
            return "failed"
        states = {rank.state for rank in self.ranks}
        if "disconnected" in states:
            return "disconnected"
        return "connected" if states == {"connected"} else "connecting"

    def total(self, name: str) -> int:
        """A count summed over the ranks (``gaps``, ``lost``, ``bad_frames``…)."""
        return sum(getattr(rank, name) for rank in self.ranks)
