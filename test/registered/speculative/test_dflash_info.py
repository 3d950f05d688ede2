"""Speculative sampling is lossless: what DFlash emits is distributed as target-only sampling."""

import importlib.util
import sys
from collections import Counter

import pytest
import torch

from sglang_aux.srt.entrypoints.engine import Engine
from sglang_aux.srt.speculative.dflash_info import greedy_verify, rejection_verify
from sglang_aux.test.ci.ci_register import register_cpu_ci
from sglang_aux.test.runtime_utils import tiny_checkpoint

register_cpu_ci(est_time=150, suite="default")

VOCAB, BLOCK, TRIALS = 5, 4, 20000


def _tv(counts: Counter, probs: torch.Tensor) -> float:
    n = sum(counts.values())
    return 0.5 * sum(abs(counts.get(t, 0) / n - float(probs[t])) for t in range(len(probs)))


def _verify(drafts, q, p, g):
    """Batched verification of `len(drafts)` independent trials of the same block."""
    n = drafts.shape[0]
    return rejection_verify(drafts, q.expand(n, -1, -1), p.expand(n, -1, -1),
                            torch.rand(n, BLOCK - 1, generator=g),
                            torch.rand(n, BLOCK, generator=g))


def test_rejection_verify_matches_target_distribution():
    g = torch.Generator().manual_seed(0)
    p = torch.softmax(torch.randn(BLOCK, VOCAB, generator=g) * 1.5, -1)
    q = torch.softmax(torch.randn(BLOCK - 1, VOCAB, generator=g) * 1.5, -1)
    drafts = torch.stack([torch.multinomial(q[i], TRIALS, replacement=True, generator=g)
                          for i in range(BLOCK - 1)], dim=1)  # [TRIALS, B-1]
    v = _verify(drafts, q, p, g)
    offset = torch.arange(BLOCK - 1)
    kept = offset < v.accepted[:, None]
    assert torch.equal(v.tokens[:, :-1][kept], drafts[kept]), "accepted drafts must be emitted"
    first = Counter(v.tokens[:, 0].tolist())
    second = Counter(v.tokens[v.accepted >= 1, 1].tolist())
    # sampling noise of TV at 20k draws over 5 outcomes is ~0.01
    assert _tv(first, p[0]) < 0.02
    assert _tv(second, p[1]) < 0.03
    assert len(set(v.accepted.tolist())) >= 3, "acceptance should vary with these distributions"


def test_rejection_verify_accepts_everything_when_draft_equals_target():
    g = torch.Generator().manual_seed(1)
    p = torch.softmax(torch.randn(BLOCK, VOCAB, generator=g), -1)
    drafts = torch.stack([torch.multinomial(p[i], 200, replacement=True, generator=g)
                          for i in range(BLOCK - 1)], dim=1)
    assert (_verify(drafts, p[:-1], p, g).accepted == BLOCK - 1).all()


def test_rejection_verify_never_emits_zero_probability_tokens():
    p = torch.zeros(BLOCK, VOCAB)
    p[:, 2] = 1.0
    q = torch.full((BLOCK - 1, VOCAB), 1.0 / VOCAB)
    v = _verify(torch.tensor([[0, 2, 2]] * 64), q, p, torch.Generator().manual_seed(0))
    assert (v.accepted == 0).all() and (v.tokens[:, 0] == 2).all()


def test_greedy_verify_longest_prefix():
    v = greedy_verify(torch.tensor([[5, 6, 7], [5, 6, 7], [4, 6, 7]]),
                      torch.tensor([[5, 6, 9, 1], [5, 6, 7, 1], [5, 6, 7, 1]]))
    assert v.accepted.tolist() == [2, 3, 0]
    emitted = [v.tokens[i, : a + 1].tolist() for i, a in enumerate(v.accepted.tolist())]
    assert emitted == [[5, 6, 9], [5, 6, 7, 1], [5]]


# with penalties and min-p the verify samples from the processed target distribution; with
# a grammar, from the masked one (the third token's mask is the block walk's after the
# first draft; drafts come from the unmasked draft model, so many are rejected)
@pytest.mark.parametrize("top_k,extra", [
    (3, {}), (4, {"repetition_penalty": 2.0, "presence_penalty": 1.0, "min_p": 0.2}),
    pytest.param(-1, {"regex": "a[a-c][bc]"}, marks=pytest.mark.skipif(
        importlib.util.find_spec("xgrammar") is None, reason="needs xgrammar"))])
def test_engine_sampling_distribution_matches_target_only(tmp_path, top_k, extra):
    target = tiny_checkpoint("tiny-k3", tmp_path)
    draft = tiny_checkpoint("tiny-k3-dflash", tmp_path)
    common = dict(device="cpu", max_total_tokens=8192, max_running_requests=64,
                  cuda_graph_bs_decode=[64])
    plain = Engine(model_path=target, **common)
    spec = Engine(model_path=target, speculative_algorithm="DFLASH",
                  speculative_draft_model_path=draft, **common)
    prompt = plain.tokenizer.encode("The quick brown fox")
    n = 512

    def second_tokens(engine, seed0):
        params = [{"temperature": 1.0, "top_k": top_k, "max_new_tokens": 2 + ("regex" in extra),
                   "seed": seed0 + i,
                   "ignore_eos": True, **extra} for i in range(n)]
        outs = engine.generate(input_ids=[prompt] * n, sampling_params=params)
        return Counter(tuple(o["output_ids"]) for o in outs)

    a, b = second_tokens(plain, 0), second_tokens(spec, 10_000)
    support = set(a) | set(b)
    tv = 0.5 * sum(abs(a.get(s, 0) - b.get(s, 0)) / n for s in support)
    # two independent 512-draw samples over <= 16 outcomes: TV noise ~0.05-0.07
    assert tv < 0.12, (tv, a, b)
    assert len(support) > 2


if __name__ == "__main__":
    sys.exit(pytest.main([__file__, "-q"]))
