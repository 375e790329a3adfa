"""Synthetic prompts: the length asked for, the same shared segments for the same key,
the same prompts for the same seed, and a bounded store of segments."""

from __future__ import annotations

from kvtop.load.prompts import MAX_WORD, WORDS, Prompt, PromptMaker
from kvtop.sim.openai_api import text_tokens


def words(prompt: Prompt) -> list[str]:
    assert isinstance(prompt, str)
    return prompt.split()


def test_the_words_are_the_common_ones_of_at_most_six_letters_each_once() -> None:
    assert MAX_WORD == 6
    assert len(WORDS) == 299 and len(set(WORDS)) == 299  # "put" and "must" listed twice
    assert max(len(w) for w in WORDS) == 6
    assert WORDS[:4] == ("the", "of", "and", "to") and WORDS[-2:] == ("play", "rest")
    assert not {"another", "because", "between", "through", "thought"} & set(WORDS)


def test_text_prompts_have_the_length_kvtop_sim_counts() -> None:
    maker = PromptMaker(seed=3)
    for length in (1, 17, 500):
        assert len(text_tokens(" ".join(words(maker.make(length))))) == length
    shared = ((("system",), 40),)
    a, b = words(maker.make(60, shared)), words(maker.make(60, shared))
    assert a[:40] == b[:40] and a[40:] != b[40:]
    assert words(PromptMaker(seed=3).make(30, shared))[:30] == a[:30]


def test_a_seed_gives_the_same_prompts_in_any_process() -> None:
    assert PromptMaker(seed=3).make(5) == "now point right still let"
    assert PromptMaker().make(4) == "hear music well down"  # seed 0, text
    assert PromptMaker(seed=3, token_ids=True).make(4) == [8797, 20419, 18833, 5273]
    assert PromptMaker(token_ids=True).make(3) == [28670, 13623, 25836]


def test_a_shared_segment_comes_from_its_seed_key_and_size_alone() -> None:
    maker, shared = PromptMaker(seed=3), ((("sys",), 3),)
    assert maker.make(5) == "now point right still let"
    # the segment is the same whatever was made before; the rest goes on from the seed
    assert maker.make(6, shared) == "power years watch or to once"
    assert maker.make(6, shared) == "power years watch down who play"
    assert PromptMaker(seed=3).make(3, shared) == "power years watch"
    assert PromptMaker(seed=4).make(3, shared) == "should above place"
    assert PromptMaker(seed=3).make(4, ((("sys",), 4),)) == "come did mark spell"
    assert PromptMaker(seed=3).make(3, (("a", 4),)) == "leave point find"  # any hashable key
    ids = PromptMaker(seed=3, token_ids=True)
    assert ids.make(5, ((("s",), 3),)) == [2013, 25393, 28597, 8797, 20419]
    assert PromptMaker(seed=3, token_ids=True).make(3, ((("s",), 3),)) == [2013, 25393, 28597]


def test_segments_fill_the_prompt_in_order_and_are_cut_at_its_length() -> None:
    two = ((("a",), 4), (("b",), 4))
    # all of a, the first word of b, no word of its own
    assert PromptMaker(seed=3).make(5, two) == "who new close his much"
    assert PromptMaker(seed=3).make(4, ((("b",), 4),)) == "much eat used over"
    # one token past the segments is one word of its own
    one_more = words(PromptMaker(seed=3).make(9, two))
    assert one_more[:8] == words(PromptMaker(seed=3).make(8, two)) and len(one_more) == 9
    # a segment that no longer fits is not made at all
    full = PromptMaker(seed=3)
    assert full.make(4, two) == "who new close his"
    assert list(full._segments) == [(("a",), 4)]


def test_token_id_prompts() -> None:
    maker = PromptMaker(token_ids=True)
    ids = maker.make(100, ((("p",), 64),))
    assert isinstance(ids, list) and len(ids) == 100
    assert all(1000 <= i < 30000 for i in ids)
    assert maker.make(64, ((("p",), 64),)) == ids[:64]


def test_at_most_1024_segments_are_kept_the_least_recently_used_go_first() -> None:
    maker = PromptMaker(seed=1, token_ids=True)
    made = [maker.make(2, ((key, 2),)) for key in range(1024)]
    assert len(maker._segments) == 1024
    maker.make(2, ((0, 2),))  # used again: now the most recent
    maker.make(2, ((1024, 2),))
    assert len(maker._segments) == 1024
    assert (0, 2) in maker._segments and (1, 2) not in maker._segments
    assert list(maker._segments)[-2:] == [(0, 2), (1024, 2)]
    # one made again after it was dropped is the same
    assert maker.make(2, ((1, 2),)) == made[1]
    assert (2, 2) not in maker._segments and list(maker._segments)[-1] == (1, 2)
