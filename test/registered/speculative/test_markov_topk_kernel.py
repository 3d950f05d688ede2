"""DSpark's greedy Markov loop over each proposal's top-K base logits (`markov_topk_kernel.py`, a
candidate) via Triton's CPU interpreter in fp32: with K the whole vocabulary it chooses the
exact loop's tokens; with fewer it chooses the exact argmax among each row's K candidates (the
torch loop restricted to them), which is the exact loop's token whenever the winner is among
them, and differs from it when a token outside them is lifted past them (constructed);
ties go to the smallest id; the switch routes `propose_block` to it; bad shapes are refused."""

import os

# NOTE: must precede any @triton.jit definition, i.e. any import of the kernels.
os.environ["TRITON_INTERPRET"] = "1"

import sys  # noqa: E402

import pytest  # noqa: E402
import torch  # noqa: E402
from test_dspark_proposal import inputs, make_draft  # noqa: E402
from test_markov_argmax_kernel import head, torch_loop  # noqa: E402

from sglang_aux.srt.layers.triton_ops.dispatch import (  # noqa: E402
    ENV_VAR,
    MARKOV_ARGMAX_ENV_VAR,
    MARKOV_TOPK_ENV_VAR,
    check_kernel_switches,
)
from sglang_aux.srt.speculative import (  # noqa: E402
    dspark_proposal,
    markov_argmax_kernel,
    markov_topk_kernel,
)
from sglang_aux.srt.speculative.dspark_proposal import propose_block  # noqa: E402
from sglang_aux.srt.speculative.markov_topk_kernel import (  # noqa: E402
    markov_topk_tokens,
    supports,
)
from sglang_aux.test.ci.ci_register import register_cpu_ci  # noqa: E402

register_cpu_ci(est_time=20, suite="default")


def restricted_loop(base, anchor, w1, w2, k):
    """The torch loop choosing each row's token among its k largest base logits."""
    tokens = torch.empty(base.shape[:2], dtype=torch.int64)
    cand = base.topk(k, dim=-1).indices
    prev = anchor
    for j in range(base.shape[1]):
        step = base[:, j] + torch.nn.functional.linear(w1[prev], w2).to(base.dtype)
        masked = torch.full_like(step, -float("inf")).scatter(1, cand[:, j], step.gather(
            1, cand[:, j]))
        prev = masked.argmax(-1)
        tokens[:, j] = prev
    return tokens


def _case(bs, n, vocab, rank, seed, bias_scale=1.0):
    g = torch.Generator().manual_seed(seed)
    base = 3 * torch.randn(bs, n, vocab, generator=g)
    w1, w2 = head(vocab, rank, seed=seed)
    anchor = torch.randint(0, vocab, (bs,), generator=g)
    return base, anchor, w1, w2 * bias_scale


@pytest.mark.parametrize("bs,n,vocab,rank", [(1, 3, 64, 16), (5, 4, 128, 32), (3, 2, 256, 64)])
def test_all_candidates_choose_the_exact_loops_tokens(bs, n, vocab, rank):
    base, anchor, w1, w2 = _case(bs, n, vocab, rank, seed=vocab)
    out = torch.full((bs, n), -1, dtype=torch.int64)
    markov_topk_tokens(base, anchor, w1, w2, out, vocab)
    assert torch.equal(out, torch_loop(base, anchor, w1, w2))


@pytest.mark.parametrize("k", [4, 16, 64])
def test_fewer_candidates_choose_the_best_of_them(k):
    bs, n, vocab, rank = 6, 5, 500, 32
    base, anchor, w1, w2 = _case(bs, n, vocab, rank, seed=k)
    out = torch.full((bs, n), -1, dtype=torch.int64)
    markov_topk_tokens(base, anchor, w1, w2, out, k)
    assert torch.equal(out, restricted_loop(base, anchor, w1, w2, k))
    # a small bias never lifts a token past the 64 largest base logits: the exact loop's
    small = w2 * 1e-3
    markov_topk_tokens(base, anchor, w1, small, out, 64)
    assert torch.equal(out, torch_loop(base, anchor, w1, small))


def test_a_token_lifted_from_outside_the_candidates_is_not_proposed():
    vocab, rank = 64, 16
    base = torch.zeros(1, 1, vocab)
    base[0, 0, :4] = torch.tensor([4.0, 3.0, 2.0, 1.0])  # the top 4
    w1, w2 = torch.zeros(vocab, rank), torch.zeros(vocab, rank)
    w1[7, 0], w2[40, 0] = 1.0, 10.0  # after token 7, token 40 gets +10
    out = torch.empty(1, 1, dtype=torch.int64)
    markov_topk_tokens(base, torch.tensor([7]), w1, w2, out, 4)
    assert out.item() == 0 and torch_loop(base, torch.tensor([7]), w1, w2).item() == 40


def test_ties_go_to_the_smallest_id():
    vocab = 64
    base = torch.zeros(2, 2, vocab)
    base[:, :, [9, 3, 30]] = 1.0
    out = torch.empty(2, 2, dtype=torch.int64)
    markov_topk_tokens(base, torch.zeros(2, dtype=torch.int64), torch.ones(vocab, 16),
                       torch.zeros(vocab, 16), out, 8)
    assert (out == 3).all()


def test_the_switch_routes_greedy_proposals(monkeypatch):
    draft = make_draft()
    base, hidden, anchors, positions = inputs(draft, bs=3)
    calls = []
    real = markov_topk_kernel.markov_topk_tokens

    def spy(*args, k):
        calls.append(k)
        return real(*args, k=k)

    monkeypatch.setattr(markov_topk_kernel, "markov_topk_tokens", spy)
    monkeypatch.setenv(ENV_VAR, "force")
    monkeypatch.setenv(MARKOV_TOPK_ENV_VAR, "64")
    with torch.no_grad():
        got = propose_block(draft, base, anchors, positions, None, all_greedy=True, hidden=hidden)
    assert calls == [64]
    w1, w2 = draft.markov_head.markov_w1.weight, draft.markov_head.markov_w2.weight
    assert torch.equal(got.tokens, restricted_loop(base, anchors, w1, w2, 64))
    wide = base[:1].expand(markov_topk_kernel.MAX_REQUESTS + 1, -1, -1)
    assert dspark_proposal._greedy_kernel(wide, draft.markov_head) is \
        markov_argmax_kernel.markov_greedy_tokens  # past MAX_REQUESTS: the exact kernel
    monkeypatch.setenv(MARKOV_TOPK_ENV_VAR, "0")
    monkeypatch.setenv(MARKOV_ARGMAX_ENV_VAR, "0")
    assert dspark_proposal._greedy_kernel(base, draft.markov_head) is None
    monkeypatch.setenv(MARKOV_TOPK_ENV_VAR, "32")
    with pytest.raises(ValueError, match="SGLANG_AUX_MARKOV_TOPK='32'; choose from 0, 64, 256"):
        check_kernel_switches()


def test_bad_shapes_are_refused():
    assert supports(16, 64, 64) and not supports(16, 32, 64) and not supports(8, 64, 4)
    assert not supports(16, 64, 48)
    base, w = torch.zeros(1, 2, 64), torch.zeros(64, 16)
    out = torch.empty(1, 2, dtype=torch.int64)
    with pytest.raises(ValueError, match="k must be a power of two <= the vocabulary"):
        markov_topk_tokens(base, torch.zeros(1, dtype=torch.int64), w, w, out, 48)
    with pytest.raises(ValueError, match="must both be contiguous"):
        markov_topk_tokens(base, torch.zeros(1, dtype=torch.int64), w, w.t().contiguous().t()
                           .half(), out, 4)
    with pytest.raises(ValueError, match="tokens_out must be int64"):
        markov_topk_tokens(base, torch.zeros(1, dtype=torch.int64), w, w,
                           torch.empty(1, 2, dtype=torch.int32), 4)


if __name__ == "__main__":
    sys.exit(pytest.main([__file__, "-q"]))
