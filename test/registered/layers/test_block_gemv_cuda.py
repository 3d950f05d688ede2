"""The block GEMV candidate on the H200: bf16 at the Qwen2.5-Coder-1.5B shapes (and the draft's
fc) at 16 and 7 rows, with the tiles of its table and with split K / no prefetch, against fp32
references; fp32 against fp32 tightly; deterministic across launches; CUDA graph replay ==
eager bitwise (fused norms, bias, split K, the LM head into a static buffer)."""

import sys

import pytest
import torch
from torch.nn import functional as F

from sglang_aux.srt.layers.activation import SiluAndMul
from sglang_aux.srt.layers.triton_ops.block_gemv import (
    BlockGemvConfig,
    block_gemv,
    block_gemv_config,
)
from sglang_aux.test.ci.ci_register import register_cuda_ci
from sglang_aux.test.kernel_checks import REAL_TRITON_ON_CUDA, fresh_seed, random_rms_norm

pytestmark = REAL_TRITON_ON_CUDA
register_cuda_ci(est_time=60, suite="default")

# Qwen2.5-Coder-1.5B: hidden, MLP, q + k + v outputs, vocabulary
HIDDEN, INTER, QKV_OUT, VOCAB = 1536, 8960, 2048, 151936
DRAFT_FC = 5 * HIDDEN  # the draft's fc input: 5 target layers' hidden states
# bf16: one output rounding (2^-8 relative) of O(1) values (weights scaled by 1/sqrt(K)), and
# the input's one rounding taken at x * w rather than x * rstd * w for a fused norm;
# fp32: summation order only (ieee dots).
BF16_TOL = {"atol": 2e-2, "rtol": 1.6e-2}
FP32_TOL = {"atol": 2e-5, "rtol": 2e-5}
SHAPES = [(HIDDEN, HIDDEN, False), (HIDDEN, INTER, False), (QKV_OUT, HIDDEN, True),
          (2 * INTER, HIDDEN, False), (VOCAB, HIDDEN, False), (HIDDEN, DRAFT_FC, False)]
# None: the table's; then a split K and a no-prefetch pipelined variant of the bench's kind.
CONFIGS = [None, BlockGemvConfig(32, 256, split_k=4), BlockGemvConfig(64, 128, prefetch=False,
                                                                      num_stages=3)]


def _weight(n, k):
    """bf16 `[n, k]` scaled by 1/sqrt(k): outputs O(1)."""
    return torch.randn(n, k, device="cuda").mul_(k**-0.5).bfloat16()


def _hidden_norm():
    return random_rms_norm(HIDDEN, torch.bfloat16, "cuda")


@pytest.mark.parametrize("n,k,bias", SHAPES)
@pytest.mark.parametrize("m", [16, 7])
@pytest.mark.parametrize("cfg", CONFIGS)
def test_plain_bf16_vs_fp32(n, k, bias, m, cfg):
    seed = fresh_seed()
    x = torch.randn(m, k, device="cuda", dtype=torch.bfloat16)
    w = _weight(n, k)
    b = torch.randn(n, device="cuda", dtype=torch.bfloat16) if bias else None
    ref = F.linear(x.float(), w.float(), None if b is None else b.float())
    msg = lambda s: f"seed {seed}: {s}"  # noqa: E731
    y = block_gemv(x, w, b, config=cfg)
    torch.testing.assert_close(y.float(), ref, **BF16_TOL, msg=msg)
    out32 = block_gemv(x.float(), w.float(), None if b is None else b.float(), config=cfg)
    torch.testing.assert_close(out32, ref, **FP32_TOL, msg=msg)
    for _ in range(20):
        assert torch.equal(block_gemv(x, w, b, config=cfg), y), "one sum order on every launch"


@pytest.mark.parametrize("n,bias", [(QKV_OUT, True), (2 * INTER, False)])
@pytest.mark.parametrize("cfg", CONFIGS)
def test_norm_fused_bf16_vs_fp32(n, bias, cfg):
    seed = fresh_seed()
    x = torch.randn(16, HIDDEN, device="cuda", dtype=torch.bfloat16) * 4
    residual = torch.randn_like(x) * 4
    norm, w = _hidden_norm(), _weight(n, HIDDEN)
    b = torch.randn(n, device="cuda", dtype=torch.bfloat16) if bias else None
    y, stream = block_gemv(x, w, b, norm_weight=norm.weight, eps=1e-6, residual=residual,
                           config=cfg)
    assert torch.equal(stream, x + residual), f"seed {seed}"
    normed, _ = norm.forward_native(x, residual)  # bf16, as the unfused path feeds the GEMM
    ref = F.linear(normed.float(), w.float(), None if b is None else b.float())
    torch.testing.assert_close(y.float(), ref, **BF16_TOL, msg=lambda s: f"seed {seed}: {s}")


def test_table_splits_the_long_k_projections():
    assert block_gemv_config(HIDDEN, INTER).split_k > 1
    assert block_gemv_config(HIDDEN, DRAFT_FC).split_k > 1
    assert block_gemv_config(2 * INTER, HIDDEN).split_k == 1


def test_graph_replay_equals_eager_bitwise():
    """One graph of a 16-token layer's projections (fused norms, bias, split-K down) and the
    LM head into a static logits buffer; replayed on new inputs written into the captured
    ones."""
    fresh_seed()
    norm = _hidden_norm()
    b = torch.randn(QKV_OUT, device="cuda", dtype=torch.bfloat16)
    w = {name: _weight(n, k) for name, (n, k) in {
        "qkv": (QKV_OUT, HIDDEN), "o": (HIDDEN, HIDDEN), "gate_up": (2 * INTER, HIDDEN),
        "down": (HIDDEN, INTER), "head": (VOCAB, HIDDEN)}.items()}
    logits = torch.empty(16, VOCAB, device="cuda", dtype=torch.bfloat16)
    x, residual = (torch.randn(16, HIDDEN, device="cuda", dtype=torch.bfloat16) for _ in "xr")

    def forward():
        qkv, stream = block_gemv(x, w["qkv"], b, norm_weight=norm.weight, eps=1e-6,
                                 residual=residual)
        o = block_gemv(qkv[:, :HIDDEN].contiguous(), w["o"])
        gate_up, _ = block_gemv(o, w["gate_up"], norm_weight=norm.weight, eps=1e-6)
        down = block_gemv(SiluAndMul.forward_native(gate_up), w["down"])
        return qkv, stream, o, down, block_gemv(down, w["head"], out=logits)

    forward()  # compiles every variant before the capture
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        captured = forward()
    for _ in range(3):
        for t in (x, residual):
            t.copy_(torch.randn_like(t))
        graph.replay()
        replayed = [t.clone() for t in captured]
        for got, ref in zip(replayed, forward(), strict=True):
            assert torch.equal(got, ref)


if __name__ == "__main__":
    sys.exit(pytest.main([__file__, "-q"]))
