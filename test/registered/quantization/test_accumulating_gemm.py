"""Accumulating GEMMs in Triton's interpreter: a chain of slice calls equals one concat call bit
for bit (dense, and MXFP8 activations with MXFP8 or bf16 weights for every kernel variant), and
both are close to a float64 reference. Fresh random inputs per run; the seed is in every
failure message."""

import os
import random
import sys

import torch

if not torch.cuda.is_available():
    # Must precede the first @triton.jit definition (accumulating_gemm import below).
    os.environ.setdefault("TRITON_INTERPRET", "1")

import pytest  # noqa: E402

from sglang_aux.srt.layers.quantization import accumulating_gemm as ag  # noqa: E402
from sglang_aux.srt.layers.quantization import mxfp8_gemm_choice as choice  # noqa: E402
from sglang_aux.srt.layers.quantization.mxfp8 import quantize_mxfp8
from sglang_aux.srt.layers.quantization.mxfp8_format import dequantize_mxfp8
from sglang_aux.test.ci.ci_register import register_cpu_ci  # noqa: E402

register_cpu_ci(est_time=70, suite="default")

pytestmark = pytest.mark.skipif(not ag._INTERPRETED,
                                reason="the CPU variant needs TRITON_INTERPRET=1")
NUM_SLICES, N = 3, 24
TOKENS = [1, 17, 40]  # below, at and past the interpreter's 16-row tile, ragged


def fresh_seed() -> int:
    return random.SystemRandom().randrange(2**31)


def chain_dense(slices: list[torch.Tensor], w: torch.Tensor, out_dtype: torch.dtype
                ) -> torch.Tensor:
    """One call per slice, the fp32 accumulator through memory, the last call rounds."""
    h = slices[0].shape[1]
    acc = torch.full((slices[0].shape[0], w.shape[0]), float("nan"))
    for i, s in enumerate(slices):
        ag.dense_gemm_accumulate(s, w[:, i * h:(i + 1) * h], acc, None if i == 0 else acc)
    out = torch.full(acc.shape, float("nan"), dtype=out_dtype)
    out.copy_(acc)
    return out


def chain_mxfp8(parts: list[tuple[torch.Tensor, torch.Tensor]], w, candidate: str
                ) -> torch.Tensor:
    """`w`: an MXFP8 pair or a dense weight [N, K*H]; one call per slice."""
    h = parts[0][0].shape[1]
    acc = torch.full((parts[0][0].shape[0], (w[0] if isinstance(w, tuple) else w).shape[0]),
                     float("nan"))
    for i, (xq, xs) in enumerate(parts):
        lo, hi = i * h, (i + 1) * h
        w_i = (w[0][:, lo:hi], w[1][:, lo // 32:hi // 32]) if isinstance(w, tuple) else w[:, lo:hi]
        choice.mxfp8_gemm_accumulate(xq, xs, w_i, acc, None if i == 0 else acc, candidate)
    return acc


# One candidate per kernel variant (the interpreter runs each with small tiles).
BF16_WEIGHT_VARIANTS = ["bf16dot_ptr_m128n256k64w8s2", "bf16dot_tma_p_m128n128k64w8s3",
                        "bf16dot_tma_m128n128k64w8s3"]
MXFP8_WEIGHT_VARIANTS = ["fp8dot_m64n128w4s6", *BF16_WEIGHT_VARIANTS,
                         "bf16dot_tma_p_m128n128k64w8s3_wc1024"]


@pytest.mark.parametrize("tokens", TOKENS)
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])  # bf16: the H200 file
def test_dense_slices_bitwise_equal_concat(tokens: int, dtype: torch.dtype) -> None:
    seed = fresh_seed()
    gen = torch.Generator().manual_seed(seed)
    h = ag.DENSE_BLOCK_K  # slice boundaries on K-tile boundaries
    slices = [torch.randn(tokens, h, generator=gen).to(dtype) for _ in range(NUM_SLICES)]
    w = (torch.randn(N, NUM_SLICES * h, generator=gen) * 0.1).to(dtype)
    concat = torch.full((tokens, N), float("nan"))
    ag.dense_gemm_accumulate(torch.cat(slices, dim=-1), w, concat)
    streamed = chain_dense(slices, w, torch.float32)
    assert torch.equal(streamed, concat), f"seed {seed}"
    ref = torch.cat(slices, -1).double() @ w.double().T
    torch.testing.assert_close(concat.double(), ref, rtol=1e-5, atol=1e-5, msg=f"seed {seed}")


def mxfp8_inputs(tokens: int, hidden: int, gen: torch.Generator):
    """Slices spanning binades (so scale bytes differ), their parts and the concat's bytes."""
    x = [torch.randn(tokens, hidden, generator=gen) * 2.0 ** (4 * i - 4)
         for i in range(NUM_SLICES)]
    return [quantize_mxfp8(s) for s in x], quantize_mxfp8(torch.cat(x, dim=-1))


@pytest.mark.parametrize("candidate", MXFP8_WEIGHT_VARIANTS)
@pytest.mark.parametrize("tokens", TOKENS)
@pytest.mark.parametrize("hidden", [32, 96])  # any multiple of the 32-wide scale group
def test_mxfp8_slices_bitwise_equal_concat(candidate: str, tokens: int, hidden: int) -> None:
    seed = fresh_seed()
    gen = torch.Generator().manual_seed(seed)
    parts, (xq, xs) = mxfp8_inputs(tokens, hidden, gen)
    wq, ws = quantize_mxfp8(torch.randn(N, NUM_SLICES * hidden, generator=gen) * 0.05)
    concat = torch.full((tokens, N), float("nan"))
    choice.mxfp8_gemm_accumulate(xq, xs, (wq, ws), concat, candidate=candidate)
    assert torch.equal(chain_mxfp8(parts, (wq, ws), candidate), concat), f"seed {seed}"
    a, b = dequantize_mxfp8(xq, xs).double(), dequantize_mxfp8(wq, ws).double()
    bound = 2 * a.shape[1] * 2.0**-24 * (a.abs() @ b.abs().T)
    assert ((concat.double() - a @ b.T).abs() <= bound).all(), f"seed {seed}"


@pytest.mark.parametrize("candidate", BF16_WEIGHT_VARIANTS)
@pytest.mark.parametrize("tokens", TOKENS)
def test_bf16_weight_slices_bitwise_equal_concat(candidate: str, tokens: int) -> None:
    # bf16-representable weights carried in fp32 (the interpreter's bf16 math is broken).
    seed = fresh_seed()
    gen = torch.Generator().manual_seed(seed)
    hidden = 64
    parts, (xq, xs) = mxfp8_inputs(tokens, hidden, gen)
    w = (torch.randn(N, NUM_SLICES * hidden, generator=gen) * 0.05).bfloat16().float()
    concat = torch.full((tokens, N), float("nan"))
    choice.mxfp8_gemm_accumulate(xq, xs, w, concat, candidate=candidate)
    assert torch.equal(chain_mxfp8(parts, w, candidate), concat), f"seed {seed}"
    a, b = dequantize_mxfp8(xq, xs).double(), w.double()
    bound = 2 * a.shape[1] * 2.0**-24 * (a.abs() @ b.abs().T)
    assert ((concat.double() - a @ b.T).abs() <= bound).all(), f"seed {seed}"


def test_unknown_candidate_names_the_choices() -> None:
    xq, xs = quantize_mxfp8(torch.zeros(4, 64))
    with pytest.raises(ValueError, match=r"'nope'.*bf16dot_ptr_m64n64k64w4s4"):
        choice.mxfp8_gemm_accumulate(xq, xs, torch.zeros(8, 64), torch.zeros(4, 8),
                                     candidate="nope")
    with pytest.raises(ValueError, match="fp8dot"):  # FP8 dots need an MXFP8 weight
        choice.mxfp8_gemm_accumulate(xq, xs, torch.zeros(8, 64), torch.zeros(4, 8),
                                     candidate="fp8dot_m64n64w4s6")


def test_final_rounding_into_a_narrow_out_matches_torch() -> None:
    # The kernel's store rounds fp32 -> fp16 like torch's cast (RNE).
    gen = torch.Generator().manual_seed(fresh_seed())
    x, w = torch.randn(20, 128, generator=gen), torch.randn(24, 128, generator=gen)
    acc = torch.empty(20, 24)
    out = torch.full((20, 24), float("nan"), dtype=torch.float16)
    ag.dense_gemm_accumulate(x, w, acc)
    ag.dense_gemm_accumulate(x, w, out)
    assert torch.equal(out, acc.half())


def test_shape_errors_name_shapes() -> None:
    x, w = torch.zeros(4, 64), torch.zeros(8, 32)
    with pytest.raises(ValueError, match=r"\(4, 64\).*\(8, 32\)"):
        ag.dense_gemm_accumulate(x, w, torch.zeros(4, 8))
    with pytest.raises(ValueError, match=r"\(4, 9\).*\(4, 8\)"):
        ag.dense_gemm_accumulate(x, torch.zeros(8, 64), torch.zeros(4, 9))
    with pytest.raises(ValueError, match=r"float32 \(4, 8\).*float16"):
        ag.dense_gemm_accumulate(x, torch.zeros(8, 64), torch.zeros(4, 8),
                                 acc=torch.zeros(4, 8, dtype=torch.float16))
    xq, xs = quantize_mxfp8(torch.zeros(4, 64))
    wq, ws = quantize_mxfp8(torch.zeros(8, 32))
    for name in ("fp8dot_m64n64w4s6", "bf16dot_ptr_m64n64k64w4s4"):
        with pytest.raises(ValueError, match=r"\(4, 64\).*\(8, 32\)"):
            choice.mxfp8_gemm_accumulate(xq, xs, (wq, ws), torch.zeros(4, 8), candidate=name)
    with pytest.raises(ValueError, match="bfloat16.*float16"):
        choice.mxfp8_gemm_accumulate(xq, xs, torch.zeros(8, 64, dtype=torch.float16),
                                     torch.zeros(4, 8))


if __name__ == "__main__":
    sys.exit(pytest.main([__file__, "-q"]))
