"""The parser's and Prometheus's caches: a server cannot make them grow past their caps, and
what they hold up to the caps stays (a cache emptied too early costs a re-parse a scrape)."""

from __future__ import annotations

from kvtop.collect.bounded import BoundedCache


def test_a_cache_holds_exactly_its_entry_cap_and_empties_on_the_next_new_key() -> None:
    cache = BoundedCache(max_entries=3, max_chars=1000)
    for key in "abc":
        cache.put(key, key.upper(), 1)
    assert dict(cache) == {"a": "A", "b": "B", "c": "C"} and cache.chars == 3
    cache.put("d", "D", 1)
    assert dict(cache) == {"d": "D"} and cache.chars == 1


def test_a_cache_holds_exactly_its_character_cap_and_empties_past_it() -> None:
    cache = BoundedCache(max_entries=100, max_chars=10)
    cache.put("a", 1, 4)
    cache.put("b", 2, 6)  # 10 characters: the cap, not past it
    assert dict(cache) == {"a": 1, "b": 2} and cache.chars == 10
    cache.put("c", 3, 1)
    assert dict(cache) == {"c": 3} and cache.chars == 1


def test_storing_a_key_again_does_not_count_its_characters_twice() -> None:
    cache = BoundedCache(max_entries=100, max_chars=10)
    cache.put("a", 1, 5)
    cache.put("a", 2, 5)
    cache.put("b", 3, 5)
    assert dict(cache) == {"a": 2, "b": 3} and cache.chars == 10


def test_an_emptied_cache_counts_from_zero_again() -> None:
    cache = BoundedCache(max_entries=100, max_chars=10)
    assert cache.chars == 0
    cache.put("a", 1, 7)
    cache.clear()
    assert dict(cache) == {} and cache.chars == 0
    cache.put("b", 2, 10)
    assert dict(cache) == {"b": 2} and cache.chars == 10
