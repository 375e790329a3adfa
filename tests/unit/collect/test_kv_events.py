"""Decoding vLLM's KV-event payloads: both wire forms (0.33's maps, the arrays before),
hashes as ints or sha256 bytes into one 64-bit key, token ids counted never decoded, and
every payload a publisher can send read as a batch or told malformed, never an exception."""

from __future__ import annotations

import msgspec
import pytest

from kvtop.collect.kv_events import (
    GROUP_MIX,
    MAX_EVENTS,
    MAX_HASHES,
    MAX_PAYLOAD_BYTES,
    AllCleared,
    BlockRemoved,
    BlockStored,
    decode_batch,
)
from tests.fakes.kv_publisher import as_array, cleared, payload, removed, stored

SHA = bytes(range(32))


def test_a_batch_of_every_kind_in_the_map_form() -> None:
    got = decode_batch(payload([stored([5, 6], 4, tokens=16), removed([4]), cleared()],
                               ts=12.5, rank=3))
    assert (got.ts, got.rank, got.unknown, got.problem) == (12.5, 3, 0, None)
    assert got.events == [BlockStored((5, 6), 4, 32, 16, "GPU", None),
                          BlockRemoved((4,), "GPU"), AllCleared()]


def test_the_array_form_of_earlier_releases() -> None:
    events = [as_array(stored([5], None, tokens=3)), as_array(removed([5])),
              as_array(cleared())]
    got = decode_batch(msgspec.msgpack.encode([1.0, events]))  # no rank before DP support
    assert got.rank is None and got.problem is None
    assert got.events == [BlockStored((5,), None, 3, 16, "GPU", None),
                          BlockRemoved((5,), "GPU"), AllCleared()]


def test_sha256_hashes_are_their_last_8_bytes_as_vllms_int_mode_sends_them() -> None:
    got = decode_batch(payload([stored([SHA], SHA[::-1])]))
    event = got.events[0]
    assert isinstance(event, BlockStored)
    assert event.hashes == (int.from_bytes(SHA[-8:], "big"),)
    assert event.parent == int.from_bytes(SHA[::-1][-8:], "big")


def test_ints_are_masked_to_64_bits_and_a_group_moves_the_key() -> None:
    got = decode_batch(payload([removed([-1], group=0), removed([7], group=2)]))
    assert got.events[0] == BlockRemoved(((1 << 64) - 1,), "GPU")
    assert got.events[1] == BlockRemoved((7 ^ ((2 * GROUP_MIX) & ((1 << 64) - 1)),), "GPU")


def test_an_event_of_an_unknown_type_is_counted_and_skipped() -> None:
    got = decode_batch(payload([{"type": "BlockPinned", "block_hashes": [1]}, removed([2]),
                                {"no": "type"}, ["SomethingNew", 1]]))
    assert got.problem is None and got.unknown == 3
    assert got.events == [BlockRemoved((2,), "GPU")]


def test_token_ids_are_only_counted() -> None:
    big = stored([1], None, tokens=0)
    big["token_ids"] = list(range(70_000))  # a uint32 array header
    assert decode_batch(payload([big])).events[0].tokens == 70_000  # type: ignore[union-attr]
    big["token_ids"] = None
    assert decode_batch(payload([big])).events[0].tokens == 0  # type: ignore[union-attr]


def test_long_names_are_cut() -> None:
    event = stored([1], None, medium="M" * 500)
    event["lora_name"] = "L" * 500
    got = decode_batch(payload([event])).events[0]
    assert got == BlockStored((1,), None, 16, 16, "M" * 64, "L" * 64)


@pytest.mark.parametrize("data, problem", [
    (b"", "not a KV event batch (Input data was truncated)"),
    (b"\xc1", "not a KV event batch"),  # a byte msgpack never uses
    (msgspec.msgpack.encode("hello"), "not a KV event batch"),
    (msgspec.msgpack.encode([1.0, [{"type": "BlockStored", "block_hashes": ["x"]}], 0]),
     "not a KV event batch (Expected `int | bytes`, got `str`"),
    (msgspec.msgpack.encode([1.0, [{"type": "BlockRemoved"}], 0]),
     "not a KV event batch (Object missing required field `block_hashes`"),
    (msgspec.msgpack.encode([1.0, [{"type": "BlockRemoved", "block_hashes": [b""]}], 0]),
     "not a KV event batch (a block hash of a length no hash has)"),
    (msgspec.msgpack.encode([1.0, [{"type": "BlockRemoved", "block_hashes": [b"x" * 65]}]]),
     "not a KV event batch (a block hash of a length no hash has)"),
    (b"\x93\xcb" + b"\x00" * 8 + b"\x91" + b"\x91" * 200_000 + b"\xc0\x00",
     "not a KV event batch"),  # nesting past msgspec's recursion limit
    (b"\x93\xcb" + b"\x00" * 8 + b"\xdd\xff\xff\xff\xff", "not a KV event batch"),  # 4G events
])
def test_a_payload_that_is_not_a_batch_is_malformed(data: bytes, problem: str) -> None:
    got = decode_batch(data)
    assert got.problem is not None and got.problem.startswith(problem)
    assert got.events == []


def test_limits_on_size_events_and_hashes() -> None:
    assert decode_batch(b"\x00" * (MAX_PAYLOAD_BYTES + 1)).problem == (
        f"a batch of {MAX_PAYLOAD_BYTES + 1:,} bytes (over {MAX_PAYLOAD_BYTES:,})")
    many = msgspec.msgpack.encode([1.0, [{}] * (MAX_EVENTS + 1), 0])  # one byte each
    assert decode_batch(many).problem == f"more than {MAX_EVENTS:,} events in a batch"
    most = decode_batch(msgspec.msgpack.encode([1.0, [{}] * MAX_EVENTS, 0]))
    assert most.problem is None and most.unknown == MAX_EVENTS
    endless = payload([removed(range(MAX_HASHES + 1))])
    assert decode_batch(endless).problem == (
        f"not a KV event batch (an event with more than {MAX_HASHES:,} block hashes)")
    assert decode_batch(payload([removed(range(MAX_HASHES))])).problem is None
