"""The compile cache is bounded by the bytes of the expressions it holds, not only by their
number: whoever writes selectors cannot make it hold gigabytes of compiled programs."""

from __future__ import annotations

import gc
import tracemalloc
from collections.abc import Iterator

import pytest

from sharegpu.cel import cache_info, clear_cache, compile_error, compile_selector, environment
from sharegpu.cel.cache import WeightedLru

DRIVER = "gpu.sharegpu.dev"


@pytest.fixture(autouse=True)
def _empty_cache() -> Iterator[None]:
    clear_cache()
    yield
    clear_cache()


def large_selector(i: int, size: int) -> str:
    """A distinct selector of ``size`` bytes naming the driver that compiles quickly (most of
    its bytes are one string literal)."""
    head = f"device.driver == '{DRIVER}' && device.attributes['{DRIVER}'].productName == '{i}"
    return head + "x" * (size - len(head) - 1) + "'"


# --- WeightedLru ---------------------------------------------------------------------------------


def test_total_weight_is_bounded_and_the_least_recently_used_goes_first() -> None:
    lru: WeightedLru[int] = WeightedLru(max_entries=100, max_weight=10)
    for key in "abcd":
        assert lru.put(key, ord(key), 3)
    # a+b+c+d would weigh 12: "a", the least recently used, was evicted
    assert lru.keys() == ["b", "c", "d"] and lru.weight == 9
    assert lru.get("b") == ord("b")  # "b" is now the most recently used
    lru.put("e", 5, 3)
    assert lru.keys() == ["d", "b", "e"] and lru.weight == 9
    assert lru.get("c") is None
    stats = lru.stats()
    assert (stats.hits, stats.misses, stats.size, stats.weight, stats.evictions) == (1, 1, 3, 9, 2)


def test_entry_count_is_bounded_too() -> None:
    lru: WeightedLru[int] = WeightedLru(max_entries=3, max_weight=1_000)
    for i in range(10):
        lru.put(str(i), i, 1)
    assert lru.keys() == ["7", "8", "9"] and lru.weight == 3


def test_an_entry_heavier_than_the_bound_is_not_held() -> None:
    lru: WeightedLru[str] = WeightedLru(max_entries=10, max_weight=10)
    lru.put("small", "kept", 4)
    assert not lru.put("huge", "dropped", 11)
    assert "huge" not in lru and lru.keys() == ["small"] and lru.weight == 4


def test_storing_a_key_again_replaces_its_weight() -> None:
    lru: WeightedLru[str] = WeightedLru(max_entries=10, max_weight=10)
    lru.put("a", "one", 6)
    lru.put("a", "two", 2)
    assert lru.get("a") == "two" and lru.weight == 2 and len(lru) == 1
    assert not lru.put("a", "three", 50)
    assert "a" not in lru and lru.weight == 0


@pytest.mark.parametrize(("entries", "weight"), [(0, 10), (10, 0)])
def test_a_cache_without_room_is_refused(entries: int, weight: int) -> None:
    with pytest.raises(ValueError, match="at least one entry"):
        WeightedLru[int](entries, weight)


# --- the compile cache ---------------------------------------------------------------------------


def test_many_distinct_large_selectors_keep_the_compile_cache_within_its_byte_bound() -> None:
    size = 8 * 1024
    count = 2 * environment.CACHE_BYTES // size  # twice what fits
    selectors = [large_selector(i, size) for i in range(count)]
    for i, expression in enumerate(selectors):
        compile_selector(expression)
        if i == 3:
            kept = selectors[0]
        if i > 3:
            compile_selector(kept)  # used again and again: never the least recently used
        info = cache_info()
        assert info.expression_bytes <= environment.CACHE_BYTES
        assert info.size <= environment.CACHE_SIZE
    info = cache_info()
    fits = environment.CACHE_BYTES // size
    assert info.size == fits and info.expression_bytes == fits * size
    held = environment._cache.keys()
    assert kept in held
    assert selectors[1] not in held and selectors[2] not in held  # the least recently used
    assert held[-1] == kept
    assert set(held) == {kept, *selectors[-(fits - 1) :]}


def test_an_expression_over_kubernetes_limit_is_refused_unparsed_and_not_cached() -> None:
    expression = large_selector(0, environment.MAX_EXPRESSION_BYTES + 1)
    for _ in range(2):
        err = compile_error(expression)
        assert err is not None and "longer than 10240 bytes" in err.message
    info = cache_info()
    assert (info.size, info.expression_bytes) == (0, 0)


def test_a_cached_compile_error_keeps_no_parse_frames() -> None:
    """A compile error used to be cached with the traceback of the failed parse: the frames of
    a recursion as deep as the interpreter allows, megabytes per error."""
    compile_selector("true")  # the parser itself is built once, before measuring
    expressions = [f"{i} == " + "(" * 200 + "true" + ")" * 200 for i in range(3)]
    gc.collect()
    tracemalloc.start()
    try:
        before = tracemalloc.get_traced_memory()[0]
        for expression in expressions:
            err = compile_error(expression)
            assert err is not None and err.message == environment.NESTED_TOO_DEEPLY
            del err
        gc.collect()
        retained = tracemalloc.get_traced_memory()[0] - before
    finally:
        tracemalloc.stop()
    assert cache_info().size == 4
    assert retained < 256 * 1024, f"{retained} bytes retained by 3 cached compile errors"


def test_each_raise_of_a_cached_error_is_a_fresh_exception() -> None:
    first = compile_error("device.nope")
    second = compile_error("device.nope")
    assert first is not None and second is not None and first is not second
    assert (first.message, first.line, first.column) == (second.message, 1, second.column)
    assert cache_info().hits == 1
