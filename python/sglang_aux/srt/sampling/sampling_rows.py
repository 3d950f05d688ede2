"""Sampling parameters of every request row, held on the device.

Written once when a request is prefilled; a decode step gathers its rows' parameters with the
step's `req_pool_indices`, so no per-step host-to-device copy carries them.
"""

from __future__ import annotations

import torch

from sglang_aux.srt.sampling.sampler import SamplingTensors, sample
from sglang_aux.srt.sampling.sampling_params import GREEDY_EPS, SamplingParams


class SamplingRows:
    def __init__(self, num_rows: int, vocab_size: int, device: torch.device | str):
        self.vocab_size = vocab_size
        self.device = torch.device(device)
        # [num_rows + 1] each (row 0 pads); columns of `floats`: temperature, top_p
        self.floats = torch.ones((num_rows + 1, 2), dtype=torch.float32, device=device)
        # columns of `ints`: top_k, seed. Top-k starts off, so the padding row a graph's
        # padded requests read samples from a finite distribution (its results are dropped).
        self.ints = torch.zeros((num_rows + 1, 2), dtype=torch.int64, device=device)
        self.ints[:, 0] = vocab_size

    def set(self, rows: list[int], params: list[SamplingParams], seeds: list[int]) -> None:
        """Store the parameters of newly admitted requests: one pinned copy of `[n, 4]` int64
        (row, top_k, seed, then temperature and top_p bit-cast as two float32), not one per
        table and index."""
        floats = torch.tensor([[p.temperature, p.top_p] for p in params], dtype=torch.float32)
        ints = torch.tensor([[row, p.top_k if p.top_k > 0 else self.vocab_size, s]
                             for row, p, s in zip(rows, params, seeds, strict=True)],
                            dtype=torch.int64)
        packed = torch.cat([ints, floats.view(torch.int64)], dim=1)
        if self.device.type == "cuda":  # pinned and non-blocking: a pageable copy would wait
            packed = packed.pin_memory().to(self.device, non_blocking=True)
        index = packed[:, 0]
        self.ints.index_copy_(0, index, packed[:, 1:3])
        self.floats.index_copy_(0, index, packed[:, 3:].view(torch.float32))

    def for_batch(self, rows: torch.Tensor, all_greedy: bool) -> SamplingTensors | None:
        """The parameters of `rows`, or None when every request is greedy (argmax only)."""
        return None if all_greedy else self.gather(rows)

    def sample(self, logits: torch.Tensor, rows: torch.Tensor, positions: torch.Tensor,
               all_greedy: bool) -> torch.Tensor:
        """Next tokens `[bs]` (device) for `rows` from `logits` `[bs, vocab]`, seeded at
        `positions`."""
        return sample(logits, self.for_batch(rows, all_greedy), positions, all_greedy)

    def gather(self, rows: torch.Tensor) -> SamplingTensors:
        """The parameters of `rows` `[bs]` (device int64)."""
        f, i = self.floats[rows], self.ints[rows]
        temperature, top_k = f[:, 0], i[:, 0]
        return SamplingTensors(temperature=temperature, top_k=top_k, top_p=f[:, 1],
                               seed=i[:, 1], is_greedy=(temperature < GREEDY_EPS) | (top_k == 1))
