"""Synthetic prompts of a given token length: never anyone's data.

Text is common English words of at most 6 letters, each one token (with its leading space)
in the tokenizers of current models (Llama 3, Qwen 2.5, Mistral, GPT-4's cl100k) and in the
approximate tokenizer of ``kvtop sim``: N words are N tokens there and about N elsewhere (the
server's usage counts say exactly). Servers without a tokenizer (vLLM's
``--skip-tokenizer-init``) get token ids, drawn from [1000, 30000), inside every current
vocabulary. A shared segment (a system prompt, a trace's prefix block) is made from its key,
so every prompt naming the key starts with the same tokens and the prefix cache can hit.
"""

from __future__ import annotations

import random
from collections import OrderedDict
from collections.abc import Hashable, Sequence
from typing import cast

MAX_WORD = 6  # letters: a longer word is two tokens in kvtop sim, and often elsewhere
_COMMON = """
the of and to in is was for on are as with his they at be this from have or by one had
not but what all were when we there can an your which their said if do will each about how
up out them then she many some so these would other into has more her two like him see
time could no make than first been its who now people my made over did down only way find
use may water long little very after words called just where most know get through back
much before go good new write our used me man too any day same right look think also
around another came come work three word must because does part even place well such
here take why things help put years home small set end put read hand port large spell add
land big high must follow act ask men change went light kind off need house try us again
animal point mother world near build self earth father head stand own page should found
answer school grow study still learn plant cover food sun four thought let keep eye never
last door between city tree cross since hard start might story saw far sea draw left late
run while press close night real life few stop open seem next white begin got walk paper
group always music those both mark often letter until mile river car feet care second
book carry took rain eat room friend began idea fish north once base hear horse cut sure
watch color face wood main enough plain girl usual young ready above ever red list though
feel talk bird soon body dog family direct pose leave song measure state product black
short class wind power green town fine hold true fire south table play rest
"""
WORDS = tuple(dict.fromkeys(w for w in _COMMON.split() if len(w) <= MAX_WORD))

TOKEN_ID_RANGE = (1000, 30000)
SEGMENT_CACHE = 1024  # shared segments kept made; others are made again from their key

Prompt = str | list[int]


class PromptMaker:
    """Makes prompts of a requested length, as text or token ids."""

    def __init__(self, *, seed: int = 0, token_ids: bool = False) -> None:
        self.token_ids = token_ids
        self._seed = seed
        self._rng = random.Random(seed)
        self._segments: OrderedDict[tuple[Hashable, int], list[str] | list[int]] = OrderedDict()

    def make(self, length: int, shared: Sequence[tuple[Hashable, int]] = ()) -> Prompt:
        """``length`` tokens: the shared segments (key, tokens) in order, then unique ones."""
        parts: list[str | int] = []
        for key, size in shared:
            room = length - len(parts)
            if room <= 0:
                break
            parts.extend(self._segment(key, size)[:room])
        parts.extend(self._unique(length - len(parts)))
        # self.token_ids decides what every part is, which a type cannot follow
        if self.token_ids:
            return cast("list[int]", parts)
        return " ".join(cast("list[str]", parts))

    def _unique(self, count: int) -> list[str] | list[int]:
        if self.token_ids:
            low, high = TOKEN_ID_RANGE
            return [self._rng.randrange(low, high) for _ in range(count)]
        return self._rng.choices(WORDS, k=count)

    def _segment(self, key: Hashable, size: int) -> list[str] | list[int]:
        """The same tokens for the same key and size, whenever asked."""
        cached = self._segments.get((key, size))
        if cached is not None:
            self._segments.move_to_end((key, size))
            return cached
        rng = random.Random(f"{self._seed}/{key!r}/{size}")
        if self.token_ids:
            low, high = TOKEN_ID_RANGE
            made: list[str] | list[int] = [rng.randrange(low, high) for _ in range(size)]
        else:
            made = rng.choices(WORDS, k=size)
        self._segments[(key, size)] = made
        if len(self._segments) > SEGMENT_CACHE:
            self._segments.popitem(last=False)
        return made
