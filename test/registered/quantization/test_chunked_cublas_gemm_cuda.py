"""Dequantize-then-cuBLAS in K chunks on the H200: staged == streamed == concat bit for bit
(fresh random inputs, several M, MXFP8 and bf16 weights, every chunk variant), within the fp32
bound of a float64 reference, deterministic across calls, and the side-stream variant under
CUDA graph replay."""

import random
import sys

import pytest
import torch

from sglang_aux.srt.layers.quantization import mxfp8_gemm_choice as choice
from sglang_aux.srt.layers.quantization.mxfp8 import quantize_mxfp8
from sglang_aux.srt.layers.quantization.mxfp8_format import dequantize_mxfp8
from sglang_aux.srt.layers.quantization.mxfp8_linear import MXFP8Linear
from sglang_aux.srt.layers.quantization.staged_input import MXFP8InputAccumulator
from sglang_aux.srt.layers.quantization.streamed_projection import StreamedProjection
from sglang_aux.test.ci.ci_register import register_cuda_ci
from sglang_aux.test.kernel_checks import REAL_TRITON_ON_CUDA

register_cuda_ci(est_time=120, suite="default")

pytestmark = REAL_TRITON_ON_CUDA
CUDA = "cuda"
# (tokens, hidden, slices, out features): ragged M, the K3 fc at the end.
SHAPES = [(1, 1024, 3, 768), (77, 2048, 3, 1536), (1000, 1024, 6, 1024),
          (4096, 7168, 6, 7168)]
# Chunk = one slice, half a slice, bounded weight rows, the side-stream overlap.
VARIANTS = ["cublas_kc{h}", "cublas_kc{half}", "cublas_kc{half}_wr512", "cublas_kc{h}_ov"]


def seeded() -> tuple[int, torch.Generator]:
    seed = random.SystemRandom().randrange(2**31)
    return seed, torch.Generator(device=CUDA).manual_seed(seed)


def poisoned(shape, dtype=torch.float32) -> torch.Tensor:
    return torch.full(shape, float("nan"), device=CUDA, dtype=dtype)


def mxfp8_linear(w: torch.Tensor) -> MXFP8Linear:
    layer = MXFP8Linear(w.shape[1], w.shape[0], torch.float32, device=CUDA)
    layer.load_weight(w)
    return layer


def paths(x: torch.Tensor, weight: torch.Tensor | MXFP8Linear, h: int, k: int, name: str
          ) -> dict[str, torch.Tensor]:
    """fp32 [T, N] results of the concat call (twice), the staged accumulator and (MXFP8
    weights) the streamed projection, all running candidate `name`."""
    t, mx = x.shape[0], isinstance(weight, MXFP8Linear)
    n = weight.out_features if mx else weight.shape[0]
    w = (weight.weight_values, weight.weight_scales) if mx else weight
    xq, xs = quantize_mxfp8(x)
    results = {}
    for label in ("concat", "concat_again"):
        results[label] = poisoned((t, n))
        choice.mxfp8_gemm_accumulate(xq, xs, w, results[label], candidate=name)
    slices = [x[:, i * h:(i + 1) * h].contiguous() for i in range(k)]
    staged = MXFP8InputAccumulator(weight, poisoned((t, n)), h, k, dtype=x.dtype,
                                   candidate=name)
    for s in slices:
        staged.accumulate(s)
    results["staged"] = staged.result()
    if mx:
        proj = StreamedProjection(weight, poisoned((t, n)), h, k, x.dtype, torch.float32,
                                  candidate=name)
        for s in slices:
            proj.accumulate(s)
        results["streamed"] = proj.result()
    return results


@pytest.mark.parametrize("t,h,k,n", SHAPES)
@pytest.mark.parametrize("variant", VARIANTS)
@pytest.mark.parametrize("mxfp8_weight", [True, False])
def test_staged_streamed_concat_bitwise(t, h, k, n, variant: str, mxfp8_weight: bool) -> None:
    name = variant.format(h=h, half=h // 2)
    seed, gen = seeded()
    x = torch.randn(t, k * h, device=CUDA, generator=gen, dtype=torch.bfloat16)
    w = torch.randn(n, k * h, device=CUDA, generator=gen, dtype=torch.bfloat16) * 0.02
    weight = mxfp8_linear(w) if mxfp8_weight else w
    results = paths(x, weight, h, k, name)
    concat = results.pop("concat")
    for label, r in results.items():
        assert torch.equal(r, concat), f"{label} != concat, seed {seed}"
    xq, xs = quantize_mxfp8(x)
    a = dequantize_mxfp8(xq, xs).double()
    b = (dequantize_mxfp8(weight.weight_values, weight.weight_scales).double()
         if mxfp8_weight else w.double())
    rows = torch.randperm(t, device=CUDA, generator=gen)[:256]  # the float64 check's rows
    ref, mag = a[rows] @ b.T, a[rows].abs() @ b.abs().T
    err = (concat[rows].double() - ref).abs()
    bound = 2 * k * h * 2.0**-24 * mag + 1e-30
    assert (err <= bound).all(), f"seed {seed}: worst {(err / bound).max().item():.3f}"


def test_torch_accumulates_bf16_products_into_fp32_in_place() -> None:
    """The call each chunk makes (beta 1 on an fp32 C): a failure here names the torch API."""
    _, gen = seeded()
    a = torch.randn(64, 256, device=CUDA, generator=gen).bfloat16()
    b = torch.randn(128, 256, device=CUDA, generator=gen).bfloat16()
    acc = torch.randn(64, 128, device=CUDA, generator=gen)
    expected = acc.double() + a.double() @ b.double().T
    torch.addmm(acc, a, b.T, out_dtype=torch.float32, out=acc)
    torch.testing.assert_close(acc.double(), expected, rtol=1e-6, atol=1e-5)


def test_bf16_out_is_the_fp32_sum_rounded_once() -> None:
    seed, gen = seeded()
    x = torch.randn(300, 3 * 1024, device=CUDA, generator=gen, dtype=torch.bfloat16)
    wq, ws = quantize_mxfp8(torch.randn(512, 3 * 1024, device=CUDA, generator=gen))
    xq, xs = quantize_mxfp8(x)
    out32, out16 = poisoned((300, 512)), poisoned((300, 512), torch.bfloat16)
    for out in (out32, out16):
        choice.mxfp8_gemm_accumulate(xq, xs, (wq, ws), out, candidate="cublas_kc1024")
    assert torch.equal(out16, out32.bfloat16()), f"seed {seed}"


def test_overlap_variant_under_cuda_graph_replay() -> None:
    seed, gen = seeded()
    h, k, n, t = 1024, 3, 768, 200
    layer = mxfp8_linear(torch.randn(n, k * h, device=CUDA, generator=gen) * 0.02)
    proj = StreamedProjection(layer, poisoned((t, n)), h, k, torch.bfloat16, torch.float32,
                              candidate="cublas_kc512_ov")
    static = [torch.empty(t, h, device=CUDA, dtype=torch.bfloat16) for _ in range(k)]

    def run() -> torch.Tensor:
        proj.reset()
        for s in static:
            proj.accumulate(s)
        return proj.result()

    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):  # warm up outside the capture
        run()
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        graph_out = run()
    for _ in range(3):
        for s in static:
            s.copy_(torch.randn(t, h, device=CUDA, generator=gen))
        proj.acc.fill_(float("nan"))
        graph.replay()
        xq, xs = quantize_mxfp8(torch.cat(static, dim=-1))
        eager = poisoned((t, n))
        choice.mxfp8_gemm_accumulate(xq, xs, (layer.weight_values, layer.weight_scales), eager,
                                     candidate="cublas_kc512_ov")
        assert torch.equal(graph_out, eager), f"seed {seed}"


if __name__ == "__main__":
    sys.exit(pytest.main([__file__, "-q"]))
