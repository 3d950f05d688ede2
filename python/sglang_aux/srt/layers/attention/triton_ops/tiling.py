"""Tile sizes and launch settings shared by the attention kernels."""

from __future__ import annotations

import functools
from dataclasses import dataclass

import torch
import triton
import triton.language as tl

MIN_HEAD_DIM = 16  # tl.dot needs every operand dimension >= 16
MAX_HEAD_DIM = 256  # one [rows, head_dim] fp32 accumulator must fit in registers
MIN_DOT_ROWS = 16
LOG2E = 1.4426950408889634  # the kernels use exp2, so scores are scaled by log2(e)
# NOTE: a finite stand-in for -inf as the running max and log-sum-exp of "no key seen yet", so
# exp2(m_old - m_new) never computes inf - inf; an empty key split merges with weight 0 next to
# any split that saw keys, and a query that saw no key at all comes out 0, never NaN.
NO_KEYS = tl.constexpr(-1.0e30)

# From this many accumulator elements per program on, 4 warps spill registers on sm_90 (the
# gathered K/V tiles carry 64-bit pointers), so such tiles get 8 warps.
WIDE_TILE_ELEMS = 4096
MERGE_NUM_WARPS = 4
# Query heads of a token one merge program combines: measured on the H200 at Qwen2.5-1.5B's 12
# heads and a 900-key context (`bench_decode_attention.py --merge-heads`, docs/kernels.md), 4
# took a 16-token verify's attention from 52.5 to 36.3 us a call at bs 32 and from 17.5 to 13.8
# at bs 8, and a decode's 3-7% off; 1 and 16 lost to it everywhere.
MERGE_HEADS = 4
# Two stages keep (K tile + V tile) * stages well inside shared memory for every head_dim and
# dtype; the kernels are bound by the gathered K/V loads, not by pipelining depth.
NUM_STAGES = 2
MAX_KV_SPLITS = 16
# The in-kernel merge splits a tile's keys only past this many per split (4 key tiles at
# head_dim <= 128): shorter contexts stream in one program and skip the merge. A first guess,
# not yet measured on the H200: `bench_decode_attention.py --min-split-keys` sweeps it.
MIN_SPLIT_KEYS = 256
# Launch about this many programs per SM before splitting keys further stops paying off.
PROGRAMS_PER_SM = 2


@dataclass(frozen=True)
class SinglePassTile:
    """A candidate for short contexts (bench-only until it wins on the H200, docs/kernels.md):
    the fixed-layout kernel with no key split, one program per (request, kv head, row tile)
    walking every key in `block_n`-key steps and writing the output itself (no merge launch),
    with its own warps and pipeline depth."""

    block_n: int = 64
    num_warps: int = 4
    num_stages: int = NUM_STAGES

    def __post_init__(self):
        if self.block_n < MIN_DOT_ROWS or self.block_n & (self.block_n - 1):
            raise ValueError(f"single-pass block_n must be a power of two >= {MIN_DOT_ROWS}, "
                             f"got {self.block_n}")


@triton.jit
def window_start(first_q_pos, seq_len, SLIDING_WINDOW_SIZE: tl.constexpr):
    """The first key position a tile whose earliest query sits at `first_q_pos` can see (0
    without a window), at most `seq_len`."""
    start = first_q_pos * 0  # one return statement: no reliance on early-return support
    if SLIDING_WINDOW_SIZE >= 0:
        start = tl.minimum(tl.maximum(first_q_pos - SLIDING_WINDOW_SIZE, 0), seq_len)
    return start


def check_head_dim(head_dim: int) -> None:
    """The kernels tile the head dimension as one power-of-two block."""
    if not (MIN_HEAD_DIM <= head_dim <= MAX_HEAD_DIM and head_dim & (head_dim - 1) == 0):
        raise ValueError(
            f"Triton attention needs head_dim a power of two in [{MIN_HEAD_DIM}, "
            f"{MAX_HEAD_DIM}], got {head_dim}"
        )


def kv_block(head_dim: int) -> int:
    """Keys per inner-loop step; halved for wide heads to bound registers and shared memory."""
    return 64 if head_dim <= 128 else 32


def max_q_block(head_dim: int) -> int:
    """Query rows per program (an upper bound; small problems use fewer)."""
    return 64 if head_dim <= 128 else 32


def q_block(rows: int, head_dim: int) -> int:
    """The smallest power-of-two row tile that tl.dot accepts, capped by `max_q_block` (a
    16-token verify's 96 GQA rows in one 128-row tile lost to two of 64 on the H200: 0.85-0.97x,
    one program an SM at 195 registers; docs/kernels.md)."""
    return min(max(MIN_DOT_ROWS, triton.next_power_of_2(rows)), max_q_block(head_dim))


def num_warps(block_m: int, head_dim: int) -> int:
    """Warps for a program holding a `[block_m, head_dim]` accumulator."""
    return 8 if block_m * head_dim >= WIDE_TILE_ELEMS else 4


def dot_precision(dtype: torch.dtype) -> str:
    """fp32 dots default to TF32 on NVIDIA GPUs; ask for IEEE fp32 so fp32 stays exact (and slow:
    fp32 on a GPU is for checking, bf16/fp16 are the fast paths)."""
    return "ieee" if dtype == torch.float32 else "tf32"


@functools.cache
def sm_count(device_index: int) -> int:
    """Streaming multiprocessors of a CUDA device (a host query, cached: no device sync)."""
    return torch.cuda.get_device_properties(device_index).multi_processor_count


def pick_num_kv_splits(programs: int, device: torch.device, at_most: bool = False) -> int:
    """Key splits that bring `programs` up to PROGRAMS_PER_SM per SM (1 off CUDA); with
    `at_most`, the most that stay within it. Multi-token launches take `at_most`: their merge
    has a row per token, and at a 16-token verify of 32 requests 2 splits took 31.3 us a call
    where 3 took 36.1 (one-token decode at bs 32: 4 splits 15.9 where 5 took 15.5; H200,
    docs/kernels.md).

    Depends only on static shapes, so a captured graph keeps the same split at every replay.
    """
    if device.type != "cuda":
        return 1
    target = sm_count(device.index or 0) * PROGRAMS_PER_SM
    splits = target // programs if at_most else triton.cdiv(target, programs)
    return max(1, min(MAX_KV_SPLITS, splits))
