"""DSpark's greedy Markov loop as n + 1 launches on the GPU, at the recipes' shapes (SmolLM2:
7 proposals over 49,152 tokens; Qwen2.5: 15 over 151,936; rank 256): exact against the torch
loop with fp32 weights; with bf16 weights each token is the argmax of its row up to the bias's
rounding (the loop, fed the kernel's previous tokens, scores it within a bf16 step of its own
choice, and they agree on almost every row); a CUDA graph's replays equal eager calls bit for
bit, at every batch size and a padded one; no host sync; over a draft vocabulary, the loop's
tokens over its columns."""

import sys

import pytest
import torch

from sglang_aux.srt.speculative.markov_argmax_kernel import markov_greedy_tokens
from sglang_aux.test.ci.ci_register import register_cuda_ci
from sglang_aux.test.kernel_checks import REAL_TRITON_ON_CUDA

register_cuda_ci(est_time=30, suite="default")

pytestmark = REAL_TRITON_ON_CUDA
SHAPES = {"smollm2": (7, 49_152), "qwen2.5": (15, 151_936)}
RANK = 256


def case(bs, n, vocab, dtype, seed=0):
    g = torch.Generator(device="cuda").manual_seed(seed)
    base = 4 * torch.randn(bs, n, vocab, device="cuda", generator=g)
    w1 = torch.randn(vocab, RANK, device="cuda", generator=g).to(dtype)
    w2 = (torch.randn(vocab, RANK, device="cuda", generator=g) / RANK ** 0.5).to(dtype)
    anchor = torch.randint(0, vocab, (bs,), device="cuda", generator=g)
    return base, anchor, w1, w2


def loop_steps(base, anchor, w1, w2, prevs):
    """The torch loop's row logits `[bs, n, V]`, each row biased by the given previous token."""
    prev = torch.cat([anchor[:, None], prevs[:, :-1]], dim=1)
    return base + torch.nn.functional.linear(w1[prev], w2).to(base.dtype)


@pytest.mark.parametrize("model", SHAPES)
@pytest.mark.parametrize("bs", [1, 8, 33])
def test_fp32_equals_the_torch_loop(model, bs):
    n, vocab = SHAPES[model]
    base, anchor, w1, w2 = case(bs, n, vocab, torch.float32, seed=bs)
    out = torch.empty(bs, n, dtype=torch.int64, device="cuda")
    markov_greedy_tokens(base, anchor, w1, w2, out)
    steps = loop_steps(base, anchor, w1, w2, out)
    # the loop's argmax given the kernel's previous tokens is the kernel's token: every row
    assert torch.equal(steps.argmax(-1), out)


@pytest.mark.parametrize("model", SHAPES)
def test_bf16_chooses_each_rows_argmax(model):
    n, vocab = SHAPES[model]
    bs = 32
    base, anchor, w1, w2 = case(bs, n, vocab, torch.bfloat16, seed=3)
    out = torch.empty(bs, n, dtype=torch.int64, device="cuda")
    markov_greedy_tokens(base, anchor, w1, w2, out)
    steps = loop_steps(base, anchor, w1, w2, out)
    chosen = steps.gather(-1, out[..., None])[..., 0]
    best = steps.max(-1).values
    # the two biases differ by at most the last bit of a bf16 below 8 (2^-5)
    assert ((best - chosen) <= 2 ** -4).all()
    assert (steps.argmax(-1) == out).float().mean() >= 0.98


@pytest.mark.parametrize("bs", [1, 33])
def test_a_draft_vocabulary_is_the_torch_loop_over_its_columns(bs):
    """`token_ids` (32,768 of Qwen2.5's ids, shuffled): fp32 tokens are the loop's over the
    map's columns and markov_w2's rows of them, each argmax mapped to its token, which the
    next row's bias reads from the whole markov_w1."""
    n, vocab = SHAPES["qwen2.5"]
    base, anchor, w1, w2 = case(bs, n, vocab, torch.float32, seed=bs + 5)
    ids = torch.randperm(vocab, device="cuda")[:32768]
    hot, w2_hot = base[..., ids].contiguous(), w2[ids].contiguous()
    out = torch.empty(bs, n, dtype=torch.int64, device="cuda")
    markov_greedy_tokens(hot, anchor, w1, w2_hot, out, token_ids=ids)
    steps = loop_steps(hot, anchor, w1, w2_hot, out)
    assert torch.equal(ids[steps.argmax(-1)], out)


@pytest.mark.parametrize("model", SHAPES)
def test_graph_replay_equals_eager(model):
    """Captured at 33 requests, replayed on fresh inputs for 33 and for 20 of them (the rest
    padding): each replay equals an eager call; no host sync inside."""
    n, vocab = SHAPES[model]
    bs = 33
    base, anchor, w1, w2 = case(bs, n, vocab, torch.bfloat16)
    out = torch.empty(bs, n, dtype=torch.int64, device="cuda")
    markov_greedy_tokens(base, anchor, w1, w2, out)  # compile outside the capture
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    torch.cuda.set_sync_debug_mode("error")
    try:
        with torch.cuda.graph(graph):
            markov_greedy_tokens(base, anchor, w1, w2, out)
    finally:
        torch.cuda.set_sync_debug_mode("default")
    for live, seed in ((bs, 1), (20, 2)):
        fresh_base, fresh_anchor, _, _ = case(bs, n, vocab, torch.bfloat16, seed=seed)
        base.copy_(fresh_base)
        anchor.copy_(fresh_anchor)
        graph.replay()
        eager = torch.empty(live, n, dtype=torch.int64, device="cuda")
        markov_greedy_tokens(base[:live], anchor[:live], w1, w2, eager)
        assert torch.equal(out[:live], eager)


if __name__ == "__main__":
    sys.exit(pytest.main([__file__, "-q"]))
