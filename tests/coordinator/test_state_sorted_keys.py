"""The store's sorted key index (sorted_keys.py): the same answers as one sorted list, at
O(log n) a new key.

One sorted list moved its tail on every new key (a memmove of the whole index): 10 us a put at
100,000 keys, 140 us at a million, paid by every member on every write. The index now keeps
chunks of at most ``2 * _LOAD`` keys, so a write moves at most that many; the property tests
run with tiny chunks so splits and merges happen in a few operations.
"""

from __future__ import annotations

import bisect
import random

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from rallypoint.coordinator.state import sorted_keys
from rallypoint.coordinator.state.kv import KeyValueStore, prefix_end
from rallypoint.coordinator.state.sorted_keys import SortedKeys


def check_invariants(index: SortedKeys) -> None:
    chunks = index._chunks
    assert all(chunks), "an empty chunk is kept"
    assert index._maxes == [chunk[-1] for chunk in chunks]
    flat = [key for chunk in chunks for key in chunk]
    assert flat == sorted(set(flat)), "keys out of order or repeated"
    assert len(index) == len(flat)
    assert all(len(chunk) <= 2 * sorted_keys._LOAD for chunk in chunks)
    # Merges keep the chunks from thinning out: several chunks are each at least half full.
    if len(chunks) > 1:
        assert all(len(chunk) >= sorted_keys._LOAD // 2 for chunk in chunks), index.chunk_lengths()


def test_a_store_of_many_keys_written_out_of_order_moves_at_most_one_chunk_per_write() -> None:
    # The bench's keys: 64 writers each counting up, so a new key lands all over the index.
    store = KeyValueStore()
    for revision in range(1, 200_001):
        writer, number = revision % 64, revision // 64
        store.put(b"bench/put_64/c%d/%d" % (writer, number), b"v", revision, 0)
    index = store._sorted_keys
    assert len(index) == 200_000
    # Every list an insert or a delete shifts holds at most 2,000 keys (one list held all
    # 200,000 before).
    assert max(index.chunk_lengths()) <= 2 * sorted_keys._LOAD
    check_invariants(index)
    assert [kv.key for kv in store.range(b"bench/put_64/c7/", limit=3)[0]] == [
        b"bench/put_64/c7/0",
        b"bench/put_64/c7/1",
        b"bench/put_64/c7/10",
    ]
    assert store.count_prefix(b"bench/put_64/c7/") == 3_125


@pytest.fixture
def tiny_chunks(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(sorted_keys, "_LOAD", 4)
    monkeypatch.setattr(sorted_keys, "_ONE_BY_ONE", 2)


KEYS = st.lists(st.sampled_from([b"a", b"b", b"\xff"]), max_size=3).map(b"".join)
OPERATIONS = st.lists(
    st.one_of(
        st.tuples(st.just("add"), st.lists(KEYS, max_size=12)),
        st.tuples(st.just("remove"), st.lists(KEYS, max_size=12)),
        st.tuples(st.just("remove_all_under"), KEYS),
    ),
    max_size=40,
)


@pytest.mark.usefixtures("tiny_chunks")
@settings(max_examples=300, deadline=None)
@given(OPERATIONS, st.lists(st.tuples(KEYS, KEYS, st.integers(0, 5)), min_size=1, max_size=6))
def test_the_index_answers_as_one_sorted_list_would(
    operations: list[tuple[str, object]], queries: list[tuple[bytes, bytes, int]]
) -> None:
    index = SortedKeys()
    model: set[bytes] = set()
    for kind, argument in operations:
        if kind == "add":
            for key in argument:  # type: ignore[attr-defined]
                if key not in model:
                    index.add(key)
                    model.add(key)
        elif kind == "remove":
            gone = sorted(set(argument) & model)  # type: ignore[arg-type]
            index.remove_many(gone)
            model.difference_update(gone)
        else:
            prefix = argument
            end = prefix_end(prefix)  # type: ignore[arg-type]
            gone = index.between(prefix, end)  # type: ignore[arg-type]
            assert gone == sorted(k for k in model if k.startswith(prefix))  # type: ignore[arg-type]
            index.remove_many(gone)
            model.difference_update(gone)
        check_invariants(index)
        assert list(index) == sorted(model)
    ordered = sorted(model)
    for low, high, limit in queries:
        upper = None if high <= low else high
        expected = [k for k in ordered if k >= low and (upper is None or k < upper)]
        assert index.between(low, upper) == expected
        assert index.between(low, upper, limit) == (expected[:limit] if limit else expected)
        assert index.count_between(low, upper) == len(expected)
        assert list(index.iter_from(low)) == ordered[bisect.bisect_left(ordered, low) :]
        after = ordered[bisect.bisect_right(ordered, low) :]
        assert list(index.iter_from(low, inclusive=False)) == after
    clone = index.copy()
    rebuilt = SortedKeys.from_sorted(ordered)
    check_invariants(rebuilt)
    assert list(rebuilt) == list(clone) == ordered
    if ordered:
        clone.remove_many(ordered[:1])
        assert list(index) == ordered, "a copy shares a list with its original"


@pytest.mark.usefixtures("tiny_chunks")
def test_removing_a_key_it_does_not_hold_is_refused() -> None:
    index = SortedKeys.from_sorted([b"a", b"b", b"c", b"d", b"e"])
    with pytest.raises(AssertionError, match="missing"):
        index.remove_many([b"b", b"bb"])
    with pytest.raises(AssertionError, match="missing"):
        index.remove_many([b"z"])


def test_scattered_writes_and_deletes_keep_chunks_bounded_and_full_enough() -> None:
    rng = random.Random(56)
    index = SortedKeys()
    model: set[bytes] = set()
    for _ in range(30):
        for _ in range(4_000):
            key = b"%08d" % rng.randrange(1_000_000)
            if key not in model:
                index.add(key)
                model.add(key)
        # Every third round thins the index out to a tenth: chunks must merge.
        share = 0.9 if rng.random() < 1 / 3 else 1 / 3
        gone = sorted(rng.sample(sorted(model), int(len(model) * share)))
        index.remove_many(gone)
        model.difference_update(gone)
        check_invariants(index)
    assert list(index) == sorted(model)
