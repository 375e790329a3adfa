"""The block index: a prefix refreshed when a block is stored on top of it, reuse told by a
second chain from one block, copies of one hash counted, a cap that drops the least
recently used eighth, and scans that find the blocks unused for so many removals."""

from __future__ import annotations

import pytest

from kvtop.derive.kv_index import BlockIndex, Scan

MAX_WALK = 16_384  # docs/kv-anatomy.md: the walk up stops after 16,384 blocks
SAMPLE = 8  # leaked blocks a scan names


def chain(index: BlockIndex, keys: list[int], parent: int | None = None, slack: int = 0,
          born: int = 0) -> None:
    for key in keys:
        index.store(key, parent, born, slack)
        parent = key


def churn(index: BlockIndex, count: int, start: int = 10_000) -> None:
    """``count`` blocks stored and removed: the turnover clock moves by ``count``."""
    for key in range(start, start + count):
        index.store(key, None, 0, 0)
        index.remove(key)


def test_a_second_chain_from_a_block_is_a_reuse_the_first_is_not() -> None:
    index = BlockIndex(64)
    chain(index, [1, 2, 3])
    assert index.store(4, 3, 0, 0) is False  # 3 extended once
    assert index.store(5, 3, 0, 0) is True  # a second branch
    assert index.store(6, 99, 0, 0) is False  # unknown parent
    assert index.store(5, 3, 0, 0) is True  # the second branch reported again: a hit
    assert index.store(6, None, 0, 0) is False  # stored again without a parent


def test_storing_on_top_refreshes_the_whole_prefix() -> None:
    index = BlockIndex(64)
    chain(index, [1, 2, 3])
    churn(index, 10)
    index.store(4, 3, 0, 0)  # extends 1-2-3: all of it was read
    assert index.scan(1, 0).stale == 0
    churn(index, 10)
    assert index.scan(10, 0).stale == 4


def test_the_walk_stops_at_a_block_used_within_the_slack() -> None:
    index = BlockIndex(64)
    chain(index, [1, 2, 3])
    churn(index, 5)
    index.store(2, 1, 0, 0)  # 2 and 1 used at removal 5 (2 stored again: a copy)
    churn(index, 3)
    index.store(4, 3, 0, slack=3)  # 3 is old, 2 was used 3 removals ago: within the slack
    scan = index.scan(8, 0)
    assert scan.stale == 0 and index.scan(3, 0).stale == 2  # 1 and 2 keep removal 5


def test_copies_of_one_hash_leave_one_at_a_time() -> None:
    index = BlockIndex(64)
    index.store(1, None, 7, 0)
    index.store(1, None, 9, 0)
    assert index.remove(1) is None and 1 in index  # one copy left
    assert index.remove(1) == 7  # the last: its birth
    assert index.remove(1) is None and index.removals == 2  # unknown: no tick


def test_a_full_index_drops_its_least_recently_used_eighth() -> None:
    index = BlockIndex(64)
    for key in range(64):
        index.store(key, None, 0, 0)
        churn(index, 1, start=1000 + key)  # key k last used at removal k
    index.store(64, None, 0, 0)
    assert len(index) == 57 and index.dropped == 8
    assert all(k not in index for k in range(8)) and all(k in index for k in range(8, 65))


def test_a_lowered_cap_is_reached_in_one_sweep_of_the_least_recently_used() -> None:
    """A second rank joined its target: this one's share halves. Dropping an eighth of
    the entries per new block would take several blocks over the cap."""
    index = BlockIndex(64)
    for key in range(64):
        index.store(key, None, 0, 0)
        churn(index, 1, start=1000 + key)
    index.cap = 32
    index.store(64, None, 0, 0)
    assert len(index) == 29 and index.dropped == 36  # 7/8 of 32, and the new block
    assert all(k in index for k in range(36, 65)) and 35 not in index


def test_a_long_prefix_is_walked_at_most_max_walk_blocks() -> None:
    index = BlockIndex(MAX_WALK + 100)
    chain(index, list(range(MAX_WALK + 10)))
    churn(index, 1, start=10**9)
    index.store(-1, MAX_WALK + 9, 0, 0)
    assert index.scan(1, 0).stale == 10  # the top 10 were beyond the walk


def test_a_scan_names_the_longest_unused_and_the_most_reused() -> None:
    index = BlockIndex(1024)
    chain(index, list(range(SAMPLE + 4)))
    for step in range(SAMPLE + 4):  # block k last used at removal k
        churn(index, 1, start=5000 + step)
        index.store(step, None, 0, 0)
    for branch in range(3):
        index.store(100 + branch, 2, 0, 0)  # three more chains from block 2 (3 was first)
    scan = index.scan(0, top=2)
    assert scan.sample == tuple(range(3, 3 + SAMPLE))  # 0-2 were just refreshed
    assert scan.oldest_removals == index.removals - 4
    assert scan.hot == ((2, 3, 3),)  # (key, reuses, depth); the only block reused


@pytest.mark.parametrize("cap", [0, 7])
def test_an_index_too_small_to_drop_an_eighth_is_refused(cap: int) -> None:
    with pytest.raises(ValueError, match=r"^an index of fewer than 8 blocks$"):
        BlockIndex(cap)


def test_an_index_of_eight_blocks_drops_one_at_a_time() -> None:
    index = BlockIndex(8)
    chain(index, list(range(9)))
    assert len(index) == 8 and index.dropped == 1 and 0 not in index


def test_the_default_index_holds_2_to_the_20_blocks() -> None:
    """docs/kv-anatomy.md's index_cap: ~120 MiB a target at ~120 bytes a block."""
    assert BlockIndex().cap == 1 << 20


def test_the_drop_goes_by_last_use_not_by_when_a_block_was_first_stored() -> None:
    index = BlockIndex(64)
    for key in range(63):  # all stored at removal 0, in key order
        index.store(key, None, 0, 0)
    for key in reversed(range(63)):  # used again in reverse: block k last used at 63 - k
        churn(index, 1, start=1000 + key)
        index.store(key, None, 0, 0)
    index.store(100, None, 0, 0)
    index.store(101, None, 0, 0)  # the 65th: a full index drops its eighth
    assert index.dropped == 8
    assert [key for key in range(63) if key not in index] == list(range(55, 63))


def test_a_root_block_refreshes_nothing_above_it() -> None:
    """A block without a parent ends the walk, even with a block whose hash is 0 cached."""
    index = BlockIndex(64)
    index.store(0, None, 0, 0)
    index.store(5, None, 0, 0)
    churn(index, 10)
    index.store(6, 5, 0, 0)
    assert index.scan(1, 0) == Scan(1, (0,), 10, ())


def test_a_scan_that_finds_nothing_unused_names_nothing() -> None:
    index = BlockIndex(64)
    chain(index, [1, 2])
    assert index.scan(1, 5) == Scan(0, (), 0, ())


def test_of_blocks_unused_equally_long_the_first_stored_are_named() -> None:
    """The sample stays put as more blocks go unused as long: the first SAMPLE stored."""
    index = BlockIndex(64)
    for key in range(SAMPLE + 2):
        index.store(key, None, 0, 0)
    churn(index, 1)
    assert index.scan(1, 0).sample == tuple(range(SAMPLE))


def test_copies_of_one_hash_are_counted_up_to_255() -> None:
    index = BlockIndex(64)
    for _ in range(300):
        index.store(1, None, 7, 0)
    assert [index.remove(1) for _ in range(256)] == [None] * 254 + [7, None]
    assert 1 not in index


def test_reuses_of_one_prefix_are_counted_up_to_65535_without_touching_its_depth() -> None:
    index = BlockIndex(1 << 17)
    chain(index, [1, 2, 3])
    for branch in range(65_540):
        index.store(10 + branch, 3, 0, 0)  # one chain extends 3, the rest reuse it
    assert index.scan(0, 1).hot == ((3, 65_535, 3),)
