"""vLLM's KV events, decoded: what one published batch says, in kvtop's terms.

vLLM (``--kv-events-config``, ``vllm/distributed/kv_events.py``) publishes one msgpack
``KVEventBatch`` per engine step over ZeroMQ: ``[ts, [event, ...], data_parallel_rank]``,
each event a tagged struct, a map with ``"type"`` (0.33) or an array with the tag first
(earlier releases). kvtop reads three of them:

* ``BlockStored``: full blocks entered the prefix cache (``block_hashes``, the
  ``parent_block_hash`` they extend, ``token_ids``, ``block_size``, ``medium``, ``lora_name``);
* ``BlockRemoved``: blocks left it (evicted, or replaced);
* ``AllBlocksCleared``: the prefix cache was reset (sleep, ``reset_prefix_cache``).

Token ids are never decoded into Python objects: only their count is read off the msgpack
array header, so no prompt text is held, shown or written anywhere. Hashes (vLLM sends an
int, or sha256 bytes) become one 64-bit key: an int as vLLM masks it, bytes as their last 8
(what vLLM's int mode sends), with a non-zero KV-cache group mixed in.

A publisher is not trusted (docs/security.md, "KV events"): a payload over
``MAX_PAYLOAD_BYTES`` is refused before decoding, a batch with more than ``MAX_EVENTS``
events or an event with more than ``MAX_HASHES`` hashes is malformed, an event of a type
kvtop does not know is counted and skipped, and anything msgspec cannot decode (bad
msgpack, wrong types, nesting past its recursion limit) makes the batch malformed. Decoding
never raises.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, NamedTuple, Union

import msgspec

MAX_PAYLOAD_BYTES = 1 << 20  # vLLM's biggest step (32k prefill tokens) is ~150 KB
MAX_EVENTS = 65_536  # per batch
MAX_HASHES = 65_536  # per event
MAX_HASH_BYTES = 64  # sha256 is 32
MAX_TEXT_CHARS = 64  # medium and LoRA names
MASK64 = (1 << 64) - 1
GROUP_MIX = 0x9E3779B97F4A7C15  # a KV-cache group other than 0 moves the key: no collisions

Hash = Union[int, bytes]  # noqa: UP007 - msgspec reads the annotation at runtime on 3.10


class _Stored(msgspec.Struct, tag="BlockStored", tag_field="type"):
    block_hashes: list[Hash]
    parent_block_hash: Union[Hash, None] = None  # noqa: UP007
    token_ids: msgspec.Raw = msgspec.Raw(b"\x90")
    block_size: int = 0
    lora_id: Union[int, None] = None  # noqa: UP007
    medium: Union[str, None] = None  # noqa: UP007
    lora_name: Union[str, None] = None  # noqa: UP007
    group_idx: Union[int, None] = None  # noqa: UP007


class _Removed(msgspec.Struct, tag="BlockRemoved", tag_field="type"):
    block_hashes: list[Hash]
    medium: Union[str, None] = None  # noqa: UP007
    group_idx: Union[int, None] = None  # noqa: UP007


class _Cleared(msgspec.Struct, tag="AllBlocksCleared", tag_field="type"):
    pass


# Releases before the map form sent each event as an array, tag first, fields in order.
class _StoredArray(msgspec.Struct, array_like=True, tag="BlockStored"):
    block_hashes: list[Hash]
    parent_block_hash: Union[Hash, None] = None  # noqa: UP007
    token_ids: msgspec.Raw = msgspec.Raw(b"\x90")
    block_size: int = 0
    lora_id: Union[int, None] = None  # noqa: UP007
    medium: Union[str, None] = None  # noqa: UP007
    lora_name: Union[str, None] = None  # noqa: UP007


class _RemovedArray(msgspec.Struct, array_like=True, tag="BlockRemoved"):
    block_hashes: list[Hash]
    medium: Union[str, None] = None  # noqa: UP007


class _ClearedArray(msgspec.Struct, array_like=True, tag="AllBlocksCleared"):
    pass


_Event = Union[_Stored, _Removed, _Cleared]  # noqa: UP007
# The whole batch in one call when every event is of a type kvtop reads in the map form
# (what vLLM 0.33 sends); otherwise event by event.
_TYPED = msgspec.msgpack.Decoder(tuple[float, list[_Event], Union[int, None]])  # noqa: UP007
_BATCH = msgspec.msgpack.Decoder(tuple[float, list[msgspec.Raw], Union[int, None]])  # noqa: UP007
_BATCH_NO_RANK = msgspec.msgpack.Decoder(tuple[float, list[msgspec.Raw]])
_EVENT_MAP = msgspec.msgpack.Decoder(_Event)
_EVENT_ARRAY = msgspec.msgpack.Decoder(
    Union[_StoredArray, _RemovedArray, _ClearedArray])  # noqa: UP007
_TAG = msgspec.msgpack.Decoder(Union[dict[str, Any], list[Any]])  # noqa: UP007


class BlockStored(NamedTuple):  # named tuples: ~3x cheaper to make than frozen dataclasses
    hashes: tuple[int, ...]  # 64-bit keys (module notes)
    parent: int | None  # the block these extend; None: they start a prefix
    tokens: int  # tokens in these blocks (never the tokens themselves)
    block_size: int
    medium: str | None  # GPU, CPU, STORAGE…; None: the publisher does not say
    lora: str | None = None


class BlockRemoved(NamedTuple):
    hashes: tuple[int, ...]
    medium: str | None


class AllCleared(NamedTuple):
    pass


KvEvent = Union[BlockStored, BlockRemoved, AllCleared]  # noqa: UP007


@dataclass(frozen=True, slots=True)
class KvEventBatch:
    """One batch as kvtop received it, with what the channel knows around it."""

    t: float  # unix seconds kvtop received it (its place among scrapes)
    rank: int  # the data-parallel rank (the port offset it came from)
    seq: int  # the publisher's sequence number
    ts: float | None = None  # the publisher's clock; None: a marker with no batch
    events: tuple[KvEvent, ...] = ()
    unknown: int = 0  # events of a type kvtop does not read, skipped
    malformed: bool = False  # the payload could not be read: no events
    lost: int = 0  # batches before this one that neither the stream nor replay delivered
    restart: bool = False  # the sequence went back: the publisher restarted
    problem: str | None = None  # why the batch is malformed, for the note


def block_key(value: Hash, group: int | None = None) -> int:
    """kvtop's 64-bit key of a block hash as vLLM publishes it (module notes)."""
    if isinstance(value, bytes):
        if not value or len(value) > MAX_HASH_BYTES:
            raise ValueError("a block hash of a length no hash has")
        key = int.from_bytes(value[-8:], "big")
    else:
        key = value & MASK64
    return key ^ ((group * GROUP_MIX) & MASK64) if group else key


def _text(value: str | None) -> str | None:
    return None if value is None else value[:MAX_TEXT_CHARS]


def _array_length(raw: msgspec.Raw) -> int:
    """Elements of a msgpack array from its header alone; 0 for nil or another type."""
    data = memoryview(raw)  # a whole msgpack value: never empty, an array's count all there
    first = data[0]
    if 0x90 <= first <= 0x9F:
        return first & 0x0F
    if first == 0xDC:
        return int.from_bytes(data[1:3], "big")
    if first == 0xDD:
        return int.from_bytes(data[1:5], "big")
    return 0


def _event(raw: msgspec.Raw) -> KvEvent | None:
    """One event, or None for a type kvtop does not read; ValueError when malformed."""
    first = memoryview(raw)[0]  # a Raw is never empty
    decoder = _EVENT_ARRAY if 0x90 <= first <= 0x9F or first in (0xDC, 0xDD) else _EVENT_MAP
    try:
        event = decoder.decode(raw)
    except msgspec.ValidationError:
        if _known_tag(raw):
            raise
        return None
    return _converted(event)


def _keys(values: list[Hash], group: int | None) -> tuple[int, ...]:
    if len(values) > MAX_HASHES:
        raise ValueError(f"an event with more than {MAX_HASHES:,} block hashes")
    if not group:  # vLLM's usual: ints, group 0
        ints = [v for v in values if type(v) is int]
        if len(ints) == len(values):
            return tuple([v & MASK64 for v in ints])
    return tuple([block_key(v, group) for v in values])


def _converted(event: Any) -> KvEvent:
    kind = type(event)
    if kind is _Stored or kind is _StoredArray:
        group = getattr(event, "group_idx", None)
        parent = event.parent_block_hash
        medium, lora = event.medium, event.lora_name
        return BlockStored(
            _keys(event.block_hashes, group),
            None if parent is None else block_key(parent, group),
            _array_length(event.token_ids), event.block_size,
            medium if medium is None or len(medium) <= MAX_TEXT_CHARS else medium[:MAX_TEXT_CHARS],
            lora if lora is None or len(lora) <= MAX_TEXT_CHARS else lora[:MAX_TEXT_CHARS])
    if kind is _Removed or kind is _RemovedArray:
        return BlockRemoved(_keys(event.block_hashes, getattr(event, "group_idx", None)),
                            _text(event.medium))
    return AllCleared()


def _known_tag(raw: msgspec.Raw) -> bool:
    """Whether a event that failed to decode names a type kvtop reads (then it is
    malformed, not unknown)."""
    try:
        value = _TAG.decode(raw)
    except (msgspec.DecodeError, msgspec.ValidationError, RecursionError):
        return True
    tag = value.get("type") if isinstance(value, dict) else (value[0] if value else None)
    return tag in ("BlockStored", "BlockRemoved", "AllBlocksCleared")


@dataclass(slots=True)
class Decoded:
    ts: float | None
    rank: int | None
    events: list[KvEvent] = field(default_factory=list)
    unknown: int = 0
    problem: str | None = None  # set: the whole batch is malformed


def decode_batch(payload: bytes) -> Decoded:
    """A published payload, decoded; ``problem`` says why a batch could not be read."""
    if len(payload) > MAX_PAYLOAD_BYTES:
        return Decoded(None, None, problem=f"a batch of {len(payload):,} bytes (over "
                                           f"{MAX_PAYLOAD_BYTES:,})")
    try:
        try:
            ts, typed, rank = _TYPED.decode(payload)
        except msgspec.ValidationError:
            typed = None
        if typed is not None and len(typed) <= MAX_EVENTS:
            return Decoded(ts, rank, [_converted(event) for event in typed])
        try:
            ts, raws, rank = _BATCH.decode(payload)
        except msgspec.ValidationError:
            (ts, raws), rank = _BATCH_NO_RANK.decode(payload), None
        if len(raws) > MAX_EVENTS:
            return Decoded(None, None, problem=f"more than {MAX_EVENTS:,} events in a batch")
        out = Decoded(ts, rank)
        for raw in raws:
            event = _event(raw)
            if event is None:
                out.unknown += 1
            else:
                out.events.append(event)
        return out
    except (msgspec.DecodeError, msgspec.ValidationError, ValueError, RecursionError,
            OverflowError) as exc:
        return Decoded(None, None, problem=f"not a KV event batch ({str(exc)[:80]})")
