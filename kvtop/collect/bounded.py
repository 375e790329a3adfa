"""A cache that a server cannot grow without bound: emptied when it holds too many entries
or too many characters of keys (a server making every label set new then costs a re-parse,
never memory)."""

from __future__ import annotations

from typing import Any


class BoundedCache(dict):  # a dict: lookups stay C-fast
    __slots__ = ("chars", "max_chars", "max_entries")

    def __init__(self, max_entries: int, max_chars: int) -> None:
        super().__init__()
        self.max_entries, self.max_chars = max_entries, max_chars
        self.chars = 0

    def put(self, key: Any, value: Any, chars: int) -> None:
        """Store ``value`` under ``key``, which holds ``chars`` characters of text."""
        if len(self) >= self.max_entries or self.chars + chars > self.max_chars:
            self.clear()
        if key not in self:
            self.chars += chars
        self[key] = value

    def clear(self) -> None:
        super().clear()
        self.chars = 0
