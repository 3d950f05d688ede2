"""KV memory: request rows mapping positions to token slots, and per-layer K/V storage.

Slot 0 of the KV pool and row 0 of the request pool are reserved for padding: a padded
graph row reads row 0 (all zeros, so slot 0) and writes its K/V into slot 0, which no live
request ever owns. That makes padded rows inert without branching in the kernels.
"""

from __future__ import annotations

import torch

PADDING_SLOT = 0
PADDING_REQ_ROW = 0


class ReqToTokenPool:
    """`req_to_token[row, position]` = the KV slot of that request's token."""

    def __init__(self, size: int, max_context_len: int, device: torch.device | str):
        self.size = size
        self.max_context_len = max_context_len
        # [size + 1, max_context_len], row 0 is the padding row
        self.req_to_token = torch.zeros(
            (size + 1, max_context_len), dtype=torch.int32, device=device
        )
        self._free_rows = list(range(size, 0, -1))

    def available_size(self) -> int:
        return len(self._free_rows)

    def alloc(self) -> int:
        if not self._free_rows:
            raise RuntimeError(f"all {self.size} request rows are in use")
        return self._free_rows.pop()

    def free(self, row: int) -> None:
        if not 0 < row <= self.size or row in self._free_rows:
            raise ValueError(f"request row {row} is not allocated")
        self._free_rows.append(row)

    def write(self, row: int, start: int, slots: torch.Tensor) -> None:
        end = start + slots.numel()
        if end > self.max_context_len:
            raise ValueError(f"positions [{start}, {end}) exceed context {self.max_context_len}")
        self.req_to_token[row, start:end] = slots.to(torch.int32)


class TokenToKVPoolAllocator:
    """Hands out KV slots `1..size` (slot 0 is the padding slot).

    The free slots are a stack on the device and only its height lives on the host, so
    `alloc` and `free` are device copies that never wait for the device.
    """

    def __init__(self, size: int, device: torch.device | str):
        self.size = size
        self.device = device
        self._stack = torch.arange(size, 0, -1, dtype=torch.int64, device=device)  # [size]
        self._top = size  # slots `_stack[:_top]` are free

    def available_size(self) -> int:
        return self._top

    def alloc(self, n: int) -> torch.Tensor:
        if n > self._top:
            raise RuntimeError(f"need {n} KV slots, {self._top} free")
        self._top -= n
        # a copy: a later `free` pushes into this region of the stack
        return self._stack[self._top : self._top + n].flip(0)

    def free(self, slots: torch.Tensor) -> None:
        n = slots.numel()
        if self._top + n > self.size:
            raise ValueError(f"freeing {n} slots with {self._top} of {self.size} free")
        self._stack[self._top : self._top + n] = slots.reshape(-1)
        self._top += n


class MHATokenToKVPool:
    """Per-layer K and V storage `[size + 1, num_kv_heads, head_dim]`."""

    def __init__(
        self,
        size: int,
        num_layers: int,
        num_kv_heads: int,
        head_dim: int,
        dtype: torch.dtype,
        device: torch.device | str,
    ):
        self.size = size
        shape = (size + 1, num_kv_heads, head_dim)
        self.k_buffer = [torch.zeros(shape, dtype=dtype, device=device) for _ in range(num_layers)]
        self.v_buffer = [torch.zeros(shape, dtype=dtype, device=device) for _ in range(num_layers)]

    def set_kv(self, layer_id: int, loc: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> None:
        self.k_buffer[layer_id][loc] = k.to(self.k_buffer[layer_id].dtype)
        self.v_buffer[layer_id][loc] = v.to(self.v_buffer[layer_id].dtype)
