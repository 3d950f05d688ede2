"""A prefix cache: a radix tree over token ids whose nodes own the KV slots of those tokens.

Page size 1: every token has its own slot. A node's `key` holds its tokens and `value` their
slots `[len(key)]` (int64, on the allocator's device); the root holds none. The path from the
root to a node spells a token prefix whose K/V sits in the slots along it.

Slot life cycle: a slot is in exactly one place at a time: the allocator's free list, this
tree (`insert` hands it over), or a live request's private reservation. The tree gives slots
back to the allocator only through `evict` and `reset`, and only from unlocked nodes: a
request that reads a cached prefix locks its path (`inc_lock_ref`) until it is done.

Eviction order: the unlocked leaf with the least (last_access, id) first. The candidates sit in
a lazy min-heap so that `evict` costs O(evicted nodes * log n), not a tree walk. Invariant:
every unlocked leaf has an entry whose key is at most its current one. Matches and inserts
only raise `last_access`, so they push nothing; `evict` requeues an entry popped with an old
key (at most once per leaf touched since its push: amortized over the touches), and drops
entries of nodes evicted, locked, or with children (they are pushed again when they next
become unlocked leaves: new in `insert`, unlocked in `dec_lock_ref`, emptied in `evict`).
A rebuild (`_bound_heap`) keeps the heap within 2 entries per node (+ HEAP_SLACK).
"""

from __future__ import annotations

import heapq
import itertools
from dataclasses import dataclass, field

import torch

from sglang_aux.srt.mem_cache.memory_pool import TokenToKVPoolAllocator

HEAP_SLACK = 64  # stale eviction-heap entries tolerated beyond 2 per node before a rebuild


@dataclass(eq=False)
class TreeNode:
    key: list[int]
    value: torch.Tensor  # [len(key)] KV slots of the key's tokens
    parent: TreeNode | None = field(repr=False)  # None for the root and evicted nodes
    # keyed by the child's first token
    children: dict[int, TreeNode] = field(default_factory=dict, repr=False)
    lock_ref: int = 0  # requests reading this node (or a descendant)
    last_access: int = 0  # the tree's clock at the latest match or insert through this node
    id: int = 0  # orders equal access times in the eviction heap


@dataclass
class MatchResult:
    slots: torch.Tensor  # [matched tokens] KV slots of the longest cached prefix
    last_node: TreeNode  # where that prefix ends (the root when nothing matched): lock it


def common_prefix_len(a: list[int], b: list[int]) -> int:
    """Length of the longest common prefix: slice comparisons (C loops), bisected."""
    n = min(len(a), len(b))
    if a[:n] == b[:n]:
        return n
    lo, hi = 0, n  # a[:lo] == b[:lo] and a[:hi] != b[:hi]
    while hi - lo > 1:
        mid = (lo + hi) // 2
        if a[lo:mid] == b[lo:mid]:
            lo = mid
        else:
            hi = mid
    return lo


class RadixCache:
    def __init__(self, allocator: TokenToKVPoolAllocator):
        self.allocator = allocator
        self._ids = itertools.count()
        self._clock = itertools.count(1)
        self._nodes = 0  # in the tree, root included
        self._heap: list[tuple[int, int, TreeNode]] = []  # (last_access, id, node) candidates
        empty = torch.empty(0, dtype=torch.int64, device=allocator.device)
        self.root = self._node([], empty, None)
        self._evictable = self._protected = 0

    def reset(self) -> int:
        """Flush: free every unlocked node's slots (all of them once no request runs) and
        return how many were freed. Locked paths stay."""
        return self.evict(self._evictable)

    def evictable_size(self) -> int:
        """Cached tokens no request holds: `evict` can free them."""
        return self._evictable

    def protected_size(self) -> int:
        """Cached tokens on paths that running requests hold locked."""
        return self._protected

    def total_size(self) -> int:
        return self._evictable + self._protected

    def match_prefix(self, key: list[int]) -> MatchResult:
        """The longest cached prefix of `key`. A match ending inside a node splits it, so the
        returned node ends exactly there."""
        key, node, i, values, now = list(key), self.root, 0, [], next(self._clock)
        while i < len(key) and (child := node.children.get(key[i])) is not None:
            n = common_prefix_len(child.key, key[i : i + len(child.key)])
            partial = n < len(child.key)
            if partial:
                child = self._split(child, n)
            child.last_access = now
            values.append(child.value)
            node, i = child, i + n
            if partial:
                break
        slots = torch.cat(values) if values else self.root.value
        return MatchResult(slots, node)

    def insert(self, key: list[int], slots: torch.Tensor) -> int:
        """Cache `slots[i]` (int64, kept as views: never write them) as the K/V slot of
        `key[i]`. Returns how many leading tokens were cached already: the tree keeps its own
        slots for those, so the caller still owns `slots[:returned]` (and frees those that
        are not the tree's own) while the tree now owns the rest."""
        if slots.shape != (len(key),) or slots.dtype != torch.int64:
            raise ValueError(f"{len(key)} tokens need int64 slots of shape ({len(key)},), got "
                             f"{slots.dtype} {tuple(slots.shape)}")
        key, node, i, now = list(key), self.root, 0, next(self._clock)
        while i < len(key):
            child = node.children.get(key[i])
            if child is None:
                new = self._node(key[i:], slots[i:], node, now)
                node.children[key[i]] = new
                self._evictable += len(new.key)
                self._push(new)
                break
            n = common_prefix_len(child.key, key[i : i + len(child.key)])
            if n < len(child.key):
                child = self._split(child, n)
            child.last_access = now
            node, i = child, i + n
        return i

    def inc_lock_ref(self, node: TreeNode) -> None:
        """A request reads the prefix ending at `node`: its path cannot be evicted."""
        while node is not self.root:
            if node.lock_ref == 0:
                self._evictable -= len(node.key)
                self._protected += len(node.key)
            node.lock_ref += 1
            node = node.parent

    def dec_lock_ref(self, node: TreeNode) -> None:
        while node is not self.root:
            if node.lock_ref == 0:
                raise RuntimeError("unlocking a radix node that is not locked")
            node.lock_ref -= 1
            if node.lock_ref == 0:
                self._evictable += len(node.key)
                self._protected -= len(node.key)
                if not node.children:
                    self._push(node)
            node = node.parent

    def evict(self, num_tokens: int) -> int:
        """Free at least `num_tokens` slots (fewer when fewer are evictable), least recently
        used unlocked leaves first; a parent left childless joins the candidates. Returns the
        number freed."""
        freed, values = 0, []
        while freed < num_tokens and self._heap:
            last_access, _, node = heapq.heappop(self._heap)
            if not self._is_candidate(node):
                continue
            if last_access != node.last_access:  # touched since pushed: requeue at its new time
                heapq.heappush(self._heap, (node.last_access, node.id, node))
                continue
            parent = node.parent
            del parent.children[node.key[0]]
            node.parent = None
            self._nodes -= 1
            values.append(node.value)
            freed += len(node.key)
            if parent is not self.root and not parent.children and parent.lock_ref == 0:
                self._push(parent)
        if values:
            self.allocator.free(torch.cat(values))  # one device copy
        self._evictable -= freed
        self._bound_heap()  # the evicted nodes' duplicate entries may outnumber the rest now
        return freed

    @staticmethod
    def _is_candidate(node: TreeNode) -> bool:
        """An unlocked leaf still in the tree."""
        return node.parent is not None and not node.children and node.lock_ref == 0

    def _push(self, node: TreeNode) -> None:
        heapq.heappush(self._heap, (node.last_access, node.id, node))
        self._bound_heap()

    def _bound_heap(self) -> None:
        """Rebuild from the live candidates when stale entries pile up (e.g. a leaf locked and
        unlocked many times without an eviction): amortized O(1) per push or evicted node."""
        if len(self._heap) > 2 * self._nodes + HEAP_SLACK:
            # every candidate has an entry (the invariant), so the heap itself lists them all
            live = {n.id: n for _, _, n in self._heap if self._is_candidate(n)}
            self._heap = [(n.last_access, n.id, n) for n in live.values()]
            heapq.heapify(self._heap)

    def _split(self, child: TreeNode, n: int) -> TreeNode:
        """Cut `child` after its first `n` tokens; returns the new upper node. Locks and sizes
        carry over: every request holding `child` holds the upper part too."""
        upper = self._node(child.key[:n], child.value[:n], child.parent, child.last_access)
        upper.lock_ref = child.lock_ref
        child.parent.children[child.key[0]] = upper
        child.key, child.value, child.parent = child.key[n:], child.value[n:], upper
        upper.children[child.key[0]] = child
        return upper

    def _node(self, key: list[int], value: torch.Tensor, parent: TreeNode | None,
              last_access: int = 0) -> TreeNode:
        self._nodes += 1
        return TreeNode(key, value, parent, last_access=last_access, id=next(self._ids))
