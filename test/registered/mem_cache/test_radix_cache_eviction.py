"""Eviction through the lazy candidate heap: the same slots go, in the same order, as a walk of
the whole tree would pick (least recently used unlocked leaf first, a parent left childless
joins); one eviction's heap work does not grow with the tree; stale entries stay bounded."""

import heapq
import random
import sys
from types import SimpleNamespace

import pytest

from sglang_aux.srt.mem_cache import radix_cache
from sglang_aux.srt.mem_cache.memory_pool import TokenToKVPoolAllocator
from sglang_aux.srt.mem_cache.radix_cache import HEAP_SLACK, RadixCache, TreeNode
from sglang_aux.test.ci.ci_register import register_cpu_ci

register_cpu_ci(est_time=10, suite="default")


def _nodes(cache: RadixCache) -> list[TreeNode]:
    """Every node but the root."""
    nodes, stack = [], list(cache.root.children.values())
    while stack:
        node = stack.pop()
        nodes.append(node)
        stack.extend(node.children.values())
    return nodes


def _slots(cache: RadixCache) -> set[int]:
    return {s for node in _nodes(cache) for s in node.value.tolist()}


def _walk_order(cache: RadixCache, num_tokens: int) -> list[int]:
    """The slots a from-scratch walk frees: every unlocked leaf heaped by (last_access, id),
    popped until `num_tokens` are freed; a parent left childless and unlocked joins."""
    nodes = _nodes(cache)
    children = {node.id: len(node.children) for node in nodes}
    heap = [(n.last_access, n.id, n) for n in nodes if not n.children and n.lock_ref == 0]
    heapq.heapify(heap)
    freed = []
    while len(freed) < num_tokens and heap:
        _, _, node = heapq.heappop(heap)
        freed += node.value.tolist()
        parent = node.parent
        if parent is not cache.root:
            children[parent.id] -= 1
            if children[parent.id] == 0 and parent.lock_ref == 0:
                heapq.heappush(heap, (parent.last_access, parent.id, parent))
    return freed


def _insert(cache: RadixCache, alloc: TokenToKVPoolAllocator, key: list[int]) -> None:
    slots = alloc.alloc(len(key))
    alloc.free(slots[: cache.insert(key, slots)])


def _leaves_under_a_shared_prefix(n: int) -> tuple[RadixCache, list[list[int]]]:
    """GSM8K-like: one few-shot prefix node and `n` request leaves under it, oldest first."""
    alloc = TokenToKVPoolAllocator(8 + 4 * n + 12, "cpu")  # + one key: `_insert` takes it all
    cache = RadixCache(alloc)
    keys = [[0] * 8 + [1 + i, 0, 0, 0] for i in range(n)]
    for key in keys:
        _insert(cache, alloc, key)
    return cache, keys


@pytest.mark.parametrize("seed", [0, 1, 2, 3])
def test_evicts_what_a_walk_of_the_tree_would(seed):
    """Random inserts (shared prefixes, splits), matches (which touch nodes), locks, unlocks
    and evictions of random sizes; before every eviction the walk predicts the freed slots."""
    rng = random.Random(seed)
    alloc = TokenToKVPoolAllocator(96, "cpu")
    cache, keys, locked = RadixCache(alloc), [[0]], []

    def evict(n: int) -> None:
        expected, before = _walk_order(cache, n), _slots(cache)
        free = alloc.available_size()
        assert cache.evict(n) == len(expected)
        assert sorted(before - _slots(cache)) == sorted(expected)
        assert alloc.available_size() == free + len(expected)
        nodes = _nodes(cache)
        assert cache.evictable_size() == sum(len(n.key) for n in nodes if n.lock_ref == 0)
        assert cache.protected_size() == sum(len(n.key) for n in nodes if n.lock_ref)

    for _ in range(400):
        op = rng.random()
        if op < 0.35:
            old = rng.choice(keys)
            key = old[: rng.randrange(len(old) + 1)]
            key += [rng.randrange(4) for _ in range(rng.randrange(1, 8))]
            if alloc.available_size() < len(key):
                evict(len(key) - alloc.available_size())
            if alloc.available_size() >= len(key):
                _insert(cache, alloc, key)
                keys.append(key)
        elif op < 0.6:
            cache.match_prefix(rng.choice(keys)[: rng.randrange(1, 12)])
        elif op < 0.7:
            locked.append(cache.match_prefix(rng.choice(keys)).last_node)
            cache.inc_lock_ref(locked[-1])
        elif op < 0.8 and locked:
            cache.dec_lock_ref(locked.pop(rng.randrange(len(locked))))
        else:
            evict(rng.choice([1, 2, 3, 5, 8, 13, 40]))
    for node in locked:
        cache.dec_lock_ref(node)
    total = cache.total_size()
    assert cache.reset() == total and not _nodes(cache)
    assert alloc.available_size() == 96


@pytest.fixture
def heap_calls(monkeypatch) -> dict[str, int]:
    """Counts the cache module's heap operations."""
    calls = {"heappush": 0, "heappop": 0, "heapify": 0}

    def counted(name):
        def call(*args):
            calls[name] += 1
            return getattr(heapq, name)(*args)
        return call

    monkeypatch.setattr(radix_cache, "heapq", SimpleNamespace(**{n: counted(n) for n in calls}))
    return calls


@pytest.mark.parametrize("leaves", [20, 2000])
def test_one_eviction_does_not_scale_with_the_tree(heap_calls, leaves):
    cache, keys = _leaves_under_a_shared_prefix(leaves)
    heap_calls.update(heappush=0, heappop=0, heapify=0)
    assert cache.evict(1) == 4  # the oldest leaf, whole: one pop
    assert heap_calls == {"heappush": 0, "heappop": 1, "heapify": 0}
    assert cache.match_prefix(keys[0]).slots.numel() == 8
    cache.match_prefix(keys[1])  # touched: its entry is requeued once, then keys[2] goes
    assert cache.evict(1) == 4
    assert heap_calls == {"heappush": 1, "heappop": 3, "heapify": 0}
    assert cache.match_prefix(keys[1]).slots.numel() == 12
    assert cache.match_prefix(keys[2]).slots.numel() == 8


def test_stale_entries_stay_bounded():
    """A hot leaf locked and unlocked by many requests pushes an entry each time; inserts and
    evictions churn the rest. The heap never holds more than 2 entries per node + slack."""
    rng = random.Random(0)
    cache, keys = _leaves_under_a_shared_prefix(30)
    for step in range(3000):
        node = cache.match_prefix(rng.choice(keys[:3])).last_node
        cache.inc_lock_ref(node)
        cache.dec_lock_ref(node)
        if step % 10 == 0:
            cache.evict(4)
            key = [0] * 8 + [100 + step, 0, 0, 0]
            _insert(cache, cache.allocator, key)
            keys.append(key)
        assert len(cache._heap) <= 2 * (len(_nodes(cache)) + 1) + HEAP_SLACK
    total = cache.total_size()
    assert cache.reset() == total and not _nodes(cache) and len(cache._heap) <= HEAP_SLACK + 2


def test_stale_entries_stay_bounded_when_the_tree_shrinks():
    """50 cold leaves (one entry each) and 10 hot ones holding 12 entries each (unlocked that
    often): evicting the cold ones leaves 12 nodes, and the heap is rebuilt to fit them."""
    cache, keys = _leaves_under_a_shared_prefix(60)
    hot = [cache.match_prefix(key).last_node for key in keys[50:]]
    for _ in range(11):
        for node in hot:
            cache.inc_lock_ref(node)
            cache.dec_lock_ref(node)
    assert len(cache._heap) == 50 + 10 * 12
    assert cache.evict(4 * 50) == 4 * 50
    assert [cache.match_prefix(key).slots.numel() for key in keys] == [8] * 50 + [12] * 10
    assert len(_nodes(cache)) == 11 and len(cache._heap) <= 2 * 12 + HEAP_SLACK


if __name__ == "__main__":
    sys.exit(pytest.main([__file__, "-q"]))
