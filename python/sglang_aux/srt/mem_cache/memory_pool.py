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
    """`req_to_token[row, position]` = the KV slot of that request's token.

    Each row's kv_len and last token also live here, on the device (`kv_lens`,
    `last_tokens`): a prefill sets them and every decode step advances them on the device,
    so a step's inputs need only the rows from the host, and the host may launch the next
    step before it has read this one's tokens (the overlap scheduler). The host's
    `Req.kv_len` trails them by the steps it has not read yet.
    """

    def __init__(self, size: int, max_context_len: int, device: torch.device | str):
        self.size = size
        self.max_context_len = max_context_len
        # [size + 1, max_context_len], row 0 is the padding row
        self.req_to_token = torch.zeros(
            (size + 1, max_context_len), dtype=torch.int32, device=device
        )
        self._free_rows = list(range(size, 0, -1))
        # [size + 1] each; the padding row stays at kv_len 0
        self.kv_lens = torch.zeros(size + 1, dtype=torch.int64, device=device)
        self.last_tokens = torch.zeros(size + 1, dtype=torch.int64, device=device)

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

    def set_rows(self, rows: torch.Tensor, kv_lens: torch.Tensor,
                 last_tokens: torch.Tensor) -> None:
        """A prefill's rows `[bs]` now hold `kv_lens` tokens and end in `last_tokens`."""
        self.kv_lens.index_copy_(0, rows, kv_lens)
        self.last_tokens.index_copy_(0, rows, last_tokens)

    def advance_rows(self, rows: torch.Tensor, added: torch.Tensor | int,
                     last_tokens: torch.Tensor) -> None:
        """A decode step wrote `added` more tokens' K/V per row and chose `last_tokens`."""
        if isinstance(added, int):  # a fill kernel, not a host copy
            added = torch.full_like(rows, added)
        self.kv_lens.index_add_(0, rows, added)
        self.last_tokens.index_copy_(0, rows, last_tokens)


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
