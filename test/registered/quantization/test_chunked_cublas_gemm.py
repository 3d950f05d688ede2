"""Dequantize-then-cuBLAS in K chunks, its CPU twin: the chunk walk is the specified sum, the
BF16 dequant is exact exactly where claimed, and staged == streamed == concat bit for bit
(through `MXFP8InputAccumulator`, `StreamedProjection` and slice chains), close to float64.
Fresh random inputs per run; the seed is in every failure message."""

import os
import random
import sys

import torch

if not torch.cuda.is_available():
    # Must precede the first @triton.jit definition: the dequant runs the Triton kernel.
    os.environ.setdefault("TRITON_INTERPRET", "1")

import pytest  # noqa: E402

from sglang_aux.srt.layers.quantization import chunked_cublas_gemm as cc  # noqa: E402
from sglang_aux.srt.layers.quantization import mxfp8_gemm_choice as choice  # noqa: E402
from sglang_aux.srt.layers.quantization.mxfp8 import quantize_mxfp8
from sglang_aux.srt.layers.quantization.mxfp8_format import dequantize_mxfp8
from sglang_aux.srt.layers.quantization.mxfp8_linear import MXFP8Linear  # noqa: E402
from sglang_aux.srt.layers.quantization.staged_input import MXFP8InputAccumulator  # noqa: E402
from sglang_aux.srt.layers.quantization.streamed_projection import (  # noqa: E402
    StreamedProjection,
)
from sglang_aux.test.ci.ci_register import register_cpu_ci  # noqa: E402

register_cpu_ci(est_time=40, suite="default")

NUM_SLICES, HIDDEN, N = 3, 128, 40
# (chunk columns, weight rows, overlap): whole slices, two chunks a slice, bounded weight rows.
CONFIGS = ["cublas_kc128", "cublas_kc64", "cublas_kc64_wr16", "cublas_kc32_wr24_ov"]


def seeded() -> tuple[int, torch.Generator]:
    seed = random.SystemRandom().randrange(2**31)
    return seed, torch.Generator().manual_seed(seed)


def operands(tokens: int, gen: torch.Generator, mxfp8_weight: bool):
    x = torch.randn(tokens, NUM_SLICES * HIDDEN, generator=gen).bfloat16()
    w = (torch.randn(N, NUM_SLICES * HIDDEN, generator=gen) * 0.05).bfloat16()
    return x, (quantize_mxfp8(w) if mxfp8_weight else w)


def weight_slice(w, lo: int, hi: int):
    if isinstance(w, tuple):
        return w[0][:, lo:hi], w[1][:, lo // 32:hi // 32]
    return w[:, lo:hi]


def chain(x: torch.Tensor, w, name: str) -> torch.Tensor:
    acc = torch.full((x.shape[0], N), float("nan"))
    for i in range(NUM_SLICES):
        lo, hi = i * HIDDEN, (i + 1) * HIDDEN
        choice.mxfp8_gemm_accumulate(*quantize_mxfp8(x[:, lo:hi]), weight_slice(w, lo, hi),
                                     acc, None if i == 0 else acc, name)
    return acc


@pytest.mark.parametrize("name", CONFIGS)
@pytest.mark.parametrize("tokens", [1, 17, 40])
@pytest.mark.parametrize("mxfp8_weight", [True, False])
def test_staged_streamed_concat_bitwise(name: str, tokens: int, mxfp8_weight: bool) -> None:
    seed, gen = seeded()
    x, w = operands(tokens, gen, mxfp8_weight)
    xq, xs = quantize_mxfp8(x)
    concat = torch.full((tokens, N), float("nan"))
    choice.mxfp8_gemm_accumulate(xq, xs, w, concat, candidate=name)
    assert torch.equal(chain(x, w, name), concat), f"seed {seed}"
    slices = [x[:, i * HIDDEN:(i + 1) * HIDDEN] for i in range(NUM_SLICES)]
    linear = w if not mxfp8_weight else MXFP8Linear(NUM_SLICES * HIDDEN, N, torch.float32)
    if mxfp8_weight:
        linear.weight_values.copy_(w[0])
        linear.weight_scales.copy_(w[1])
    staged = MXFP8InputAccumulator(linear, torch.full((tokens, N), float("nan")), HIDDEN,
                                   NUM_SLICES, dtype=torch.bfloat16, candidate=name)
    for s in slices:
        staged.accumulate(s)
    assert torch.equal(staged.result(), concat), f"seed {seed}"
    if mxfp8_weight:  # a dense streamed weight takes BF16 activations: no MXFP8 GEMM there
        proj = StreamedProjection(linear, torch.full((tokens, N), float("nan")), HIDDEN,
                                  NUM_SLICES, torch.bfloat16, torch.float32, candidate=name)
        for s in slices:
            proj.accumulate(s)
        assert torch.equal(proj.result(), concat), f"seed {seed}"
    a = dequantize_mxfp8(xq, xs).double()
    b = dequantize_mxfp8(*w).double() if mxfp8_weight else w.double()
    bound = 2 * a.shape[1] * 2.0**-24 * (a.abs() @ b.abs().T) + 1e-30
    assert ((concat.double() - a @ b.T).abs() <= bound).all(), f"seed {seed}"


def test_walk_is_the_sum_of_chunk_products_in_order() -> None:
    """Independently: fp32 (A_0 B_0^T + A_1 B_1^T) + ..., one chunk of 32 columns each."""
    seed, gen = seeded()
    x, (wq, ws) = operands(9, gen, True)
    xq, xs = quantize_mxfp8(x)
    a, b = dequantize_mxfp8(xq, xs), dequantize_mxfp8(wq, ws)
    chunks = [(a[:, k0:k0 + 32].contiguous(), b[:, k0:k0 + 32].contiguous())
              for k0 in range(0, a.shape[1], 32)]
    expected = chunks[0][0] @ chunks[0][1].T
    for ac, bc in chunks[1:]:
        expected.addmm_(ac, bc.T)
    out = torch.full(expected.shape, float("nan"))
    choice.mxfp8_gemm_accumulate(xq, xs, (wq, ws), out, candidate="cublas_kc32")
    assert torch.equal(out, expected), f"seed {seed}"
    # A narrow out is the same fp32 sum rounded once; out == acc accumulates in place;
    # a distinct acc is read, not written.
    narrow = torch.empty(expected.shape, dtype=torch.bfloat16)
    choice.mxfp8_gemm_accumulate(xq, xs, (wq, ws), narrow, candidate="cublas_kc32")
    assert torch.equal(narrow, expected.bfloat16()), f"seed {seed}"
    acc = expected.clone()
    total = torch.empty_like(acc)
    choice.mxfp8_gemm_accumulate(xq, xs, (wq, ws), total, acc, "cublas_kc32")
    choice.mxfp8_gemm_accumulate(xq, xs, (wq, ws), acc, acc, "cublas_kc32")
    assert torch.equal(acc, total) and not torch.equal(acc, expected), f"seed {seed}"


def e4m3_codes_times(byte: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Every finite e4m3 code (both signs) in 32-blocks, all scaled by 2^(byte - 127)."""
    codes = torch.arange(256, dtype=torch.uint8).view(torch.float8_e4m3fn)
    codes = codes[~codes.float().isnan()]
    codes = torch.cat([codes, codes[:32 - codes.numel() % 32]])
    return codes.view(1, -1), torch.full((1, codes.numel() // 32), byte, dtype=torch.uint8)


def test_bf16_dequant_is_exact_for_scale_bytes_3_to_246() -> None:
    scratch = torch.empty(1, 256)
    for byte in range(255):  # 255 is E8M0's NaN
        q, s = e4m3_codes_times(byte)
        exact = q.double() * 2.0 ** (byte - 127)
        held = exact.bfloat16().double()  # one rounding from the exact value
        assert torch.equal(held, exact) == (3 <= byte <= 246), byte
        if byte <= 246:  # the twin's fp32 scratch holds every such value
            cc._dequantize_into(q, s, scratch[:, :q.shape[1]])
            assert torch.equal(scratch[:, :q.shape[1]].double(), exact), byte


def test_names_configs_and_scratch_bytes() -> None:
    assert cc.parse("cublas_kc96_wr16_ov") == cc.ChunkConfig(96, 16, True)
    assert cc.parse("cublas_kc96x") is None and cc.parse("fp8dot_m64n64w4s6") is None
    assert choice.choose(4096, "bf16", "cublas_kc576").config == cc.ChunkConfig(576)
    with pytest.raises(ValueError, match="multiple of 32"):
        choice.choose(4096, "mxfp8", "cublas_kc100")
    for name, cfg in cc.CANDIDATES.items():
        assert cc.parse(name) == cfg and choice.choose(8, "mxfp8", name).config == cfg
    # K3 prefill: M 4096, N 7168, one 7168-wide slice per chunk.
    m, n, k = 4096, 7168, 43008
    assert cc.scratch_bytes(m, n, k, cc.ChunkConfig(7168), True, True) == 2 * 7168 * (m + n)
    assert cc.scratch_bytes(m, n, k, cc.ChunkConfig(7168), False, False) == (
        2 * 7168 * m + 4 * m * n)
    assert cc.scratch_bytes(m, n, k, cc.ChunkConfig(3584, 2048, True), True, True) == (
        2 * 2 * 3584 * (m + 2048))


def test_shape_errors_name_shapes() -> None:
    xq, xs = quantize_mxfp8(torch.randn(4, 64))
    with pytest.raises(ValueError, match=r"\(4, 64\).*\(8, 96\)"):
        choice.mxfp8_gemm_accumulate(xq, xs, torch.zeros(8, 96, dtype=torch.bfloat16),
                                     torch.zeros(4, 8), candidate="cublas_kc32")
    with pytest.raises(ValueError, match=r"out \(4, 9\) != expected \(4, 8\)"):
        choice.mxfp8_gemm_accumulate(xq, xs, torch.zeros(8, 64, dtype=torch.bfloat16),
                                     torch.zeros(4, 9), candidate="cublas_kc32")
    with pytest.raises(ValueError, match="float16"):
        choice.mxfp8_gemm_accumulate(xq, xs, torch.zeros(8, 64, dtype=torch.float16),
                                     torch.zeros(4, 8), candidate="cublas_kc32")


if __name__ == "__main__":
    sys.exit(pytest.main([__file__, "-q"]))
