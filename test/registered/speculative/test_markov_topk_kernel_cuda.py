"""DSpark's certified top-K Markov loop (`markov_topk_kernel.py`, a candidate) on the GPU at the
DSpark recipes' shapes (rank 256; SmolLM2's 7 proposals over 49,152 tokens, Qwen2.5's 15 over
151,936): in fp32 each token is the torch loop's argmax given the tokens before it, in bf16
within the bias's rounding of it, whether certified or swept (a small bias certifies every
proposal); a CUDA graph's replays equal eager calls bit for bit at a padded batch of 33 (the
32-row tile) with no host sync; the head's bounds refuse to be first taken inside a capture."""

import sys

import pytest
import torch
from test_markov_argmax_kernel_cuda import SHAPES, loop_steps
from test_markov_argmax_kernel_cuda import case as exact_case

from sglang_aux.srt.models.dspark import DSparkMarkovHead, markov_bias_bounds
from sglang_aux.srt.speculative.markov_topk_kernel import (
    certified_candidates,
    markov_topk_tokens,
)
from sglang_aux.test.ci.ci_register import register_cuda_ci
from sglang_aux.test.kernel_checks import REAL_TRITON_ON_CUDA

register_cuda_ci(est_time=30, suite="default")

pytestmark = REAL_TRITON_ON_CUDA


def case(bs, n, vocab, dtype, seed=0, bias_scale=1.0):
    """The exact kernel's CUDA test's inputs, the base logits in the weights' dtype too."""
    base, anchor, w1, w2 = exact_case(bs, n, vocab, dtype, seed)
    return base.to(dtype), anchor, w1, (w2 * bias_scale).to(dtype)


@pytest.mark.parametrize("model", SHAPES)
@pytest.mark.parametrize("k", [64, 256])
@pytest.mark.parametrize("bias_scale", [1.0, 1e-3], ids=["bias", "small-bias"])
def test_each_token_is_its_rows_argmax(model, k, bias_scale):
    n, vocab = SHAPES[model]
    for dtype, slack in ((torch.float32, 0.0), (torch.bfloat16, 2 ** -4)):
        base, anchor, w1, w2 = case(8, n, vocab, dtype, seed=k, bias_scale=bias_scale)
        out = torch.empty(8, n, dtype=torch.int64, device="cuda")
        bounds = markov_bias_bounds(w2)
        markov_topk_tokens(base, anchor, w1, w2, out, k, bounds)
        steps = loop_steps(base, anchor, w1, w2, out).float()
        chosen = steps.gather(-1, out[..., None])[..., 0]
        assert ((steps.max(-1).values - chosen) <= slack).all(), dtype
        if bias_scale < 1:
            _, cert = certified_candidates(base, anchor, w1, w2, k, bounds)
            assert cert.all(), dtype


@pytest.mark.parametrize("model", SHAPES)
def test_graph_replay_equals_eager(model):
    n, vocab = SHAPES[model]
    bs = 33
    base, anchor, w1, w2 = case(bs, n, vocab, torch.bfloat16)
    bounds = markov_bias_bounds(w2)
    out = torch.empty(bs, n, dtype=torch.int64, device="cuda")
    markov_topk_tokens(base, anchor, w1, w2, out, 64, bounds)  # compile outside the capture
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    torch.cuda.set_sync_debug_mode("error")
    try:
        with torch.cuda.graph(graph):
            markov_topk_tokens(base, anchor, w1, w2, out, 64, bounds)
    finally:
        torch.cuda.set_sync_debug_mode("default")
    for seed in (1, 2):
        fresh, fresh_anchor, _, _ = case(bs, n, vocab, torch.bfloat16, seed=seed)
        fresh[20:] = 0  # the padding rows
        base.copy_(fresh)
        anchor.copy_(fresh_anchor)
        graph.replay()
        want = torch.empty_like(out)
        markov_topk_tokens(base, anchor, w1, w2, want, 64, bounds)
        assert torch.equal(out, want)


def test_bounds_are_taken_before_a_capture():
    markov = DSparkMarkovHead(512, 16).cuda()
    graph = torch.cuda.CUDAGraph()
    with pytest.raises(RuntimeError, match="taken before a CUDA graph captures"), \
            torch.cuda.graph(graph):
        markov.bias_bounds()
    first = markov.bias_bounds()  # outside: taken, then kept inside a capture
    with torch.cuda.graph(torch.cuda.CUDAGraph()):
        assert markov.bias_bounds() is first


if __name__ == "__main__":
    sys.exit(pytest.main([__file__, "-q"]))
