"""The process-wide memory pools captured graphs allocate from."""

from __future__ import annotations

import weakref

import torch

# Graphs of one pool never replay concurrently: the prefill graphs get a pool of their own
# when they replay beside a decode step (`SideStream`).
SHARED_POOL = "shared"
PREFILL_POOL = "prefill"

_POOLS: dict[str, object] = {}
# Whoever holds graphs captured into each pool. The allocator frees a private pool once its
# last graph is gone, and capturing into a freed pool id fails an allocator assertion, so a
# new pool starts once every holder is gone (an engine torn down and built again in-process).
_POOL_HOLDERS: dict[str, weakref.WeakSet] = {}


def get_global_graph_memory_pool(holder: object, name: str = SHARED_POOL):
    """One pool per `name` for all live runners' graphs, so the intermediates of sizes
    captured later reuse the memory the largest size freed (graphs of one pool never replay
    concurrently). `holder` keeps the pool alive: pass the object that owns the graphs."""
    if not torch.cuda.is_available():
        return None
    holders = _POOL_HOLDERS.setdefault(name, weakref.WeakSet())
    if name not in _POOLS or len(holders) == 0:
        _POOLS[name] = torch.cuda.graph_pool_handle()
    holders.add(holder)
    return _POOLS[name]
