"""The process-wide memory pool every captured graph allocates from."""

from __future__ import annotations

import torch

_GRAPH_MEMORY_POOL = None


def get_global_graph_memory_pool():
    """One pool for all runners' graphs, so the intermediates of sizes captured later reuse the
    memory the largest size freed (graphs never replay concurrently on one stream)."""
    global _GRAPH_MEMORY_POOL
    if _GRAPH_MEMORY_POOL is None and torch.cuda.is_available():
        _GRAPH_MEMORY_POOL = torch.cuda.graph_pool_handle()
    return _GRAPH_MEMORY_POOL
