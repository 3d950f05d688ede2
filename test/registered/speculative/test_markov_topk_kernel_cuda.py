"""DSpark's greedy Markov loop over each proposal's top-K base logits (`markov_topk_kernel.py`, a
candidate) on the GPU at the DSpark recipes' shapes (rank 256; SmolLM2's 7 proposals over
49,152 tokens, Qwen2.5's 15 over 151,936): in fp32 each token is the argmax of its row among
its K candidates, given the tokens before it; in bf16 within the bias's rounding of it; a CUDA
graph's replays equal eager calls bit for bit at a padded batch; no host sync."""

import sys

import pytest
import torch
from test_markov_argmax_kernel_cuda import SHAPES
from test_markov_argmax_kernel_cuda import case as exact_case

from sglang_aux.srt.speculative.markov_topk_kernel import markov_topk_tokens
from sglang_aux.test.ci.ci_register import register_cuda_ci
from sglang_aux.test.kernel_checks import REAL_TRITON_ON_CUDA

register_cuda_ci(est_time=30, suite="default")

pytestmark = REAL_TRITON_ON_CUDA


def case(bs, n, vocab, dtype, seed=0):
    """The exact kernel's CUDA test's inputs, the base logits in the weights' dtype too."""
    base, anchor, w1, w2 = exact_case(bs, n, vocab, dtype, seed)
    return base.to(dtype), anchor, w1, w2


def candidate_steps(base, anchor, w1, w2, tokens, k):
    """Each row's logits over its k candidates `[bs, n, k]` given the chosen tokens before it,
    and the candidates' ids."""
    prev = torch.cat([anchor[:, None], tokens[:, :-1]], dim=1)
    vals, ids = base.topk(k, dim=-1)
    bias = torch.einsum("bnr,bnkr->bnk", w1[prev].float(), w2[ids].float()).to(w2.dtype)
    return (vals + bias.to(vals.dtype)).float(), ids


@pytest.mark.parametrize("model", SHAPES)
@pytest.mark.parametrize("k", [64, 256])
def test_each_token_is_its_rows_best_candidate(model, k):
    n, vocab = SHAPES[model]
    for dtype, slack in ((torch.float32, 1e-4), (torch.bfloat16, 2 ** -4)):
        base, anchor, w1, w2 = case(8, n, vocab, dtype, seed=k)
        out = torch.empty(8, n, dtype=torch.int64, device="cuda")
        markov_topk_tokens(base, anchor, w1, w2, out, k)
        steps, ids = candidate_steps(base, anchor, w1, w2, out, k)
        assert (ids == out[..., None]).any(-1).all(), "a token outside its candidates"
        chosen = steps.gather(-1, (ids == out[..., None]).int().argmax(-1, keepdim=True))[..., 0]
        assert ((steps.max(-1).values - chosen) <= slack).all(), dtype


@pytest.mark.parametrize("model", SHAPES)
def test_graph_replay_equals_eager(model):
    n, vocab = SHAPES[model]
    bs = 33
    base, anchor, w1, w2 = case(bs, n, vocab, torch.bfloat16)
    out = torch.empty(bs, n, dtype=torch.int64, device="cuda")
    markov_topk_tokens(base, anchor, w1, w2, out, 64)  # compile outside the capture
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    torch.cuda.set_sync_debug_mode("error")
    try:
        with torch.cuda.graph(graph):
            markov_topk_tokens(base, anchor, w1, w2, out, 64)
    finally:
        torch.cuda.set_sync_debug_mode("default")
    for seed in (1, 2):
        fresh, fresh_anchor, _, _ = case(bs, n, vocab, torch.bfloat16, seed=seed)
        fresh[20:] = 0  # the padding rows
        base.copy_(fresh)
        anchor.copy_(fresh_anchor)
        graph.replay()
        want = torch.empty_like(out)
        markov_topk_tokens(base, anchor, w1, w2, want, 64)
        assert torch.equal(out, want)


if __name__ == "__main__":
    sys.exit(pytest.main([__file__, "-q"]))
