"""The radix tree over a real slot allocator: longest-prefix matches, node splits, duplicate
accounting on insert, locks, LRU eviction of unlocked leaves, flush, and every slot in exactly
one place (the allocator or the tree) through a randomized run checked against a dict."""

import random
import sys

import pytest
import torch

from sglang_aux.srt.mem_cache.memory_pool import TokenToKVPoolAllocator
from sglang_aux.srt.mem_cache.radix_cache import RadixCache, common_prefix_len
from sglang_aux.test.ci.ci_register import register_cpu_ci

register_cpu_ci(est_time=10, suite="default")

SIZE = 64


@pytest.fixture
def alloc():
    return TokenToKVPoolAllocator(SIZE, "cpu")


def _cached(cache: RadixCache, alloc: TokenToKVPoolAllocator, key: list[int]) -> torch.Tensor:
    """Insert `key` with fresh slots as a request would at its end: duplicates freed."""
    slots = alloc.alloc(len(key))
    done = cache.insert(key, slots)
    alloc.free(slots[:done])
    return slots


def _assert_every_slot_once(cache: RadixCache, alloc: TokenToKVPoolAllocator) -> None:
    assert alloc.available_size() + cache.total_size() == SIZE
    cache.reset()
    slots = alloc.alloc(SIZE)
    assert sorted(slots.tolist()) == list(range(1, SIZE + 1)), "a slot was lost or doubled"
    alloc.free(slots)


def test_common_prefix_len_equals_a_plain_scan():
    rng = random.Random(0)
    for _ in range(500):
        a = [rng.randrange(3) for _ in range(rng.randrange(40))]
        b = a[: rng.randrange(len(a) + 1)] + [rng.randrange(3) for _ in range(rng.randrange(40))]
        n = 0
        while n < min(len(a), len(b)) and a[n] == b[n]:
            n += 1
        assert common_prefix_len(a, b) == n


def test_match_insert_split_and_duplicates(alloc):
    cache = RadixCache(alloc)
    miss = cache.match_prefix([1, 2, 3])
    assert miss.slots.numel() == 0 and miss.last_node is cache.root
    first = _cached(cache, alloc, [1, 2, 3, 4, 5])
    assert cache.total_size() == cache.evictable_size() == 5
    whole = cache.match_prefix([1, 2, 3, 4, 5, 6])
    assert whole.slots.tolist() == first.tolist() and whole.last_node.key == [1, 2, 3, 4, 5]
    # a match ending inside the node splits it there
    part = cache.match_prefix([1, 2, 9])
    assert part.slots.tolist() == first[:2].tolist() and part.last_node.key == [1, 2]
    assert part.last_node.children[3].key == [3, 4, 5]
    assert cache.match_prefix([1, 2, 3, 4, 5]).slots.tolist() == first.tolist()
    # a second request with the same first 3 tokens: those slots are duplicates, freed
    before = alloc.available_size()
    second = alloc.alloc(5)
    assert cache.insert([1, 2, 3, 7, 8], second) == 3
    alloc.free(second[:3])
    assert alloc.available_size() == before - 2 and cache.total_size() == 7
    branch = cache.match_prefix([1, 2, 3, 7, 8])
    assert branch.slots.tolist() == first[:3].tolist() + second[3:].tolist()
    assert cache.insert([1, 2, 3], first[:3].clone()) == 3  # nothing new
    _assert_every_slot_once(cache, alloc)


def test_insert_rejects_mismatched_slots(alloc):
    cache = RadixCache(alloc)
    with pytest.raises(ValueError, match=r"3 tokens need int64 slots of shape \(3,\), got "
                                         r"torch.int64 \(2,\)"):
        cache.insert([1, 2, 3], alloc.alloc(2))
    with pytest.raises(ValueError, match="torch.int32"):
        cache.insert([1, 2], alloc.alloc(2).to(torch.int32))


def test_locks_protect_paths_from_eviction(alloc):
    cache = RadixCache(alloc)
    _cached(cache, alloc, [1, 2, 3, 4])
    _cached(cache, alloc, [1, 2, 5, 6])
    node = cache.match_prefix([1, 2, 3]).last_node  # splits [3, 4]
    cache.inc_lock_ref(node)
    cache.inc_lock_ref(node)
    assert (cache.protected_size(), cache.evictable_size()) == (3, 3)  # [1, 2] [3] | [4] [5, 6]
    assert cache.evict(SIZE) == 3  # every unlocked token, not one locked
    assert cache.match_prefix([1, 2, 3, 4]).slots.numel() == 3
    cache.dec_lock_ref(node)
    assert cache.protected_size() == 3, "one of two locks is still held"
    cache.dec_lock_ref(node)
    assert (cache.protected_size(), cache.evictable_size()) == (0, 3)
    with pytest.raises(RuntimeError, match="not locked"):
        cache.dec_lock_ref(node)
    _assert_every_slot_once(cache, alloc)


def test_eviction_is_least_recently_used_leaf_first(alloc):
    cache = RadixCache(alloc)
    for key in ([1, 1, 1], [2, 2, 2], [3, 3, 3]):
        _cached(cache, alloc, key)
    cache.match_prefix([1, 1, 1])  # [2, 2, 2] is now the oldest
    free = alloc.available_size()
    assert cache.evict(2) == 3  # whole leaves: at least what was asked
    assert alloc.available_size() == free + 3
    assert cache.match_prefix([2, 2, 2]).slots.numel() == 0
    assert cache.match_prefix([3, 3, 3]).slots.numel() == 3
    # a parent left childless goes too, after its children
    _cached(cache, alloc, [4, 4, 5])
    cache.match_prefix([4, 4, 6])  # splits [4, 4] | [5]
    cache.match_prefix([1, 1, 1])
    cache.match_prefix([3, 3, 3])
    assert cache.evict(2) == 3 and cache.match_prefix([4]).slots.numel() == 0
    assert cache.evictable_size() == 6
    assert cache.reset() == 6 and cache.total_size() == 0
    assert alloc.available_size() == SIZE


def test_randomized_against_a_prefix_dict(alloc):
    """Random requests over a 3-token alphabet (many shared prefixes and splits), random
    evictions and locks; `ref` maps every cached prefix to its last token's slot."""
    rng = random.Random(1)
    cache, ref = RadixCache(alloc), {}
    locked = []

    def evict(n: int) -> None:
        nonlocal ref
        evictable = cache.evictable_size()
        freed = cache.evict(n)
        kept = {p: s for p, s in ref.items()
                if cache.match_prefix(list(p)).slots.numel() == len(p)}
        assert len(ref) - len(kept) == freed >= min(n, evictable)
        assert cache.evictable_size() == evictable - freed
        ref = kept

    for _ in range(300):
        key = [rng.randrange(3) for _ in range(rng.randrange(1, 9))]
        match = cache.match_prefix(key)
        m = 0
        while m < len(key) and tuple(key[: m + 1]) in ref:
            m += 1
        assert match.slots.tolist() == [ref[tuple(key[: j + 1])] for j in range(m)]
        if alloc.available_size() < len(key):
            evict(len(key) - alloc.available_size())
        if alloc.available_size() >= len(key):
            slots = _cached(cache, alloc, key)
            for j in range(m, len(key)):
                ref[tuple(key[: j + 1])] = int(slots[j])
        if rng.random() < 0.1:
            locked.append(cache.match_prefix(key).last_node)
            cache.inc_lock_ref(locked[-1])
        if locked and rng.random() < 0.1:
            cache.dec_lock_ref(locked.pop(rng.randrange(len(locked))))
        if rng.random() < 0.2:
            evict(rng.randrange(1, 10))
        assert cache.total_size() == len(ref)
        assert alloc.available_size() + cache.total_size() == SIZE
    for node in locked:
        cache.dec_lock_ref(node)
    _assert_every_slot_once(cache, alloc)


if __name__ == "__main__":
    sys.exit(pytest.main([__file__, "-q"]))
