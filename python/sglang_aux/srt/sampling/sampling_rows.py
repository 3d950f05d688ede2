"""Sampling parameters of every request row, held on the device.

Staged when a request is admitted and written by the step that prefills it; a decode step
gathers its rows' parameters with the step's `req_pool_indices`, so no per-step host-to-device
copy carries them.
"""

from __future__ import annotations

import struct

import torch

from sglang_aux.srt.sampling.param_ranges import check_int64
from sglang_aux.srt.sampling.sampler import SamplingTensors, sample
from sglang_aux.srt.sampling.sampling_params import GREEDY_EPS, SamplingParams

# temperature, top_p, min_p (and a zero) as little-endian float32, read back as the two int64
# they fill
_FLOAT32_QUAD = struct.Struct("<ffff")
_INT64_PAIR = struct.Struct("<qq")


class SamplingRows:
    def __init__(self, num_rows: int, vocab_size: int, device: torch.device | str):
        self.vocab_size = vocab_size
        self.device = torch.device(device)
        # [num_rows + 1] each (row 0 pads); columns of `floats`: temperature, top_p, min_p
        self.floats = torch.ones((num_rows + 1, 3), dtype=torch.float32, device=device)
        self.floats[:, 2] = 0.0
        # columns of `ints`: top_k, seed. Top-k starts off, so the padding row a graph's
        # padded requests read samples from a finite distribution (its results are dropped).
        self.ints = torch.zeros((num_rows + 1, 2), dtype=torch.int64, device=device)
        self.ints[:, 0] = vocab_size
        self._staged: dict[int, list[int]] = {}  # row -> packed parameters, until written

    def stage(self, row: int, params: SamplingParams, seed: int) -> None:
        """Pack an admitted request's parameters for `write` as one host row of int64s (row,
        top_k, seed, then temperature, top_p, min_p and 0 bit-cast as float32). Raises, staging
        nothing, when a value does not fit its column: the scheduler calls this per request
        at admission, so such a request fails alone."""
        top_k = min(params.top_k, self.vocab_size) if params.top_k > 0 else self.vocab_size
        check_int64("seed", seed)
        floats = _INT64_PAIR.unpack(_FLOAT32_QUAD.pack(params.temperature, params.top_p,
                                                       params.min_p, 0.0))
        self._staged[row] = [row, top_k, seed, *floats]

    def write(self, rows: list[int]) -> None:
        """Store the staged parameters of `rows` (newly admitted requests) with one pinned
        copy of `[n, 5]` int64, not one per table and index."""
        packed = torch.tensor([self._staged.pop(row) for row in rows], dtype=torch.int64)
        if self.device.type == "cuda":  # pinned and non-blocking: a pageable copy would wait
            packed = packed.pin_memory().to(self.device, non_blocking=True)
        index = packed[:, 0]
        self.ints.index_copy_(0, index, packed[:, 1:3])
        self.floats.index_copy_(0, index, packed[:, 3:].view(torch.float32)[:, :3])

    def for_batch(self, rows: torch.Tensor, all_greedy: bool,
                  min_p: bool = False) -> SamplingTensors | None:
        """The parameters of `rows`, or None when every request is greedy (argmax only)."""
        return None if all_greedy else self.gather(rows, min_p)

    def sample(self, logits: torch.Tensor, rows: torch.Tensor, positions: torch.Tensor,
               all_greedy: bool, min_p: bool = False) -> torch.Tensor:
        """Next tokens `[bs]` (device) for `rows` from `logits` `[bs, vocab]`, seeded at
        `positions`; `min_p`: a request may set min_p (known on the host)."""
        return sample(logits, self.for_batch(rows, all_greedy, min_p), positions, all_greedy)

    def gather(self, rows: torch.Tensor, min_p: bool = False) -> SamplingTensors:
        """The parameters of `rows` `[bs]` (device int64); their min_p with `min_p` (a row
        may set it, known on the host)."""
        f, i = self.floats[rows], self.ints[rows]
        temperature, top_k = f[:, 0], i[:, 0]
        return SamplingTensors(temperature=temperature, top_k=top_k, top_p=f[:, 1],
                               seed=i[:, 1], is_greedy=(temperature < GREEDY_EPS) | (top_k == 1),
                               min_p=f[:, 2] if min_p else None)
