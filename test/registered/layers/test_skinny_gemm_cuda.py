"""The decode GEMV kernel on the H200: bf16 at the Qwen2.5-Coder-1.5B shapes against fp32
references, fp32 against the torch twins, the split-K reduction deterministic under real
concurrency, CUDA graph replay == eager (bitwise: the kernel is deterministic), and tiny
models with `--decode-gemv-backend triton` captured in decode / verify graphs == eager at
every captured size and padded ones, and == the torch backend."""

import sys

import pytest
import torch
from torch.nn import functional as F

from sglang_aux.srt.forward_state.forward_batch_info import ForwardMode
from sglang_aux.srt.layers.activation import SiluAndMul
from sglang_aux.srt.layers.layernorm import RMSNorm
from sglang_aux.srt.layers.triton_ops.skinny_gemm import gemv_config, skinny_gemm
from sglang_aux.srt.model_executor.runner.forward_parts import ForwardParts
from sglang_aux.srt.model_executor.runner.step_prologue import StepPrologue
from sglang_aux.test.ci.ci_register import register_cuda_ci
from sglang_aux.test.hf_checkpoints import save_tiny_qwen2
from sglang_aux.test.kernel_checks import REAL_TRITON_ON_CUDA, fresh_seed
from sglang_aux.test.runtime_utils import (
    eager_forward,
    make_runner,
    prefill_random,
    release,
    step_batch,
    tiny_checkpoint,
)

register_cuda_ci(est_time=120, suite="default")

pytestmark = REAL_TRITON_ON_CUDA
HIDDEN, INTER, QKV, VOCAB = 1536, 8960, 2048, 151936  # Qwen2.5-Coder-1.5B
ROWS = [1, 2, 4, 8, 16]
# bf16: one output rounding (2^-8 relative) of O(1) values (weights scaled by 1/sqrt(K));
# fp32: summation order only.
BF16_TOL = {"atol": 2e-2, "rtol": 1.6e-2}
FP32_TOL = {"atol": 2e-5, "rtol": 2e-5}
CAPTURE = [1, 2, 4, 8, 16]


def _weight(n, k, dtype=torch.bfloat16):
    return (torch.randn(n, k, device="cuda") / k**0.5).to(dtype)


def _norm(k, dtype=torch.bfloat16):
    norm = RMSNorm(k, 1e-6).cuda().to(dtype)
    norm.weight.data.normal_()
    return norm


@pytest.mark.parametrize("m", ROWS)
@pytest.mark.parametrize("n,k,bias", [(HIDDEN, HIDDEN, False), (HIDDEN, INTER, False),
                                      (QKV, HIDDEN, True), (VOCAB, HIDDEN, False)])
def test_plain_bf16_vs_fp32(m, n, k, bias):
    seed = fresh_seed()
    x = torch.randn(m, k, device="cuda", dtype=torch.bfloat16)
    w = _weight(n, k)
    b = torch.randn(n, device="cuda", dtype=torch.bfloat16) if bias else None
    ref = F.linear(x.float(), w.float(), None if b is None else b.float())
    msg = lambda s: f"seed {seed}: {s}"  # noqa: E731
    torch.testing.assert_close(skinny_gemm(x, w, b).float(), ref, **BF16_TOL, msg=msg)
    out32 = skinny_gemm(x.float(), w.float(), None if b is None else b.float())
    torch.testing.assert_close(out32, ref, **FP32_TOL, msg=msg)


@pytest.mark.parametrize("m", ROWS)
def test_norm_qkv_bias_bf16_vs_fp32(m):
    seed = fresh_seed()
    x = torch.randn(m, HIDDEN, device="cuda", dtype=torch.bfloat16) * 4
    residual = torch.randn_like(x) * 4
    norm, w = _norm(HIDDEN), _weight(QKV, HIDDEN)
    b = torch.randn(QKV, device="cuda", dtype=torch.bfloat16)
    y, stream = skinny_gemm(x, w, b, norm_weight=norm.weight, eps=1e-6, residual=residual)
    assert torch.equal(stream, x + residual), f"seed {seed}"
    normed, _ = norm.forward_native(x, residual)  # bf16, as the unfused path feeds the GEMM
    torch.testing.assert_close(y.float(), F.linear(normed.float(), w.float(), b.float()),
                               **BF16_TOL, msg=lambda s: f"seed {seed}: {s}")


@pytest.mark.parametrize("m", ROWS)
def test_norm_gate_up_silu_bf16_vs_fp32(m):
    seed = fresh_seed()
    x = torch.randn(m, HIDDEN, device="cuda", dtype=torch.bfloat16)
    residual = torch.randn_like(x)
    norm, w = _norm(HIDDEN), _weight(2 * INTER, HIDDEN) * 3
    y, _ = skinny_gemm(x, w, norm_weight=norm.weight, eps=1e-6, residual=residual,
                       silu_mul=True)
    normed, _ = norm.forward_native(x, residual)
    ref = SiluAndMul.forward_native(F.linear(normed.float(), w.float()))
    torch.testing.assert_close(y.float(), ref, **BF16_TOL, msg=lambda s: f"seed {seed}: {s}")
    y32, _ = skinny_gemm(x.float(), w.float(), norm_weight=norm.weight.float(), eps=1e-6,
                         residual=residual.float(), silu_mul=True)
    norm32 = norm.float()
    ref32 = SiluAndMul.forward_native(F.linear(norm32.forward_native(x.float(),
                                                                     residual.float())[0],
                                               w.float()))
    torch.testing.assert_close(y32, ref32, atol=1e-4, rtol=1e-4)


@pytest.mark.parametrize("n,k", [(HIDDEN, INTER), (HIDDEN, HIDDEN), (QKV, HIDDEN)])
def test_split_reduce_is_deterministic_on_the_gpu(n, k):
    """Real programs race for the last ticket; the sum order is fixed anyway."""
    fresh_seed()
    assert gemv_config(n, k, 2, torch.cuda.get_device_properties(0).multi_processor_count
                       ).split_k > 1
    x, w = torch.randn(8, k, device="cuda", dtype=torch.bfloat16), _weight(n, k)
    first = skinny_gemm(x, w)
    for _ in range(50):
        assert torch.equal(skinny_gemm(x, w), first)


def test_graph_replay_equals_eager_bitwise():
    """One graph per row count over the fused and split variants; replayed on new inputs
    written into the captured ones."""
    fresh_seed()
    norm, w_qkv, b = _norm(HIDDEN), _weight(QKV, HIDDEN), torch.randn(QKV, device="cuda",
                                                                      dtype=torch.bfloat16)
    w_gu, w_down = _weight(2 * INTER, HIDDEN), _weight(HIDDEN, INTER)

    def layer(x, residual):
        qkv, stream = skinny_gemm(x, w_qkv, b, norm_weight=norm.weight, eps=1e-6,
                                  residual=residual)
        act, _ = skinny_gemm(stream, w_gu, norm_weight=norm.weight, eps=1e-6, silu_mul=True)
        return qkv, stream, skinny_gemm(act, w_down)

    for m in CAPTURE:
        x = torch.randn(m, HIDDEN, device="cuda", dtype=torch.bfloat16)
        residual = torch.randn_like(x)
        stream = torch.cuda.Stream()
        stream.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(stream):
            layer(x, residual)  # warm-up: compile, and this stream's counters
        torch.cuda.current_stream().wait_stream(stream)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph, stream=stream):  # the runner's way: warm-ups there too
            outs = layer(x, residual)
        for _ in range(3):
            x.copy_(torch.randn_like(x))
            residual.copy_(torch.randn_like(x))
            graph.replay()
            for got, ref in zip(outs, layer(x, residual), strict=True):
                assert torch.equal(got, ref), m


def _runner(path, backend):
    return make_runner(path, aux_layer_ids=[0, 2], device="cuda", speculative_algorithm="DFLASH",
                       max_running_requests=16, max_total_tokens=8192, context_length=512,
                       cuda_graph_bs_decode=CAPTURE, decode_gemv_backend=backend)


def _checkpoint(tmp_path, preset: str) -> str:
    if preset == "tiny-qwen2":
        pytest.importorskip("transformers", reason="tiny-qwen2 is saved by transformers")
        return save_tiny_qwen2(tmp_path / "tiny-qwen2")
    return tiny_checkpoint(preset, tmp_path)


@pytest.mark.parametrize("preset", ["tiny-llama", "tiny-qwen2"])
@pytest.mark.parametrize("mode,width", [(ForwardMode.DECODE, 1),
                                        (ForwardMode.TARGET_VERIFY, 16)])
def test_model_graph_replay_equals_eager_and_torch(tmp_path, preset, mode, width):
    """bs 1..16 decode (1..16 rows: the kernel) and verify of 16 (bs 1: the kernel; more:
    cuBLAS), at every captured size and the padded 3 and 11."""
    path = _checkpoint(tmp_path, preset)
    runners = {b: _runner(path, b) for b in ("torch", "triton")}
    for runner in runners.values():
        drafts = torch.randint(0, runner.model_config.hf_config.vocab_size, (16, width - 1),
                               generator=torch.Generator().manual_seed(width)).cuda()
        runner.init_forwards(ForwardParts(mode, width, StepPrologue(
            block_tokens=lambda bs, d=drafts: d[:bs])))
    for bs in [*CAPTURE, 3, 11]:
        logits = {}
        for backend, runner in runners.items():
            reqs = prefill_random(runner, [5 + 7 * i for i in range(bs)], seed=bs)
            fb = step_batch(runner, reqs, mode, width)
            assert fb.prepared_graph is not None
            out = runner.forward(fb)
            replayed = out.next_token_logits.clone(), out.aux_hidden_states.clone()
            eager = eager_forward(runner, fb)
            assert torch.isfinite(replayed[0]).all()
            torch.testing.assert_close(replayed[0], eager.next_token_logits, rtol=1e-4, atol=1e-4)
            torch.testing.assert_close(replayed[1], eager.aux_hidden_states, rtol=1e-4, atol=1e-4)
            logits[backend] = replayed[0]
            release(runner, reqs)
        torch.testing.assert_close(logits["triton"], logits["torch"], rtol=1e-4, atol=1e-4)


if __name__ == "__main__":
    sys.exit(pytest.main([__file__, "-q"]))
