"""The process-wide memory pool captured graphs allocate from."""

from __future__ import annotations

import weakref

import torch

_POOL: object | None = None
# Whoever holds graphs captured into the pool. The allocator frees a private pool once its last
# graph is gone, and capturing into a freed pool id fails an allocator assertion, so a new pool
# starts once every holder is gone (an engine torn down and built again in-process).
_POOL_HOLDERS: weakref.WeakSet = weakref.WeakSet()


def get_global_graph_memory_pool(holder: object):
    """One pool for all live runners' graphs, so the intermediates of sizes captured later
    reuse the memory the largest size freed (graphs never replay concurrently). `holder`
    keeps the pool alive: pass the object that owns the graphs."""
    global _POOL
    if not torch.cuda.is_available():
        return None
    if _POOL is None or len(_POOL_HOLDERS) == 0:
        _POOL = torch.cuda.graph_pool_handle()
    _POOL_HOLDERS.add(holder)
    return _POOL
