"""Decoding vLLM's KV-event payloads: both wire forms (0.33's maps, the arrays before),
hashes as ints or sha256 bytes into one 64-bit key, token ids counted never decoded, and
every payload a publisher can send read as a batch or told malformed, never an exception."""

from __future__ import annotations

import msgspec
import pytest

from kvtop.collect.kv_events import (
    MAX_EVENTS,
    MAX_HASHES,
    MAX_PAYLOAD_BYTES,
    AllCleared,
    BlockRemoved,
    BlockStored,
    KvEventBatch,
    decode_batch,
)
from tests.fakes.kv_publisher import as_array, cleared, payload, removed, stored

SHA = bytes(range(32))
# Keys are written to recordings: a KV-cache group's mix (the 64-bit golden ratio) and the
# payload limit (docs/security.md) are fixed values, not whatever the module says today.
GROUP_MIX = 0x9E3779B97F4A7C15
MIB = 1 << 20


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
    assert MAX_PAYLOAD_BYTES == MIB
    assert decode_batch(b"\x00" * (MIB + 1)).problem == (
        "a batch of 1,048,577 bytes (over 1,048,576)")
    many = msgspec.msgpack.encode([1.0, [{}] * (MAX_EVENTS + 1), 0])  # one byte each
    assert decode_batch(many).problem == f"more than {MAX_EVENTS:,} events in a batch"
    most = decode_batch(msgspec.msgpack.encode([1.0, [{}] * MAX_EVENTS, 0]))
    assert most.problem is None and most.unknown == MAX_EVENTS
    endless = payload([removed(range(MAX_HASHES + 1))])
    assert decode_batch(endless).problem == (
        f"not a KV event batch (an event with more than {MAX_HASHES:,} block hashes)")
    assert decode_batch(payload([removed(range(MAX_HASHES))])).problem is None


def test_a_hash_of_1_to_64_bytes_is_its_last_8_and_a_group_moves_bytes_and_parents_too() -> None:
    hashes = [b"\x01", bytes(range(1, 9)), bytes(range(1, 10)), bytes(range(1, 65))]
    got = decode_batch(payload([removed(hashes), stored([b"\xff" * 32], b"\x02", group=3)]))
    mix = (3 * GROUP_MIX) & ((1 << 64) - 1)
    assert got.problem is None
    assert got.events == [
        BlockRemoved((1, 0x0102030405060708, 0x0203040506070809, 0x393A3B3C3D3E3F40), "GPU"),
        BlockStored((((1 << 64) - 1) ^ mix,), 2 ^ mix, 16, 16, "GPU", None)]
    ints = decode_batch(payload([stored([7], 6, group=3)], ts=1.0, rank=0))
    assert ints.events == [BlockStored((7 ^ mix,), 6 ^ mix, 16, 16, "GPU", None)]


def test_ints_and_bytes_in_one_event_each_become_a_key() -> None:
    got = decode_batch(payload([removed([5, b"\x06"]), removed([b"\x07", 8])]))
    assert got.events == [BlockRemoved((5, 6), "GPU"), BlockRemoved((7, 8), "GPU")]


@pytest.mark.parametrize("tokens", [0, 1, 15, 16, 65_535, 65_536])
def test_tokens_are_counted_off_each_size_of_array_header(tokens: int) -> None:
    """msgpack's fixarray holds up to 15, array16 up to 65,535, array32 the rest."""
    for event in (stored([1], None, tokens=tokens), as_array(stored([1], None, tokens=tokens))):
        got = decode_batch(payload([event]))
        assert got.events == [BlockStored((1,), None, tokens, 16, "GPU", None)]


def test_a_medium_or_lora_name_is_kept_whole_up_to_64_characters_and_none_stays_none() -> None:
    for length in (63, 64, 65):
        event = stored([1], None, medium="M" * length)
        event["lora_name"] = "L" * length
        got = decode_batch(payload([event, removed([1], medium="R" * length)]))
        cut = min(length, 64)
        assert got.events == [BlockStored((1,), None, 16, 16, "M" * cut, "L" * cut),
                              BlockRemoved((1,), "R" * cut)]
    unnamed = decode_batch(payload([stored([1], None, medium=None), removed([1], medium=None)]))
    assert unnamed.events == [BlockStored((1,), None, 16, 16, None, None),
                              BlockRemoved((1,), None)]


def array16(*items: bytes) -> bytes:
    """An array with the 3-byte header a publisher may use for any length (msgpack allows
    it; msgspec writes the shortest)."""
    return b"\xdc" + len(items).to_bytes(2, "big") + b"".join(items)


def array32(*items: bytes) -> bytes:
    return b"\xdd" + len(items).to_bytes(4, "big") + b"".join(items)


def batch_of(*events: bytes) -> bytes:
    return b"\x93\xcb" + msgspec.msgpack.encode(1.0)[1:] + array16(*events) + b"\x00"


def test_an_event_in_the_array_form_is_read_whatever_its_header() -> None:
    enc = msgspec.msgpack.encode
    removed_fields = (enc("BlockRemoved"), enc([9]), enc("CPU"))
    got = decode_batch(batch_of(array16(*removed_fields), array32(*removed_fields),
                                enc(["BlockRemoved", [9], "CPU", *range(12)]),  # 15 items
                                enc(["BlockRemoved", [9], "CPU", *range(13)])))  # 16 items
    assert got.problem is None and got.unknown == 0
    assert got.events == [BlockRemoved((9,), "CPU")] * 4
    tokens = array16(*[enc(0)] * 3)
    stored_16 = decode_batch(batch_of(array16(enc("BlockStored"), enc([1]), enc(None), tokens)))
    assert stored_16.events == [BlockStored((1,), None, 3, 0, None, None)]


def test_an_empty_event_is_unknown_and_an_event_of_no_shape_is_malformed() -> None:
    got = decode_batch(payload([[], {}, removed([2])]))
    assert (got.unknown, got.problem, got.events) == (2, None, [BlockRemoved((2,), "GPU")])
    assert decode_batch(payload([5])).problem == (
        "not a KV event batch (Expected `object`, got `int`)")


def text(value: str) -> bytes:
    return msgspec.msgpack.encode(value)


@pytest.mark.parametrize("tag", ["BlockStored", "BlockRemoved", "AllBlocksCleared"])
def test_a_map_naming_its_type_twice_is_malformed_when_the_last_is_a_type_kvtop_reads(
        tag: str) -> None:
    """msgspec goes by the first, a dict keeps the last: a publisher cannot pass an event of a
    type kvtop reads off as unknown. Its own text in the note is cut at 80 characters."""
    twice = b"\x82" + text("type") + text("Z" * 200) + text("type") + text(tag)
    got = decode_batch(batch_of(twice))
    assert got.problem == "not a KV event batch (Invalid value '" + "Z" * 65 + ")"
    assert got.events == []
    unknown_last = b"\x82" + text("type") + text(tag) + text("type") + text("Zzz")
    assert decode_batch(batch_of(unknown_last)).unknown == 1


def test_a_payload_of_exactly_the_limit_is_read() -> None:
    empty = len(payload([{"type": "Padding", "pad": b""}], ts=1.0))
    for size in (MIB - 1, MIB):
        # a bin8 of up to 255 bytes: bin32's 4-byte length costs 3 bytes more
        pad = b"\x00" * (size - empty - 3)
        data = payload([{"type": "Padding", "pad": pad}], ts=1.0)
        assert len(data) == size
        got = decode_batch(data)
        assert (got.ts, got.rank, got.unknown, got.problem) == (1.0, 0, 1, None)


def test_a_stored_event_with_its_hashes_alone_is_read_with_nothing_else_known() -> None:
    got = decode_batch(payload([{"type": "BlockStored", "block_hashes": [1]},
                                ["BlockStored", [2]]]))
    assert got.events == [BlockStored((1,), None, 0, 0, None, None),
                          BlockStored((2,), None, 0, 0, None, None)]


@pytest.mark.parametrize("token_ids", [None, "abcdefgh", {"a": 1, "b": 2}, 123456789, b"xyzw"])
def test_token_ids_that_are_not_an_array_count_as_none(token_ids: object) -> None:
    event = stored([1], None)
    event["token_ids"] = token_ids
    assert decode_batch(payload([event])).events == [BlockStored((1,), None, 0, 16, "GPU", None)]


def test_an_array_event_of_a_type_kvtop_reads_but_of_the_wrong_shape_is_malformed() -> None:
    got = decode_batch(payload([removed([1]), ["BlockRemoved", "not a list"]]))
    assert (got.problem, got.events) == (
        "not a KV event batch (Expected `array`, got `str` - at `$[1]`)", [])


def test_sha256_hashes_with_no_group_are_their_last_8_bytes() -> None:
    sha_key = int.from_bytes(SHA[-8:], "big")
    got = decode_batch(payload([as_array(stored([SHA], SHA)), removed([SHA], group=None)]))
    assert got.events == [BlockStored((sha_key,), sha_key, 16, 16, "GPU", None),
                          BlockRemoved((sha_key,), "GPU")]


def test_a_batch_made_with_its_place_alone_is_whole_and_empty() -> None:
    """A marker: nothing unknown, malformed, lost or restarted (the anatomy folds it as is)."""
    assert KvEventBatch(t=1.0, rank=2, seq=3) == KvEventBatch(
        t=1.0, rank=2, seq=3, ts=None, events=(), unknown=0, malformed=False, lost=0,
        restart=False, problem=None)
