"""Accumulating GEMMs on the H200: bf16 and MXFP8 slice chains equal the concat call bit for bit
(MXFP8 activations with MXFP8 or bf16 weights, every kernel variant: FP8 dots, BF16 dots over
pointers / TMA / persistent grids / a BF16 weight scratch); accuracy against float64; cuBLAS is
close, not bitwise; the streamed projection under CUDA graph replay and torch.compile. Fresh
random inputs per run."""

import random
import sys

import pytest
import torch

from sglang_aux.srt.layers.quantization import accumulating_gemm as ag
from sglang_aux.srt.layers.quantization import mxfp8_gemm_choice as choice
from sglang_aux.srt.layers.quantization.mxfp8 import mxfp8_gemm, quantize_mxfp8
from sglang_aux.srt.layers.quantization.mxfp8_format import dequantize_mxfp8
from sglang_aux.srt.layers.quantization.mxfp8_linear import MXFP8Linear
from sglang_aux.srt.layers.quantization.streamed_projection import StreamedProjection
from sglang_aux.test.ci.ci_register import register_cuda_ci
from sglang_aux.test.kernel_checks import REAL_TRITON_ON_CUDA

register_cuda_ci(est_time=240, suite="default")

pytestmark = REAL_TRITON_ON_CUDA
CUDA = "cuda"
FP8_MMA_SLACK = 2.0**-9
# (tokens, hidden, slices, out features): ragged M, the K3 fc at the end.
SHAPES = [(1, 1024, 3, 768), (77, 2048, 3, 1536), (1000, 1024, 6, 1024), (1024, 7168, 6, 7168)]
# One candidate per kernel variant, and the production choices (None: chosen from M).
VARIANTS = {
    "mxfp8": [None, "fp8dot_m64n128w4s6", "bf16dot_ptr_m128n256k64w8s2",
              "bf16dot_tma_m128n128k64w8s3", "bf16dot_tma_p_m128n128k64w8s3",
              "bf16dot_tma_p_m128n128k64w8s3_wc1024"],
    "bf16": [None, "bf16dot_ptr_m128n256k64w8s2", "bf16dot_tma_m128n128k64w8s3",
             "bf16dot_tma_p_m128n128k64w8s3"],
}


def seeded() -> tuple[int, torch.Generator]:
    seed = random.SystemRandom().randrange(2**31)
    return seed, torch.Generator(device=CUDA).manual_seed(seed)


def poisoned(shape, dtype=torch.float32) -> torch.Tensor:
    return torch.full(shape, float("nan"), device=CUDA, dtype=dtype)


def chain(call, num_slices: int, acc: torch.Tensor) -> torch.Tensor:
    for i in range(num_slices):
        call(i, None if i == 0 else acc)
    return acc


@pytest.mark.parametrize("t,h,k,n", SHAPES)
def test_bf16_slices_bitwise_equal_concat(t, h, k, n) -> None:
    seed, gen = seeded()
    x = torch.randn(t, k * h, device=CUDA, generator=gen, dtype=torch.bfloat16)
    w = torch.randn(n, k * h, device=CUDA, generator=gen, dtype=torch.bfloat16) * 0.02
    concat = poisoned((t, n))
    ag.dense_gemm_accumulate(x, w, concat)
    acc = poisoned((t, n))
    chain(lambda i, a: ag.dense_gemm_accumulate(
        x[:, i * h:(i + 1) * h].contiguous(), w[:, i * h:(i + 1) * h], acc, a), k, acc)
    assert torch.equal(acc, concat), f"seed {seed}"
    ref = x.double() @ w.double().T
    bound = 2 * k * h * 2.0**-24 * (x.double().abs() @ w.double().abs().T) + 1e-30
    assert ((concat.double() - ref).abs() <= bound).all(), f"seed {seed}"
    cublas = (x @ w.T).float()  # bf16 output, its own K split: close, not bitwise
    torch.testing.assert_close(cublas, concat, rtol=2**-7, atol=1e-3)


def mxfp8_bound(out, xq, xs, w, candidate: str | None
                ) -> tuple[torch.Tensor, torch.Tensor]:
    """|out - exact| and its bound: fp32 adds over K, plus (FP8 dots) the FP8 MMA's reduced-
    precision sum inside each 32-group (Hopper keeps ~14 bits there)."""
    a = dequantize_mxfp8(xq, xs).double()
    b = dequantize_mxfp8(*w).double() if isinstance(w, tuple) else w.double()
    fmt = "mxfp8" if isinstance(w, tuple) else "bf16"
    fp8 = choice.choose(xq.shape[0], fmt, candidate).kernel == "fp8_dot"
    mag = a.abs() @ b.abs().T
    slack = 2 * a.shape[1] * 2.0**-24 + (FP8_MMA_SLACK if fp8 else 0.0)
    return (out.double() - a @ b.T).abs(), slack * mag + 1e-30


def weight_of(fmt: str, n: int, k: int, gen: torch.Generator):
    w = torch.randn(n, k, device=CUDA, generator=gen, dtype=torch.bfloat16) * 0.02
    return quantize_mxfp8(w) if fmt == "mxfp8" else w


def weight_slice(w, lo: int, hi: int):
    if isinstance(w, tuple):
        return w[0][:, lo:hi], w[1][:, lo // 32:hi // 32]
    return w[:, lo:hi]


@pytest.mark.parametrize("t,h,k,n", SHAPES)
@pytest.mark.parametrize("fmt,candidate", [(f, c) for f, cs in VARIANTS.items() for c in cs])
def test_mxfp8_slices_bitwise_equal_concat(fmt, candidate, t, h, k, n) -> None:
    seed, gen = seeded()
    x = torch.randn(t, k * h, device=CUDA, generator=gen, dtype=torch.bfloat16)
    w = weight_of(fmt, n, k * h, gen)
    xq, xs = quantize_mxfp8(x)
    concat = poisoned((t, n))
    choice.mxfp8_gemm_accumulate(xq, xs, w, concat, candidate=candidate)
    parts = [quantize_mxfp8(x[:, i * h:(i + 1) * h]) for i in range(k)]
    acc = poisoned((t, n))
    chain(lambda i, a: choice.mxfp8_gemm_accumulate(
        *parts[i], weight_slice(w, i * h, (i + 1) * h), acc, a, candidate), k, acc)
    assert torch.equal(acc, concat), f"seed {seed}"
    err, bound = mxfp8_bound(concat, xq, xs, w, candidate)
    assert (err <= bound).all(), f"seed {seed}: worst {(err / bound).max().item():.3f}"
    # The public GEMM (bf16 out) is the same kernel: the same fp32 sum, rounded once.
    out = poisoned((t, n), torch.bfloat16)
    wq, ws = w if isinstance(w, tuple) else (w, None)
    mxfp8_gemm(xq, xs, wq, ws, out, candidate=candidate)
    assert torch.equal(out, concat.bfloat16()), f"seed {seed}"


def test_fp8_dot_and_bf16_dot_are_close_not_bitwise() -> None:
    _, gen = seeded()
    xq, xs = quantize_mxfp8(torch.randn(512, 4096, device=CUDA, generator=gen))
    w = weight_of("mxfp8", 768, 4096, gen)
    outs = []
    for name in ("fp8dot_m64n128w4s6", "bf16dot_tma_p_m128n128k64w8s3"):
        outs.append(poisoned((512, 768)))
        choice.mxfp8_gemm_accumulate(xq, xs, w, outs[-1], candidate=name)
    torch.testing.assert_close(outs[0], outs[1], rtol=2**-6, atol=1e-2)


@pytest.mark.parametrize("candidate", ["fp8dot_m64n128w4s6", "bf16dot_tma_p_m128n128k64w8s3",
                                       "bf16dot_ptr_m64n64k64w4s4",
                                       "bf16dot_tma_p_m128n128k64w8s3_wc1024",
                                       "cublas_kc256", "cublas_kc256_wr128_ov"])
def test_scaling_is_exact(candidate: str) -> None:
    # W = identity rows: one nonzero product per output, so out == dequant(x) exactly when the
    # per-group scaling is right, across 200 binades of block scales.
    _, gen = seeded()
    x = torch.randn(256, 512, device=CUDA, generator=gen)
    x = x * torch.exp2(torch.randint(-100, 100, (256, 16, 1), device=CUDA, generator=gen)
                       .float()).repeat_interleave(32, -1).view(256, 512)
    x[:, :32] = 0.0
    xq, xs = quantize_mxfp8(x.bfloat16())
    w = quantize_mxfp8(torch.eye(384, 512, device=CUDA))
    out = poisoned((256, 384))
    choice.mxfp8_gemm_accumulate(xq, xs, w, out, candidate=candidate)
    assert (out == dequantize_mxfp8(xq, xs)[:, :384]).all()  # == : +0 sums vs -0 inputs


@pytest.mark.parametrize("fmt,candidate",
                         [(f, c) for f, cs in choice.CANDIDATES.items() for c in sorted(cs)])
def test_every_candidate_is_correct(fmt: str, candidate: str) -> None:
    seed, gen = seeded()
    xq, xs = quantize_mxfp8(torch.randn(300, 2048, device=CUDA, generator=gen))
    w = weight_of(fmt, 520, 2048, gen)
    out = poisoned((300, 520))
    choice.mxfp8_gemm_accumulate(xq, xs, w, out, candidate=candidate)
    err, bound = mxfp8_bound(out, xq, xs, w, candidate)
    assert (err <= bound).all(), f"seed {seed}"


def streamed(mxfp8: bool, tokens: int = 512, hidden: int = 1024, slices: int = 3, n: int = 768):
    gen = torch.Generator(device=CUDA).manual_seed(1)
    w = (torch.randn(n, hidden * slices, device=CUDA, generator=gen) * 0.02).bfloat16()
    weight = MXFP8Linear.from_float(w) if mxfp8 else w
    proj = StreamedProjection(weight, poisoned((tokens, n)), hidden, slices,
                              dtype=torch.bfloat16, out_dtype=torch.bfloat16)
    return proj, lambda s: weight(s) if mxfp8 else ag_concat(s, w)


def ag_concat(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    out = poisoned((x.shape[0], w.shape[0]))
    ag.dense_gemm_accumulate(x, w, out)
    return out.bfloat16()


def run(proj: StreamedProjection, slices: list[torch.Tensor]) -> torch.Tensor:
    proj.reset()
    for s in slices:
        proj.accumulate(s)
    return proj.result()


def new_slices(proj: StreamedProjection, seed: int) -> list[torch.Tensor]:
    gen = torch.Generator(device=CUDA).manual_seed(seed)
    return [torch.randn(proj.num_tokens, proj.hidden_size, device=CUDA, generator=gen,
                        dtype=torch.bfloat16) * (i + 1) for i in range(proj.num_slices)]


@pytest.mark.parametrize("mxfp8", [False, True])
def test_streamed_projection_under_cuda_graph_replay(mxfp8: bool) -> None:
    proj, concat = streamed(mxfp8)
    static = new_slices(proj, seed=100)
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):  # compile outside the capture
        run(proj, static)
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        graph_out = run(proj, static)
    for seed in range(3):
        for dst, src in zip(static, new_slices(proj, seed), strict=True):
            dst.copy_(src)
        proj.acc.fill_(float("nan"))  # replay must rewrite every element
        graph.replay()
        torch.cuda.synchronize()
        assert torch.equal(graph_out, concat(torch.cat(static, dim=-1)))


@pytest.mark.parametrize("mxfp8", [False, True])
def test_streamed_projection_under_torch_compile_fullgraph(mxfp8: bool) -> None:
    proj, concat = streamed(mxfp8)
    compiled = torch.compile(run, fullgraph=True)
    for seed in range(2):
        slices = new_slices(proj, seed)
        assert torch.equal(compiled(proj, slices), concat(torch.cat(slices, dim=-1)))


if __name__ == "__main__":
    sys.exit(pytest.main([__file__, "-q"]))
