"""Which kernel and tile config runs an MXFP8-activation GEMM, per weight format and M.

Candidates (names as the H200 sweep `benchmark/aux_memory/bench_mxfp8_gemm.py` prints them):
- "fp8dot_<cfg>": FP8 tensor-core dots per 32-wide scale group (`accumulating_gemm`), MXFP8
  weights only;
- "bf16dot_<cfg>": operands dequantized to BF16 in registers, exact products
  (`dequant_gemm`), either weight format; "..._wc<R>": MXFP8 weights dequantized R rows at a
  time to a BF16 scratch first.
- "cublas_kc<C>[_wr<R>][_ov]": operands dequantized to BF16 scratch C columns of K at a time,
  cuBLAS accumulating into fp32 (`chunked_cublas_gemm`), either weight format, any C (a
  multiple of 32; bitwise staged == streamed == concat needs H % C == 0).
The choice depends on M and the weight format only, never on K, so the staged, streamed and
concat calls of one projection run one kernel with one config and agree bit for bit.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Literal

import torch

from sglang_aux.srt.layers.quantization import accumulating_gemm as ag
from sglang_aux.srt.layers.quantization import chunked_cublas_gemm as cc
from sglang_aux.srt.layers.quantization import dequant_gemm as dg

WeightFormat = Literal["mxfp8", "bf16"]


@dataclass(frozen=True)
class Candidate:
    kernel: Literal["fp8_dot", "bf16_dot", "cublas_chunked"]
    config: ag.GemmConfig | dg.DequantConfig | cc.ChunkConfig


_FP8_DOT = {f"fp8dot_{n}": Candidate("fp8_dot", c) for n, c in ag.FP8_DOT_CANDIDATES.items()}
_BF16_DOT = {f"bf16dot_{n}": Candidate("bf16_dot", c) for n, c in dg.BF16_DOT_CANDIDATES.items()}
_CHUNKED = {f"bf16dot_{n}": Candidate("bf16_dot", c)
            for n, c in dg.WEIGHT_CHUNK_CANDIDATES.items()}
_CUBLAS = {n: Candidate("cublas_chunked", c) for n, c in cc.CANDIDATES.items()}
CANDIDATES: dict[WeightFormat, dict[str, Candidate]] = {
    "mxfp8": {**_FP8_DOT, **_BF16_DOT, **_CHUNKED, **_CUBLAS},
    "bf16": {**_BF16_DOT, **_CUBLAS},
}
# The production choice for more than SMALL_M rows, the one place to switch it: set each entry
# to the "best" line of the H200 sweep (docs/data/mxfp8_gemm_h200.json, M 4096, N 7168,
# K 43008): mxfp8 weight 7.68 ms (the best BF16-dot one, through a BF16 weight scratch, 7.83),
# bf16 weight 6.24 ms. A "cublas_kc<C>" entry keeps staged == streamed bitwise only for aux
# widths H with H % C == 0 (K3: 7168; SmolLM2's 576 needs C dividing 576).
LARGE_M_CHOICE: dict[WeightFormat, str] = {
    "mxfp8": "fp8dot_m64n128w4s6",
    "bf16": "bf16dot_tma_m128n128k64w8s3",
}
# Verify-sized forwards stream the weight: narrow tiles, many programs.
SMALL_M_CHOICE: dict[WeightFormat, str] = {
    "mxfp8": "fp8dot_m64n64w4s6",
    "bf16": "bf16dot_ptr_m64n64k64w4s4",
}


# Aux projections (K = slices of one width H) with an MXFP8 weight and at least this many rows
# walk K one slice at a time through BF16 scratch and cuBLAS (`sliced_choice`). Below it the
# per-call weight dequantization (~1.5 GB of traffic at K3 dims, ~0.35 ms) outweighs what
# cuBLAS saves (the FP8-dot kernel costs ~1.9 us a row there, the cuBLAS walk ~0.85).
SLICED_CUBLAS_MIN_M = 1024


def sliced_choice(m: int, slice_width: int) -> str | None:
    """The GEMM of an M-row aux projection with an MXFP8 weight: from SLICED_CUBLAS_MIN_M rows,
    chunked cuBLAS with one aux slice per chunk (H200, M 4096 at K3 dims: 3.79 ms against the
    FP8-dot kernel's 7.77; `docs/data/mxfp8_gemm_cublas_h200.json`), whose staged, streamed
    and concat calls make the same cuBLAS calls and so agree bit for bit; else None (the
    production choice for M)."""
    return f"cublas_kc{slice_width}" if m >= SLICED_CUBLAS_MIN_M else None


def choose(m: int, weight_format: WeightFormat, name: str | None = None) -> Candidate:
    """The candidate `name`, or the production choice for an M-row GEMM."""
    table = CANDIDATES[weight_format]
    if name is None:
        name = (SMALL_M_CHOICE if m <= ag.SMALL_M else LARGE_M_CHOICE)[weight_format]
    if name not in table and (chunked := cc.parse(name)) is not None:
        return Candidate("cublas_chunked", chunked)  # a chunk size outside the sweep's set
    if name not in table:
        raise ValueError(f"unknown {weight_format}-weight GEMM candidate {name!r}; one of "
                         f"{sorted(table)}")
    return table[name]


def mxfp8_gemm_accumulate(xq: torch.Tensor, xs: torch.Tensor,
                          w: torch.Tensor | tuple[torch.Tensor, torch.Tensor],
                          out: torch.Tensor, acc: torch.Tensor | None = None,
                          candidate: str | None = None) -> None:
    """out[M, N] = acc + dequant(xq, xs)[M, K] @ W[N, K]^T, fp32 sum rounded once into `out`.

    `w`: an MXFP8 pair (values [N, K] e4m3fn, scales [N, K/32] uint8) or a bf16 weight [N, K].
    Operands may be column slices of wider buffers (offsets multiples of 32); `out` may be
    `acc`. `candidate` names one of `CANDIDATES` or any "cublas_kc<C>..." (None: the
    production choice for M). CPU tensors (CI): the Triton kernels under TRITON_INTERPRET=1,
    the chunked-cuBLAS walk as its fp32 CPU twin."""
    fmt: WeightFormat = "mxfp8" if isinstance(w, tuple) else "bf16"
    choice = choose(xq.shape[0], fmt, candidate)
    if choice.kernel == "cublas_chunked":
        cc.chunked_gemm_accumulate(xq, xs, w, out, acc, choice.config)
    elif choice.kernel == "fp8_dot":
        cfg = ag.INTERPRETER_CONFIG if ag._INTERPRETED else choice.config
        ag.fp8_dot_gemm_accumulate(xq, xs, *w, out, acc, cfg)
    else:
        cfg = choice.config
        if ag._INTERPRETED:  # small tiles on CPU, the variant (TMA, persistent, chunks) kept
            cfg = replace(cfg, block_m=16, block_n=16, block_k=32, num_warps=4, num_stages=1,
                          group_m=2, weight_chunk=min(cfg.weight_chunk, 16))
        dg.bf16_dot_gemm_accumulate(xq, xs, w, out, acc, cfg)
