"""The Python heap frozen around a run of graph captures."""

from __future__ import annotations

import gc
from collections.abc import Iterator
from contextlib import contextmanager

_depth = 0


@contextmanager
def frozen_gc() -> Iterator[None]:
    """One full collection, then every object moved to the permanent generation and automatic
    collection off until the outermost block ends (SGLang's `freeze_gc`). A collection
    during a capture may free garbage holding CUDA state and invalidate it; a collection of
    a server's heap costs ~0.1 s, paid before each of hundreds of captures before this. Any
    collection inside the block (ours, or torch's before a capture) scans only what the
    block made. Objects frozen before the outermost block (by the hosting process)
    stay frozen: Python thaws the permanent generation only whole, so then ours stay with
    them."""
    global _depth
    if _depth:
        _depth += 1
        try:
            yield
        finally:
            _depth -= 1
        return
    enabled, thaw = gc.isenabled(), gc.get_freeze_count() == 0
    gc.collect()
    gc.freeze()
    gc.disable()
    _depth = 1
    try:
        yield
    finally:
        _depth = 0
        if thaw:
            gc.unfreeze()
        if enabled:
            gc.enable()


def in_frozen_gc() -> bool:
    """Whether a `frozen_gc` block is open."""
    return _depth > 0
