"""MXFP8 on CUDA: real Triton kernels with bf16 data, CUDA graph replay and torch.compile."""

import sys

import pytest
import torch

# The CPU test's independent references (its directory is on sys.path under pytest and when
# run as a script).
from test_mxfp8 import assert_bytes_equal, assert_gemm_close, awkward_bf16, run_staged

from sglang_aux.srt.layers.quantization.mxfp8 import mxfp8_gemm, quantize_mxfp8
from sglang_aux.srt.layers.quantization.mxfp8_format import (
    dequantize_mxfp8,
    quantize_mxfp8_reference,
)
from sglang_aux.srt.layers.quantization.mxfp8_linear import MXFP8Linear
from sglang_aux.srt.layers.quantization.staged_input import MXFP8InputAccumulator
from sglang_aux.test.ci.ci_register import register_cuda_ci
from sglang_aux.test.concat_projection import concat_then_project
from sglang_aux.test.kernel_checks import REAL_TRITON_ON_CUDA

register_cuda_ci(est_time=120, suite="default")

pytestmark = REAL_TRITON_ON_CUDA
CUDA = "cuda"


def bits_equal(a: torch.Tensor, b: torch.Tensor) -> bool:
    return torch.equal(a.view(torch.int16), b.view(torch.int16))


@pytest.mark.parametrize("rows,groups", [(64, 24), (37, 3), (300, 224)])
def test_triton_quantizer_matches_references(rows: int, groups: int) -> None:
    x = awkward_bf16(rows, groups, seed=rows)
    values, scales = quantize_mxfp8(x.to(CUDA))  # Triton on CUDA
    assert_bytes_equal(values.cpu(), scales.cpu(), x)
    ref_values = torch.empty_like(values)
    ref_scales = torch.full_like(scales, 255)
    quantize_mxfp8_reference(x.to(CUDA), ref_values, ref_scales)  # torch ops on CUDA
    assert torch.equal(values.view(torch.uint8), ref_values.view(torch.uint8))
    assert torch.equal(scales, ref_scales)


def test_triton_quantizer_column_slices_match_concat() -> None:
    parts = [torch.randn(1000, 7168 // 4, device=CUDA, dtype=torch.bfloat16) for _ in range(3)]
    width = parts[0].shape[1]
    values = torch.full((1000, 3 * width), float("nan"), device=CUDA).to(torch.float8_e4m3fn)
    scales = torch.full((1000, 3 * width // 32), 255, device=CUDA, dtype=torch.uint8)
    for i, p in enumerate(parts):
        cols = slice(i * width, (i + 1) * width)
        quantize_mxfp8(p, out=(values[:, cols], scales[:, i * width // 32:(i + 1) * width // 32]))
    ref_values, ref_scales = quantize_mxfp8(torch.cat(parts, dim=-1))
    assert torch.equal(values.view(torch.uint8), ref_values.view(torch.uint8))
    assert torch.equal(scales, ref_scales)


@pytest.mark.parametrize("m,n,k", [(300, 200, 1056), (1024, 768, 2048)])
def test_triton_gemm_error_bound(m: int, n: int, k: int) -> None:
    gen = torch.Generator(device=CUDA).manual_seed(m)
    xq, xs = quantize_mxfp8(torch.randn(m, k, device=CUDA, generator=gen, dtype=torch.bfloat16))
    wq, ws = quantize_mxfp8(
        torch.randn(n, k, device=CUDA, generator=gen, dtype=torch.bfloat16) * 0.05)
    out = torch.full((m, n), float("nan"), device=CUDA, dtype=torch.bfloat16)
    mxfp8_gemm(xq, xs, wq, ws, out)
    assert_gemm_close(out.cpu(), xq.cpu(), xs.cpu(), wq.cpu(), ws.cpu(), out_rel=2.0**-8)


def make_staged_cuda(tokens: int = 512, hidden: int = 1024, num_slices: int = 3, n: int = 768):
    gen = torch.Generator(device=CUDA).manual_seed(1)
    weight = torch.randn(n, hidden * num_slices, device=CUDA, generator=gen) * 0.02
    linear = MXFP8Linear.from_float(weight.bfloat16())
    out = torch.full((tokens, n), float("nan"), device=CUDA, dtype=torch.bfloat16)
    acc = MXFP8InputAccumulator(linear, out, hidden_size=hidden, num_slices=num_slices)
    return acc, linear


def new_slices(acc: MXFP8InputAccumulator, seed: int) -> list[torch.Tensor]:
    gen = torch.Generator(device=CUDA).manual_seed(seed)
    shape = (acc.num_tokens, acc.hidden_size)
    return [torch.randn(shape, device=CUDA, generator=gen, dtype=torch.bfloat16) * (i + 1)
            for i in range(acc.num_slices)]


def test_staged_bitwise_equals_concat() -> None:
    acc, linear = make_staged_cuda()
    for seed in range(2):
        slices = new_slices(acc, seed)
        assert bits_equal(run_staged(acc, slices), concat_then_project(slices, linear))


def test_staged_with_a_bf16_weight_bitwise_equals_concat() -> None:
    # MXFP8 activations x the bf16 fc weight (its own kernel): staged == the same GEMM over
    # the concat's bytes, close to the exact product.
    gen = torch.Generator(device=CUDA).manual_seed(2)
    weight = (torch.randn(768, 3 * 1024, device=CUDA, generator=gen) * 0.02).bfloat16()
    out = torch.full((512, 768), float("nan"), device=CUDA, dtype=torch.bfloat16)
    acc = MXFP8InputAccumulator(weight, out, hidden_size=1024, num_slices=3)
    for seed in range(2):
        slices = new_slices(acc, seed)
        xq, xs = quantize_mxfp8(torch.cat(slices, dim=-1))
        ref = mxfp8_gemm(xq, xs, weight, None)
        assert bits_equal(run_staged(acc, slices), ref)
        exact = dequantize_mxfp8(xq, xs).double() @ weight.double().T
        torch.testing.assert_close(ref.double(), exact, rtol=2**-7, atol=1e-3)


def test_staged_under_cuda_graph_replay() -> None:
    acc, linear = make_staged_cuda()
    static = new_slices(acc, seed=100)
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):  # warm-up compiles and autotunes outside the capture
        run_staged(acc, static)
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        graph_out = run_staged(acc, static)
    for seed in range(3):
        fresh = new_slices(acc, seed)
        for dst, src in zip(static, fresh, strict=True):
            dst.copy_(src)
        acc.out.fill_(float("nan"))  # poison: replay must rewrite every element
        graph.replay()
        torch.cuda.synchronize()
        assert bits_equal(graph_out, concat_then_project(fresh, linear))


def test_staged_under_torch_compile_fullgraph() -> None:
    acc, linear = make_staged_cuda()
    compiled = torch.compile(run_staged, fullgraph=True)
    for seed in range(2):
        slices = new_slices(acc, seed)
        acc.out.fill_(float("nan"))
        out = compiled(acc, slices)
        assert bits_equal(out, concat_then_project(slices, linear))


def test_staged_errors_on_cuda() -> None:
    acc, _ = make_staged_cuda(tokens=64, hidden=64, num_slices=2, n=32)
    good = new_slices(acc, seed=0)
    with pytest.raises(ValueError, match="dtype"):
        acc.accumulate(good[0].float())
    with pytest.raises(ValueError, match="width"):
        acc.accumulate(good[0][:, :32])
    run_staged(acc, good)
    with pytest.raises(RuntimeError, match="already read"):
        acc.result()


if __name__ == "__main__":
    sys.exit(pytest.main([__file__, "-q"]))
