"""The blocks an engine's prefix cache holds, as its KV events told them: a bounded index.

One entry per cached block hash (a 64-bit key), packed into one Python int (~120 bytes a
block with the dict's own share: docs/performance.md) holding

* ``stamp``: the engine's removal count when the block was last *used*: stored, stored
  again, or an ancestor of a block stored since (a new block extends its prefix, so the
  whole prefix was read). Removals are the pool's clock: ``pool`` of them is one full
  turnover, after which every cached block nobody used has been evicted (vLLM evicts free
  cached blocks in the order they were freed);
* ``born``: when it was stored (milliseconds since the index began), for its age at eviction;
* ``copies``: blocks holding this hash (two requests can compute one block at once);
* ``child``/``reuses``: whether a new block has been stored on top of it yet, and how many
  *more* chains grew from it since (each one a reuse of its prefix);
* ``depth``: blocks from the prefix's root to it, as far as kvtop saw (for tokens);
* ``parent``: the block it extends.

**Bounded**: at most ``cap`` entries. When full, the eighth used least recently (lowest
stamp) is dropped in one sweep and counted in ``dropped``; the index never grows with the
number of blocks ever seen. A cap lowered later (ranks sharing their target's budget) is
reached in one sweep too, at the next new block. Walking a prefix up to refresh it stops at
a block used within the last ``slack`` removals and after ``MAX_WALK`` steps, so one event
costs a bounded time.
"""

from __future__ import annotations

import heapq
from dataclasses import dataclass

DEFAULT_CAP = 1 << 20  # blocks; 2 ** 20 is a pool of 16.7M tokens at 16 a block
MAX_WALK = 16_384  # ancestors refreshed per stored block (a 256k-token prefix of 16-token blocks)
DROP_FRACTION = 8  # a full index drops 1/8 of its entries at once
SAMPLE = 8  # leaked blocks named in a scan's result

_STAMP_BITS, _BORN_BITS, _COPIES_BITS, _REUSES_BITS, _DEPTH_BITS = 40, 40, 8, 16, 24
_BORN_AT = _STAMP_BITS
_COPIES_AT = _BORN_AT + _BORN_BITS
_CHILD_AT = _COPIES_AT + _COPIES_BITS
_REUSES_AT = _CHILD_AT + 1
_DEPTH_AT = _REUSES_AT + _REUSES_BITS
_HAS_PARENT_AT = _DEPTH_AT + _DEPTH_BITS
_PARENT_AT = _HAS_PARENT_AT + 1
_STAMP = (1 << _STAMP_BITS) - 1
_BORN = (1 << _BORN_BITS) - 1
_COPIES = (1 << _COPIES_BITS) - 1
_REUSES = (1 << _REUSES_BITS) - 1
_DEPTH = (1 << _DEPTH_BITS) - 1
_PARENT = (1 << 64) - 1
_CHILD = 1 << _CHILD_AT
_ONE_COPY = 1 << _COPIES_AT
_ONE_REUSE = 1 << _REUSES_AT
_NOT_STAMP = ~_STAMP


@dataclass(frozen=True, slots=True)
class Scan:
    """Blocks unused for at least ``turnovers`` full turnovers of the pool, and the prefixes
    most reused: what a scan of the whole index found."""

    stale: int  # blocks not used for at least the asked turnovers
    sample: tuple[int, ...]  # the longest unused of them (their keys), at most SAMPLE
    oldest_removals: int  # removals since the longest unused block was last used
    hot: tuple[tuple[int, int, int], ...]  # (key, reuses, depth), most reused first


class BlockIndex:
    def __init__(self, cap: int = DEFAULT_CAP) -> None:
        if cap < DROP_FRACTION:
            raise ValueError(f"an index of fewer than {DROP_FRACTION} blocks")
        self.cap = cap  # may be lowered (never under DROP_FRACTION): see _drop
        self.removals = 0  # blocks removed that the index held: the turnover clock
        self.dropped = 0  # entries dropped at the cap
        self._blocks: dict[int, int] = {}

    def __len__(self) -> int:
        return len(self._blocks)

    def __contains__(self, key: int) -> bool:
        return key in self._blocks

    def clear(self) -> None:
        self._blocks.clear()

    def store(self, key: int, parent: int | None, born_ms: int, slack: int) -> bool:
        """Block ``key`` was stored on top of ``parent``; refreshes the prefix it extends.
        True when ``parent`` is a block another chain had already grown from (a reuse of
        that prefix)."""
        blocks, now = self._blocks, self.removals
        depth, reuse = 0, False
        if parent is not None and (above := blocks.get(parent)) is not None:
            depth = (above >> _DEPTH_AT) & _DEPTH
            if above & _CHILD:
                reuse = True
                if (above >> _REUSES_AT) & _REUSES != _REUSES:
                    above += _ONE_REUSE
            blocks[parent] = above | _CHILD
            self._refresh(parent, now, slack)
        value = blocks.get(key)
        if value is not None:  # stored again: another copy, or vLLM reporting a hit
            if (value >> _COPIES_AT) & _COPIES != _COPIES:
                value += _ONE_COPY
            blocks[key] = (value & _NOT_STAMP) | now
            return reuse
        if len(blocks) >= self.cap:
            self._drop()
        value = now | (min(born_ms, _BORN) << _BORN_AT) | _ONE_COPY
        value |= min(depth + 1, _DEPTH) << _DEPTH_AT
        if parent is not None:
            value |= (1 << _HAS_PARENT_AT) | ((parent & _PARENT) << _PARENT_AT)
        blocks[key] = value
        return reuse

    def remove(self, key: int) -> int | None:
        """A copy of ``key`` left the cache; its birth (ms) when it was the last copy, None
        when the index did not hold it (stored before kvtop listened, or dropped)."""
        value = self._blocks.get(key)
        if value is None:
            return None
        self.removals += 1
        if (value >> _COPIES_AT) & _COPIES > 1:
            self._blocks[key] = value - _ONE_COPY
            return None
        del self._blocks[key]
        return (value >> _BORN_AT) & _BORN

    def _refresh(self, key: int, now: int, slack: int) -> None:
        """Stamp ``key`` and its ancestors used now, up to one used within ``slack``
        removals (its own ancestors were stamped with it then)."""
        blocks = self._blocks
        for _ in range(MAX_WALK):
            value = blocks.get(key)
            if value is None or (value & _STAMP) >= now - slack:
                return
            blocks[key] = (value & _NOT_STAMP) | now
            if not (value >> _HAS_PARENT_AT) & 1:
                return
            key = (value >> _PARENT_AT) & _PARENT

    def _drop(self) -> None:
        """Drop the least recently used blocks of a full index, down to 7/8 of its cap."""
        blocks = self._blocks
        count = len(blocks) - self.cap + self.cap // DROP_FRACTION
        threshold = sorted(v & _STAMP for v in blocks.values())[count - 1]
        doomed = [k for k, v in blocks.items() if v & _STAMP <= threshold][:count]
        for key in doomed:
            del blocks[key]
        self.dropped += len(doomed)

    def scan(self, unused_removals: int, top: int, sample: int = SAMPLE) -> Scan:
        """One pass over the index: the blocks not used for ``unused_removals`` removals
        (the ``sample`` oldest named) and the ``top`` most reused prefixes."""
        limit = self.removals - unused_removals
        stale: list[tuple[int, int]] = []  # (stamp, key)
        count, hot = 0, []
        for key, value in self._blocks.items():
            stamp = value & _STAMP
            if stamp <= limit:
                count += 1
                if len(stale) < sample:
                    heapq.heappush(stale, (-stamp, key))
                elif -stamp > stale[0][0]:
                    heapq.heapreplace(stale, (-stamp, key))
            reuses = (value >> _REUSES_AT) & _REUSES
            if reuses:
                hot.append((reuses, (value >> _DEPTH_AT) & _DEPTH, key))
        oldest = sorted(((-s, k) for s, k in stale))
        best = heapq.nlargest(top, hot)  # the most reused; of equals, the longest prefix
        return Scan(count, tuple(k for _, k in oldest),
                    self.removals - oldest[0][0] if oldest else 0,
                    tuple((key, reuses, depth) for reuses, depth, key in best))
