"""The decode GEMV kernel on the H200: bf16 at the Qwen2.5-Coder-1.5B shapes (with the tiles
of its table) against fp32 references, fp32 against the torch twins, deterministic across
launches, CUDA graph replay == eager (bitwise), and tiny models with `--decode-gemv-backend
triton` captured in decode / verify graphs == eager at every captured size and padded ones,
and == the torch backend."""

import sys

import pytest
import torch
from torch.nn import functional as F

from sglang_aux.srt.forward_state.forward_batch_info import ForwardMode
from sglang_aux.srt.layers.activation import SiluAndMul
from sglang_aux.srt.layers.layernorm import RMSNorm
from sglang_aux.srt.layers.triton_ops.row_gemv import row_gemv
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

register_cuda_ci(est_time=90, suite="default")

pytestmark = REAL_TRITON_ON_CUDA
HIDDEN, INTER, QKV, VOCAB = 1536, 8960, 2048, 151936  # Qwen2.5-Coder-1.5B
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


@pytest.mark.parametrize("n,k,bias", [(HIDDEN, HIDDEN, False), (HIDDEN, INTER, False),
                                      (QKV, HIDDEN, True), (2 * INTER, HIDDEN, False),
                                      (VOCAB, HIDDEN, False)])
def test_plain_bf16_vs_fp32(n, k, bias):
    seed = fresh_seed()
    x = torch.randn(1, k, device="cuda", dtype=torch.bfloat16)
    w = _weight(n, k)
    b = torch.randn(n, device="cuda", dtype=torch.bfloat16) if bias else None
    ref = F.linear(x.float(), w.float(), None if b is None else b.float())
    msg = lambda s: f"seed {seed}: {s}"  # noqa: E731
    y = row_gemv(x, w, b)
    torch.testing.assert_close(y.float(), ref, **BF16_TOL, msg=msg)
    out32 = row_gemv(x.float(), w.float(), None if b is None else b.float())
    torch.testing.assert_close(out32, ref, **FP32_TOL, msg=msg)
    for _ in range(20):
        assert torch.equal(row_gemv(x, w, b), y), "one sum order on every launch"


@pytest.mark.parametrize("n,bias", [(QKV, True), (2 * INTER, False)])
def test_norm_fused_bf16_vs_fp32(n, bias):
    seed = fresh_seed()
    x = torch.randn(1, HIDDEN, device="cuda", dtype=torch.bfloat16) * 4
    residual = torch.randn_like(x) * 4
    norm, w = _norm(HIDDEN), _weight(n, HIDDEN)
    b = torch.randn(n, device="cuda", dtype=torch.bfloat16) if bias else None
    y, stream = row_gemv(x, w, b, norm_weight=norm.weight, eps=1e-6, residual=residual)
    assert torch.equal(stream, x + residual), f"seed {seed}"
    normed, _ = norm.forward_native(x, residual)  # bf16, as the unfused path feeds the GEMM
    ref = F.linear(normed.float(), w.float(), None if b is None else b.float())
    torch.testing.assert_close(y.float(), ref, **BF16_TOL, msg=lambda s: f"seed {seed}: {s}")


def test_graph_replay_equals_eager_bitwise():
    """One graph of a layer's projections (fused norms, bias, plain); replayed on new inputs
    written into the captured ones."""
    fresh_seed()
    norm, w_qkv, b = _norm(HIDDEN), _weight(QKV, HIDDEN), torch.randn(QKV, device="cuda",
                                                                      dtype=torch.bfloat16)
    w_o, w_gu, w_down = _weight(HIDDEN, HIDDEN), _weight(2 * INTER, HIDDEN), \
        _weight(HIDDEN, INTER)

    def layer(x, residual):
        qkv, stream = row_gemv(x, w_qkv, b, norm_weight=norm.weight, eps=1e-6,
                               residual=residual)
        o = row_gemv(qkv[:, :HIDDEN].contiguous(), w_o)
        gate_up, _ = row_gemv(o, w_gu, norm_weight=norm.weight, eps=1e-6)
        return qkv, stream, o, row_gemv(SiluAndMul.forward_native(gate_up), w_down)

    x = torch.randn(1, HIDDEN, device="cuda", dtype=torch.bfloat16)
    residual = torch.randn_like(x)
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        layer(x, residual)  # warm-up: compile
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph, stream=stream):
        outs = layer(x, residual)
    for _ in range(3):
        x.copy_(torch.randn_like(x))
        residual.copy_(torch.randn_like(x))
        graph.replay()
        for got, ref in zip(outs, layer(x, residual), strict=True):
            assert torch.equal(got, ref)


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
    """Decode at bs 1 (the kernel) and more (cuBLAS), verify of 16 (cuBLAS), at every
    captured size and the padded 3 and 11: replay == eager, triton == torch."""
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
