"""MXFP8 quantizer, GEMM and staged accumulator on CPU (torch reference + Triton interpreter)."""

import os
import sys

import torch

if not torch.cuda.is_available():
    # Must precede the first @triton.jit definition (mxfp8_kernels import below).
    os.environ.setdefault("TRITON_INTERPRET", "1")

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra.numpy import arrays

from sglang_aux.srt.layers.quantization import mxfp8_kernels
from sglang_aux.srt.layers.quantization.mxfp8 import mxfp8_gemm, quantize_mxfp8
from sglang_aux.srt.layers.quantization.mxfp8_format import ZERO_BLOCK_SCALE_BYTE, dequantize_mxfp8
from sglang_aux.srt.layers.quantization.mxfp8_gemm_choice import mxfp8_gemm_accumulate
from sglang_aux.srt.layers.quantization.mxfp8_linear import MXFP8Linear
from sglang_aux.srt.layers.quantization.staged_input import DeferredOutput, MXFP8InputAccumulator
from sglang_aux.test.ci.ci_register import register_cpu_ci
from sglang_aux.test.concat_projection import concat_then_project

register_cpu_ci(est_time=60, suite="default")

interpreted = pytest.mark.skipif(
    not mxfp8_kernels._INTERPRETED, reason="Triton kernels on CPU need TRITON_INTERPRET=1"
)


def numpy_mxfp8(x: torch.Tensor) -> tuple[np.ndarray, np.ndarray]:
    """Independent reference: float64 frexp/rint math, own E4M3 encoder -> (value bytes, scales)."""
    a = x.float().numpy().astype(np.float64).reshape(x.shape[0], -1, 32)
    t = np.abs(a).max(-1).astype(np.float32) * np.float32(1 / 448)  # the spec's fp32 product
    mant, exp = np.frexp(t.astype(np.float64))
    ceil_log2 = np.where(mant == 0.5, exp - 1, exp)
    # The fp32 bit trick maps fp32-subnormal t to byte 1 and only t == 0 to byte 0.
    scale_byte = np.where(t == 0, 0, np.clip(ceil_log2 + 127, 1, 254))
    v = np.minimum(np.abs(a) / np.ldexp(1.0, scale_byte - 127)[..., None], 448.0)
    binade = np.maximum(np.frexp(v)[1] - 1, -6)  # floor(log2 v), E4M3 subnormals below 2^-6
    r = np.rint(v / np.ldexp(1.0, binade - 3)) * np.ldexp(1.0, binade - 3)  # half-to-even
    normal = r >= 2.0**-6
    r_exp = np.frexp(r)[1] - 1
    exp_field = np.where(normal, r_exp + 7, 0)
    mant_field = np.where(normal, r / np.ldexp(1.0, r_exp) * 8 - 8, r / 2.0**-9)
    byte = (np.signbit(a).astype(np.int64) << 7) | (exp_field << 3) | mant_field.astype(np.int64)
    return byte.reshape(x.shape).astype(np.uint8), scale_byte.astype(np.uint8)


def awkward_bf16(rows: int, groups: int, seed: int) -> torch.Tensor:
    """[rows, groups*32] bf16 with one regime per block: block maxima of exactly 448*2^k,
    all-zero and all -0.0 blocks, BF16 subnormals, huge/tiny magnitudes, wide mixtures."""
    rng = np.random.default_rng(seed)
    blocks = rng.standard_normal((rows, groups, 32))
    kind = rng.integers(0, 7, (rows, groups))
    k = rng.integers(-120, 119, (rows, groups, 1)).astype(np.float64)
    exact_max = np.clip(blocks, -0.9, 0.9) * 448.0
    exact_max[..., 0] = np.where(rng.random((rows, groups)) < 0.5, -448.0, 448.0)
    mixed = rng.choice([-1.0, 1.0], blocks.shape) * np.exp2(rng.uniform(-132, 120, blocks.shape))
    subnormal = rng.integers(-127, 128, blocks.shape) * 2.0**-133
    out = np.select(
        [kind[..., None] == i for i in range(7)],
        [blocks * np.exp2(rng.integers(-30, 30, (rows, groups, 1))), exact_max * np.exp2(k),
         np.zeros_like(blocks), np.full_like(blocks, -0.0), subnormal,
         blocks * 2.0**118, mixed],
    )
    return torch.from_numpy(out.reshape(rows, -1)).to(torch.bfloat16)


def bf16_from_bits(bits: np.ndarray) -> torch.Tensor:
    bits = np.where((bits & 0x7F80) == 0x7F80, bits & 0x807F, bits)  # inf/NaN -> finite
    return torch.from_numpy(bits.astype(np.int16)).view(torch.bfloat16)


def assert_bytes_equal(values: torch.Tensor, scales: torch.Tensor, x: torch.Tensor) -> None:
    ref_values, ref_scales = numpy_mxfp8(x)
    np.testing.assert_array_equal(scales.numpy(), ref_scales)
    np.testing.assert_array_equal(values.view(torch.uint8).numpy(), ref_values)


@pytest.mark.parametrize("seed", range(4))
def test_reference_quantizer_matches_independent_reference(seed: int) -> None:
    x = awkward_bf16(64, 24, seed)
    values, scales = quantize_mxfp8(x)
    assert_bytes_equal(values, scales, x)
    zero_blocks = x.unflatten(-1, (-1, 32)).abs().amax(-1) == 0
    assert zero_blocks.any() and (scales[zero_blocks] == ZERO_BLOCK_SCALE_BYTE).all()


def test_exact_power_of_two_maxima_and_signed_zeros() -> None:
    x = torch.zeros(3, 64, dtype=torch.bfloat16)
    x[0, :32] = 448.0 * 2.0**-3
    x[1, 32:] = -0.0
    x[2, :32] = -448.0 * 2.0**100
    values, scales = quantize_mxfp8(x)
    assert scales.tolist() == [[124, 0], [0, 0], [227, 0]]
    assert values.view(torch.uint8)[1, 32:].eq(0x80).all()  # -0.0 stays -0.0
    assert values.float()[2, :32].eq(-448.0).all()


def triton_quantize(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    values = torch.empty(x.shape, dtype=torch.float8_e4m3fn)
    scales = torch.empty(x.shape[0], x.shape[1] // 32, dtype=torch.uint8)
    # fp32 input holding bf16 values: the interpreter mishandles bf16.
    mxfp8_kernels.quantize_mxfp8_triton(x.float(), values, scales)
    return values, scales


@pytest.mark.parametrize("quantize", [quantize_mxfp8, pytest.param(triton_quantize,
                                                                    marks=interpreted)])
@settings(max_examples=25, deadline=None)
@given(bits=arrays(np.uint16, (4, 64), elements=st.integers(0, 0xFFFF)))
def test_quantizers_on_arbitrary_bit_patterns(quantize, bits: np.ndarray) -> None:
    x = bf16_from_bits(bits)
    assert_bytes_equal(*quantize(x), x)


def test_quantize_into_column_slices_equals_quantizing_concat() -> None:
    parts = [awkward_bf16(16, 2, seed) for seed in range(3)]
    values = torch.full((16, 192), float("nan"), dtype=torch.float8_e4m3fn)
    scales = torch.full((16, 6), 255, dtype=torch.uint8)
    for i, part in enumerate(parts):
        quantize_mxfp8(part, out=(values[:, i * 64:(i + 1) * 64], scales[:, i * 2:(i + 1) * 2]))
    ref_values, ref_scales = quantize_mxfp8(torch.cat(parts, dim=-1))
    assert torch.equal(values.view(torch.uint8), ref_values.view(torch.uint8))
    assert torch.equal(scales, ref_scales)


def test_dequant_round_trip_error_bound() -> None:
    x = awkward_bf16(64, 16, seed=7).float()
    values, scales = quantize_mxfp8(x)
    deq = dequantize_mxfp8(values, scales)
    scale = torch.exp2(scales.float() - 127).repeat_interleave(32, -1)
    # Half a step of the E4M3 grid: 2^-4 relative for normals, 2^-10 * scale for subnormals.
    bound = torch.maximum(x.abs() * 2.0**-4, scale * 2.0**-10)
    assert ((deq - x).abs() <= bound).all()
    assert torch.equal(dequantize_mxfp8(values, scales, torch.bfloat16).float(), deq)


@interpreted
@pytest.mark.parametrize("shape", [(37, 96), (16, 320), (1, 32)])
def test_triton_quantizer_matches_reference(shape: tuple[int, int]) -> None:
    x = awkward_bf16(shape[0], shape[1] // 32, seed=shape[0])
    # [rows, 2*K] poisoned buffer, kernel writes its right half: checks masks and row strides.
    values = torch.full((shape[0], 2 * shape[1]), float("nan"), dtype=torch.float8_e4m3fn)
    scales = torch.full((shape[0], shape[1] // 16), 255, dtype=torch.uint8)
    mxfp8_kernels.quantize_mxfp8_triton(x.float(), values[:, shape[1]:], scales[:, shape[1] // 32:])
    ref_values, ref_scales = quantize_mxfp8(x)
    assert torch.equal(values[:, shape[1]:].view(torch.uint8), ref_values.view(torch.uint8))
    assert torch.equal(scales[:, shape[1] // 32:], ref_scales)
    assert values[:, :shape[1]].float().isnan().all() and scales[:, :shape[1] // 32].eq(255).all()


def gemm_inputs(m: int, n: int, k: int, seed: int) -> tuple[torch.Tensor, ...]:
    gen = torch.Generator().manual_seed(seed)
    xq, xs = quantize_mxfp8(torch.randn(m, k, generator=gen).bfloat16())
    wq, ws = quantize_mxfp8((torch.randn(n, k, generator=gen) * 0.05).bfloat16())
    return xq, xs, wq, ws


def assert_gemm_close(out: torch.Tensor, xq, xs, wq, ws, out_rel: float) -> None:
    a, b = dequantize_mxfp8(xq, xs).double(), dequantize_mxfp8(wq, ws).double()
    ref = a @ b.T
    # Exact products, fp32 accumulation over K terms, then one rounding into out's dtype.
    bound = 2 * a.shape[1] * 2.0**-24 * (a.abs() @ b.abs().T) + out_rel * ref.abs()
    assert ((out.double() - ref).abs() <= bound).all()


def test_reference_gemm_error_bound() -> None:
    xq, xs, wq, ws = gemm_inputs(33, 40, 256, seed=1)
    out = torch.full((33, 40), float("nan"), dtype=torch.bfloat16)
    assert mxfp8_gemm(xq, xs, wq, ws, out) is out
    assert_gemm_close(out, xq, xs, wq, ws, out_rel=2.0**-8)


@interpreted
@pytest.mark.parametrize("candidate", [None, "bf16dot_tma_p_m128n128k64w8s3"])
def test_triton_gemm_error_bound(candidate: str | None) -> None:
    xq, xs, wq, ws = gemm_inputs(37, 24, 320, seed=2)  # ragged M, N and K tiles
    out = torch.full((37, 24), float("nan"))  # fp32 out: interpreter bf16 casts truncate
    mxfp8_gemm_accumulate(xq, xs, (wq, ws), out, candidate=candidate)
    assert_gemm_close(out, xq, xs, wq, ws, out_rel=0.0)


def make_staged(tokens: int = 24, hidden: int = 64, num_slices: int = 3, n: int = 40):
    weight = torch.randn(n, hidden * num_slices, generator=torch.Generator().manual_seed(3))
    linear = MXFP8Linear.from_float(weight.bfloat16())
    out = torch.full((tokens, n), float("nan"), dtype=torch.bfloat16)
    acc = MXFP8InputAccumulator(linear, out, hidden_size=hidden, num_slices=num_slices)
    slices = [awkward_bf16(tokens, hidden // 32, seed=10 + i) for i in range(num_slices)]
    return acc, linear, slices


def run_staged(acc: MXFP8InputAccumulator, slices: list[torch.Tensor]) -> torch.Tensor:
    acc.reset()
    for s in slices:
        acc.accumulate(s)
    return acc.result()


@pytest.mark.parametrize("staged", [run_staged, torch.compile(run_staged, fullgraph=True,
                                                                backend="aot_eager")])
def test_staged_bitwise_equals_concat_then_project(staged) -> None:
    acc, linear, slices = make_staged()
    ref = concat_then_project(slices, linear)
    for _ in range(2):  # a second forward after reset() reuses the retained buffers
        acc.out.fill_(float("nan"))
        out = staged(acc, slices)
        assert out is acc.out and torch.equal(out.view(torch.int16), ref.view(torch.int16))


def test_deferred_output_is_allocated_at_the_last_slice_and_bitwise_equal() -> None:
    acc, linear, slices = make_staged()
    ref = run_staged(acc, slices)
    deferred = MXFP8InputAccumulator(linear, DeferredOutput(24, torch.bfloat16,
                                                            torch.device("cpu")),
                                     hidden_size=64, num_slices=3)
    for s in slices[:-1]:
        deferred.accumulate(s)
        assert deferred.out is None  # nothing [T, N] live while the slices are produced
    deferred.accumulate(slices[-1])
    out = deferred.result()
    assert out.shape == (24, 40) and out.dtype == torch.bfloat16
    assert torch.equal(out.view(torch.int16), ref.view(torch.int16))
    assert torch.equal(run_staged(deferred, slices).view(torch.int16), ref.view(torch.int16))
    assert deferred.out is out  # a second forward reuses it


def test_staged_with_a_bf16_weight_equals_the_concat_gemm() -> None:
    # MXFP8 activations x the bf16 fc weight: the same GEMM over the concat's bytes.
    _, linear, slices = make_staged()
    weight = torch.randn(40, 192, generator=torch.Generator().manual_seed(4)).bfloat16()
    out = torch.full((24, 40), float("nan"), dtype=torch.bfloat16)
    acc = MXFP8InputAccumulator(weight, out, hidden_size=64, num_slices=3)
    xq, xs = quantize_mxfp8(torch.cat(slices, dim=-1))
    ref = mxfp8_gemm(xq, xs, weight, None)
    assert torch.equal(run_staged(acc, slices).view(torch.int16), ref.view(torch.int16))
    exact = dequantize_mxfp8(xq, xs).double() @ weight.double().T
    torch.testing.assert_close(ref.double(), exact, rtol=2**-8, atol=1e-6)
    with pytest.raises(ValueError, match="in_features 192"):
        MXFP8InputAccumulator(weight, out, hidden_size=96, num_slices=3)


def test_staged_errors() -> None:
    acc, _, slices = make_staged()
    with pytest.raises(ValueError, match="width"):
        acc.accumulate(slices[0][:, :32])
    with pytest.raises(ValueError, match="dtype"):
        acc.accumulate(slices[0].float())
    with pytest.raises(ValueError, match="rows"):
        acc.accumulate(slices[0][:5])
    acc.accumulate(slices[0])
    with pytest.raises(RuntimeError, match="only 1 of 3"):
        acc.result()
    for s in slices[1:]:
        acc.accumulate(s)
    with pytest.raises(RuntimeError, match="already received"):
        acc.accumulate(slices[0])  # a 4th slice
    acc.result()
    with pytest.raises(RuntimeError, match="already read"):
        acc.result()
    with pytest.raises(RuntimeError, match="reset"):
        acc.accumulate(slices[0])  # after completion, no reset
    acc.reset()
    acc.accumulate(slices[0])
    assert acc.num_accumulated == 1
    with pytest.raises(ValueError, match="in_features"):
        MXFP8InputAccumulator(acc.linear, acc.out, hidden_size=96, num_slices=3)


def test_shape_errors_name_shapes() -> None:
    with pytest.raises(ValueError, match=r"\(4, 48\)"):
        quantize_mxfp8(torch.zeros(4, 48))
    values, scales = quantize_mxfp8(torch.zeros(4, 64))
    with pytest.raises(ValueError, match=r"\(4, 3\)"):
        dequantize_mxfp8(values, torch.zeros(4, 3, dtype=torch.uint8))
    with pytest.raises(ValueError, match=r"\(4, 64\).*\(8, 32\)"):
        mxfp8_gemm(values, scales, *quantize_mxfp8(torch.zeros(8, 32)))
    with pytest.raises(ValueError, match=r"\(2, 64\)"):
        quantize_mxfp8(torch.zeros(4, 64), out=quantize_mxfp8(torch.zeros(2, 64)))
    with pytest.raises(ValueError, match=r"\(8, 64\).*\(8, 32\)"):
        MXFP8Linear(64, 8).load_weight(torch.zeros(8, 32))


if __name__ == "__main__":
    sys.exit(pytest.main([__file__, "-q"]))
