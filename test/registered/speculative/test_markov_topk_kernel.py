"""DSpark's certified top-K Markov loop (`markov_topk_kernel.py`, a candidate) via Triton's CPU
interpreter in fp32: its tokens are the exact loop's at every K, whether each proposal is
certified or swept (a small bias certifies every one; a token lifted from outside the
candidates is not certified and is found by the sweep); the exact kernel takes certified
candidates without reading markov_w2, sweeps a row from its first uncertified proposal, and
from a swept token that differs from the candidate's on; the bounds hold every bias, in any
chunking, and follow the weights; ties go to the smallest id; the switch routes
`propose_block` to it; bad shapes and bounds are refused."""

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
from sglang_aux.srt.models import dspark  # noqa: E402
from sglang_aux.srt.models.dspark import DSparkMarkovHead, markov_bias_bounds  # noqa: E402
from sglang_aux.srt.speculative import (  # noqa: E402
    dspark_proposal,
    markov_argmax_kernel,
    markov_topk_kernel,
)
from sglang_aux.srt.speculative.dspark_proposal import propose_block  # noqa: E402
from sglang_aux.srt.speculative.markov_argmax_kernel import (  # noqa: E402
    ROWS,
    markov_greedy_tokens,
)
from sglang_aux.srt.speculative.markov_topk_kernel import (  # noqa: E402
    certified_candidates,
    markov_topk_tokens,
    supports,
)
from sglang_aux.test.ci.ci_register import register_cpu_ci  # noqa: E402

register_cpu_ci(est_time=30, suite="default")


def _case(bs, n, vocab, rank, seed, bias_scale=1.0):
    g = torch.Generator().manual_seed(seed)
    base = 3 * torch.randn(bs, n, vocab, generator=g)
    w1, w2 = head(vocab, rank, seed=seed)
    anchor = torch.randint(0, vocab, (bs,), generator=g)
    return base, anchor, w1, w2 * bias_scale


def _certificates(base, anchor, w1, w2, k):
    """The top-K launch alone: its tokens and certificates `[bs, n]`."""
    return certified_candidates(base, anchor, w1, w2, k, markov_bias_bounds(w2))


def _topk(base, anchor, w1, w2, k):
    out = torch.full(base.shape[:2], -1, dtype=torch.int64)
    markov_topk_tokens(base, anchor, w1, w2, out, k, markov_bias_bounds(w2))
    return out


@pytest.mark.parametrize("bs,n,vocab,rank,k", [(1, 3, 64, 16, 64), (5, 4, 128, 32, 16),
                                               (3, 2, 256, 64, 4), (ROWS + 2, 3, 300, 16, 8)])
@pytest.mark.parametrize("bias_scale", [1.0, 1e-3], ids=["bias", "small-bias"])
def test_tokens_are_the_exact_loops(bs, n, vocab, rank, k, bias_scale):
    base, anchor, w1, w2 = _case(bs, n, vocab, rank, seed=vocab + k, bias_scale=bias_scale)
    assert torch.equal(_topk(base, anchor, w1, w2, k), torch_loop(base, anchor, w1, w2))
    _, cert = _certificates(base, anchor, w1, w2, k)
    if bias_scale < 1:  # a bias far below the base logits' spread certifies every proposal
        assert cert.all()


def _count_sweeps(monkeypatch) -> list:
    """The exact kernel's vocabulary tiles swept from now on (the interpreter runs the
    kernel's Python, which looks the tile function up at each call)."""
    swept, tile = [], markov_argmax_kernel._sweep_tile

    def spy(*args, **kw):
        swept.append(1)
        return tile(*args, **kw)

    monkeypatch.setattr(markov_argmax_kernel, "_sweep_tile", spy)
    return swept


def test_certified_candidates_are_taken_without_reading_markov_w2(monkeypatch):
    bs, n, vocab, rank = 3, 4, 128, 16
    base, anchor, w1, w2 = _case(bs, n, vocab, rank, seed=5)
    cand = torch.randint(0, vocab, (bs, n))  # no argmax of anything
    out = torch.full((bs, n), -1, dtype=torch.int64)
    swept = _count_sweeps(monkeypatch)
    markov_greedy_tokens(base, anchor, w1, torch.full_like(w2, float("nan")), out,
                         certified=(cand, torch.ones(bs, n, dtype=torch.int32)))
    assert torch.equal(out, cand) and not swept
    markov_greedy_tokens(base, anchor, w1, w2, out)
    assert torch.equal(out, torch_loop(base, anchor, w1, w2)) and len(swept) == n


def test_a_row_is_swept_from_its_first_uncertified_proposal():
    bs, n, vocab, rank = 2, 4, 96, 16
    base, anchor, w1, w2 = _case(bs, n, vocab, rank, seed=8)
    exact = torch_loop(base, anchor, w1, w2)
    cert = torch.ones(bs, n, dtype=torch.int32)
    cert[1, 1] = 0
    # row 0 certified throughout; row 1: its candidate at 1 differs from the exact token, so
    # from there on every token is swept, whatever the candidates and certificates say
    cand = exact.clone()
    cand[1, 1:] = (exact[1, 1:] + 1) % vocab
    out = torch.full((bs, n), -1, dtype=torch.int64)
    markov_greedy_tokens(base, anchor, w1, w2, out, certified=(cand, cert))
    assert torch.equal(out, exact)
    # a swept token equal to the candidate's: the certified ones after it are taken unswept
    cand = exact.clone()
    cand[1, 2:] = (exact[1, 2:] + 1) % vocab
    markov_greedy_tokens(base, anchor, w1, w2, out, certified=(cand, cert))
    assert out[0].tolist() == exact[0].tolist()
    assert out[1].tolist() == exact[1, :2].tolist() + cand[1, 2:].tolist()


def test_a_token_lifted_from_outside_the_candidates_is_swept():
    vocab, rank = 64, 16
    base = torch.zeros(1, 1, vocab)
    base[0, 0, :4] = torch.tensor([4.0, 3.0, 2.0, 1.0])  # the top 4
    w1, w2 = torch.zeros(vocab, rank), torch.zeros(vocab, rank)
    w1[7, 0], w2[40, 0] = 1.0, 10.0  # after token 7, token 40 gets +10
    anchor = torch.tensor([7])
    cand, cert = _certificates(base, anchor, w1, w2, 4)
    assert cand.item() == 0 and cert.item() == 0  # the candidates' best, not certified
    assert _topk(base, anchor, w1, w2, 4).item() == 40 == torch_loop(base, anchor, w1, w2).item()


def test_the_bounds_hold_every_bias_and_follow_the_weights(monkeypatch):
    vocab, rank = 300, 32
    w1, w2 = head(vocab, rank, seed=3)
    norm_max, col_max = markov_bias_bounds(w2)
    bias = (w1 @ w2.T).abs()  # [prev, token]
    assert (bias <= w1.norm(dim=1, keepdim=True) * norm_max * (1 + 1e-6)).all()
    assert (bias <= (w1.abs() @ col_max)[:, None] * (1 + 1e-6)).all()
    monkeypatch.setattr(dspark, "BOUND_ROWS", 7)  # chunked: the same bounds
    chunked = markov_bias_bounds(w2)
    assert torch.equal(chunked[0], norm_max) and torch.equal(chunked[1], col_max)
    markov = DSparkMarkovHead(vocab, rank)
    first = markov.bias_bounds()
    assert markov.bias_bounds() is first  # kept while the weight is unchanged
    with torch.no_grad():
        markov.markov_w2.weight.mul_(2)
    again = markov.bias_bounds()
    assert again is not first and torch.allclose(again[0], 2 * first[0])


def test_ties_go_to_the_smallest_id():
    vocab = 64
    base = torch.zeros(2, 2, vocab)
    base[:, :, [9, 3, 30]] = 1.0
    out = torch.empty(2, 2, dtype=torch.int64)
    w1, w2 = torch.ones(vocab, 16), torch.zeros(vocab, 16)
    markov_topk_tokens(base, torch.zeros(2, dtype=torch.int64), w1, w2, out, 8,
                       markov_bias_bounds(w2))
    assert (out == 3).all()


def test_the_switch_routes_greedy_proposals(monkeypatch):
    draft = make_draft()
    base, hidden, anchors, positions = inputs(draft, bs=3)
    calls = []
    real = markov_topk_kernel.markov_topk_tokens

    def spy(*args, k, bounds):
        calls.append(k)
        return real(*args, k=k, bounds=bounds)

    monkeypatch.setattr(markov_topk_kernel, "markov_topk_tokens", spy)
    monkeypatch.setenv(ENV_VAR, "force")
    monkeypatch.setenv(MARKOV_TOPK_ENV_VAR, "64")
    with torch.no_grad():
        got = propose_block(draft, base, anchors, positions, None, all_greedy=True, hidden=hidden)
    assert calls == [64]
    w1, w2 = draft.markov_head.markov_w1.weight, draft.markov_head.markov_w2.weight
    assert torch.equal(got.tokens, torch_loop(base, anchors, w1, w2))
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
    bounds = markov_bias_bounds(w)
    anchor = torch.zeros(1, dtype=torch.int64)
    out = torch.empty(1, 2, dtype=torch.int64)
    with pytest.raises(ValueError, match="k must be a power of two <= the vocabulary"):
        markov_topk_tokens(base, anchor, w, w, out, 48, bounds)
    with pytest.raises(ValueError, match="must both be contiguous"):
        markov_topk_tokens(base, anchor, w, w.t().contiguous().t().half(), out, 4, bounds)
    with pytest.raises(ValueError, match="tokens_out must be int64"):
        markov_topk_tokens(base, anchor, w, w, torch.empty(1, 2, dtype=torch.int32), 4, bounds)
    with pytest.raises(ValueError, match=r"bounds must be fp32 \(\) and \(16,\)"):
        markov_topk_tokens(base, anchor, w, w, out, 4, (bounds[0], bounds[1][:8]))
    with pytest.raises(ValueError, match="must be shaped and strided as tokens_out"):
        markov_greedy_tokens(base, anchor, w, w, out,
                             certified=(out, torch.ones(2, 1, dtype=torch.int32)))


if __name__ == "__main__":
    sys.exit(pytest.main([__file__, "-q"]))
