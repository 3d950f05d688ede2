"""DSpark's sequential proposal (`propose_block`): equal to a slow per-request, per-position
reference (greedy and sampled rows mixed, temperature / top-k / top-p / min-p); the Markov
head changes proposals; with a zero Markov head it is DFlash's proposal rule (argmax of the
block rows, or DFlash's draft sampling on the DRAFT lane); a request's draws do not depend
on its batch; shapes are checked."""

import gc
import sys
import weakref
from types import SimpleNamespace

import pytest
import torch
from test_train_dflash import draft_block_logits

from sglang_aux.srt.configs.presets import MASK_TOKEN_ID, PRESETS, TINY_VOCAB
from sglang_aux.srt.models.dspark import DSparkDraftModel
from sglang_aux.srt.models.weight_utils import init_random_weights
from sglang_aux.srt.sampling.sampler import (
    Lane,
    SamplingTensors,
    sample,
    sample_from_probs,
    sampling_probs,
    uniform,
)
from sglang_aux.srt.speculative.dspark_proposal import propose_block
from sglang_aux.test.ci.ci_register import register_cpu_ci

register_cpu_ci(est_time=15, suite="default")

BS = 5
HIDDEN = PRESETS["tiny-llama-dspark"]["hidden_size"]
# per request: temperature, top_k (VOCAB = off), top_p, min_p
SAMPLED = [(0.0, TINY_VOCAB, 1.0, 0.0), (0.8, TINY_VOCAB, 1.0, 0.0), (1.3, 20, 1.0, 0.0),
           (0.7, TINY_VOCAB, 0.6, 0.0), (1.0, 50, 0.9, 0.05)]


def make_draft(seed: int = 0) -> DSparkDraftModel:
    draft = DSparkDraftModel(SimpleNamespace(**PRESETS["tiny-llama-dspark"]))
    init_random_weights(draft, seed)
    return draft.eval()


def make_params(rows, seeds) -> SamplingTensors:
    t, k, p, m = (torch.tensor(c) for c in zip(*rows, strict=True))
    return SamplingTensors(temperature=t.float(), top_k=k.long(), top_p=p.float(),
                           seed=torch.tensor(seeds, dtype=torch.int64),
                           is_greedy=(t < 1e-6) | (k == 1), min_p=m.float())


def inputs(draft, bs=BS, seed=0):
    g = torch.Generator().manual_seed(seed)
    gamma = draft.num_proposals
    base = 3.0 * torch.randn(bs, gamma, TINY_VOCAB, generator=g)
    hidden = torch.randn(bs, gamma, HIDDEN, generator=g)
    anchors = torch.randint(0, TINY_VOCAB, (bs,), generator=g)
    positions = torch.randint(10, 500, (bs, 1), generator=g) + torch.arange(gamma)
    return base, hidden, anchors, positions


def reference(draft, base, hidden, anchors, positions, params):
    """One request, one position at a time, with the target-only sampler's `sample`."""
    bs, gamma, _ = base.shape
    tokens = torch.empty(bs, gamma, dtype=torch.int64)
    conf = torch.empty(bs, gamma)
    w1 = draft.markov_head.markov_w1.weight
    w2 = draft.markov_head.markov_w2.weight
    head = draft.confidence_head
    for r in range(bs):
        prev = int(anchors[r])
        one = None if params is None else SamplingTensors(
            *(t[r:r + 1] for t in (params.temperature, params.top_k, params.top_p,
                                   params.seed, params.is_greedy, params.min_p)))
        for k in range(gamma):
            feats = torch.cat([hidden[r, k], w1[prev]])
            conf[r, k] = torch.sigmoid(feats @ head.proj.weight[0] + head.proj.bias[0])
            logits = base[r, k] + w2 @ w1[prev]
            # `sample` draws on the SAMPLE lane; the proposal's draws are DRAFT-lane ones
            if one is None or bool(one.is_greedy):
                prev = int(logits.argmax())
            else:
                q = sampling_probs(logits[None], one)
                prev = int(sample_from_probs(q, uniform(one.seed, positions[r, k:k + 1],
                                                        Lane.DRAFT))[0])
            tokens[r, k] = prev
    return tokens, conf


def test_greedy_equals_the_per_position_reference():
    draft = make_draft()
    base, hidden, anchors, positions = inputs(draft)
    with torch.no_grad():
        out = propose_block(draft, base, anchors, positions, None, all_greedy=True,
                            hidden=hidden)
        tokens, conf = reference(draft, base, hidden, anchors, positions, None)
    assert out.probs is None
    assert torch.equal(out.tokens, tokens)
    torch.testing.assert_close(out.confidence, conf)
    assert ((out.confidence > 0) & (out.confidence < 1)).all()


def test_sampled_equals_the_per_position_reference():
    draft = make_draft(1)
    base, hidden, anchors, positions = inputs(draft, seed=1)
    params = make_params(SAMPLED, seeds=[11, 12, 13, 14, 15])
    with torch.no_grad():
        out = propose_block(draft, base, anchors, positions, params, all_greedy=False,
                            hidden=hidden)
        tokens, conf = reference(draft, base, hidden, anchors, positions, params)
    assert torch.equal(out.tokens, tokens)
    torch.testing.assert_close(out.confidence, conf)
    # the kept distributions are the corrected ones each proposal was drawn from
    w1, w2 = draft.markov_head.markov_w1.weight, draft.markov_head.markov_w2.weight
    prev = torch.cat([anchors[:, None], out.tokens[:, :-1]], 1)
    corrected = base + (w1[prev] @ w2.t()).detach()
    for k in range(draft.num_proposals):
        torch.testing.assert_close(out.probs[:, k], sampling_probs(corrected[:, k], params))
    sampled = ~params.is_greedy
    assert (out.probs[sampled].gather(-1, out.tokens[sampled][..., None]) > 0).all()


@pytest.mark.parametrize("greedy", [True, False])
def test_a_draft_vocabulary_is_the_full_loop_with_the_rest_masked(greedy):
    """Over a draft vocabulary (sorted ids: the same order as the full rows) the loop scores
    its H columns alone, markov_w2's rows of them: its tokens, confidences and kept
    distributions (zero off the map) are the full loop's with every other token's base logit
    at -inf."""
    draft = make_draft(2)
    base, hidden, anchors, positions = inputs(draft, seed=4)
    ids = torch.randperm(TINY_VOCAB, generator=torch.Generator().manual_seed(5))[:90].sort()[0]
    params = None if greedy else make_params(SAMPLED, seeds=[21, 22, 23, 24, 25])
    masked = torch.full_like(base, -float("inf"))
    masked[..., ids] = base[..., ids]
    with torch.no_grad():
        want = propose_block(draft, masked, anchors, positions, params, all_greedy=greedy,
                             hidden=hidden)
        full = weakref.ref(draft.markov_head.markov_w2.weight)
        rows = full()[ids].clone()
        draft.set_target_modules(torch.nn.Embedding(TINY_VOCAB, HIDDEN),
                                 torch.randn(len(ids), HIDDEN), ids)
        gc.collect()
        assert full() is None, "the full markov_w2 stays resident under a draft vocabulary"
        assert torch.equal(draft.markov_head.markov_w2.weight, rows)
        with pytest.raises(RuntimeError, match="already restricted to a draft vocabulary of 90"):
            draft.markov_head.restrict(ids)
        got = propose_block(draft, base[..., ids].contiguous(), anchors, positions, params,
                            all_greedy=greedy, hidden=hidden)
    assert torch.equal(got.tokens, want.tokens) and torch.isin(got.tokens, ids).all()
    torch.testing.assert_close(got.confidence, want.confidence, rtol=0, atol=0)
    if not greedy:
        assert not params.is_greedy.all()
        torch.testing.assert_close(got.probs, want.probs)
        off = torch.ones(TINY_VOCAB, dtype=torch.bool)
        off[ids] = False
        assert (got.probs[..., off] == 0).all()


def test_distributions_go_into_a_given_view():
    """`probs_out` (the worker's `Proposals.q(bs)`, a view that skips each block's first row)
    receives exactly the distributions a fresh tensor would; a wrong one is refused."""
    draft = make_draft(1)
    base, hidden, anchors, positions = inputs(draft, seed=3)
    params = make_params(SAMPLED, seeds=[21, 22, 23, 24, 25])
    bs, gamma, vocab = base.shape
    storage = torch.full((bs, gamma + 1, vocab), -1.0)
    with torch.no_grad():
        fresh = propose_block(draft, base, anchors, positions, params, all_greedy=False)
        given = propose_block(draft, base, anchors, positions, params, all_greedy=False,
                              probs_out=storage[:, 1:])
        assert torch.equal(given.tokens, fresh.tokens)
        assert torch.equal(storage[:, 1:], fresh.probs) and (storage[:, 0] == -1).all()
        with pytest.raises(ValueError, match=rf"probs_out must be float32 \({bs}, {gamma}, "
                                             rf"{vocab}\) \(the vocabulary's\), got "
                                             r"torch.float16 \(5, 2, "):
            propose_block(draft, base, anchors, positions, params, all_greedy=False,
                          probs_out=storage[:, :2].half())


def test_markov_bias_changes_proposals():
    draft = make_draft()
    base, hidden, anchors, positions = inputs(draft, bs=64)
    with torch.no_grad():
        out = propose_block(draft, base, anchors, positions, None, all_greedy=True)
    assert out.confidence is None  # no hidden states given
    assert (out.tokens != base.argmax(-1)).any()


def _zero_markov(draft):
    with torch.no_grad():
        draft.markov_head.markov_w2.weight.zero_()
    return draft


def test_zero_markov_greedy_is_the_dflash_proposal():
    """The draft's block rows through the dense (training = inference) path; with a zero
    Markov head the proposals are the rows' argmax, DFlash's greedy rule."""
    draft = _zero_markov(make_draft(2))
    g = torch.Generator().manual_seed(2)
    target_h = draft.dflash_config.target_hidden_size
    k = len(draft.dflash_config.target_layer_ids)
    embed = torch.nn.Embedding(TINY_VOCAB, HIDDEN)
    lm_head = torch.randn(TINY_VOCAB, HIDDEN, generator=g)
    ids = torch.randint(0, 256, (3, 20), generator=g)
    aux = torch.randn(3, 20, k * target_h, generator=g)
    anchors = torch.tensor([[5, 11], [7, 15], [3, 16]])
    with torch.no_grad():
        logits = draft_block_logits(draft, embed, lm_head, aux, ids, anchors, MASK_TOKEN_ID)
        rows = logits.flatten(0, 1)  # [blocks, gamma, V]
        anchor_tokens = ids.gather(1, anchors).flatten()
        positions = anchors.flatten()[:, None] + 1 + torch.arange(draft.num_proposals)
        out = propose_block(draft, rows, anchor_tokens, positions, None, all_greedy=True)
    assert torch.equal(out.tokens, rows.argmax(-1))


def test_zero_markov_sampled_is_dflash_draft_sampling():
    """DFlash's draft sampling: every row's restricted distribution, one DRAFT-lane draw at
    the proposal's position (`DFlashProposer.sampling`)."""
    draft = _zero_markov(make_draft(3))
    base, _, anchors, positions = inputs(draft, seed=3)
    params = make_params(SAMPLED, seeds=[1, 2, 3, 4, 5])
    with torch.no_grad():
        out = propose_block(draft, base, anchors, positions, params, all_greedy=False)
    rows = params.repeat_interleave(draft.num_proposals)
    q = sampling_probs(base.flatten(0, 1), rows)
    drawn = sample_from_probs(q, uniform(rows.seed, positions.flatten(), Lane.DRAFT))
    expected = torch.where(params.is_greedy[:, None], base.argmax(-1), drawn.view(BS, -1))
    assert torch.equal(out.tokens, expected)
    torch.testing.assert_close(out.probs, q.view_as(out.probs))


def test_a_requests_proposals_do_not_depend_on_its_batch():
    draft = make_draft(4)
    base, hidden, anchors, positions = inputs(draft, seed=4)
    params = make_params(SAMPLED, seeds=[21, 22, 23, 24, 25])
    perm = torch.tensor([3, 0, 4, 1, 2])
    shuffled = make_params([SAMPLED[i] for i in perm.tolist()],
                           seeds=[[21, 22, 23, 24, 25][i] for i in perm.tolist()])
    with torch.no_grad():
        out = propose_block(draft, base, anchors, positions, params, all_greedy=False,
                            hidden=hidden)
        again = propose_block(draft, base[perm], anchors[perm], positions[perm], shuffled,
                              all_greedy=False, hidden=hidden[perm])
    assert torch.equal(again.tokens, out.tokens[perm])
    torch.testing.assert_close(again.confidence, out.confidence[perm])


def test_sampling_uses_the_target_only_samplers_rule():
    """A sampled request with top_k 1 is greedy: `sample` and the proposal agree."""
    draft = _zero_markov(make_draft(5))
    base, _, anchors, positions = inputs(draft, bs=2, seed=5)
    params = make_params([(0.9, 1, 1.0, 0.0), (0.9, 1, 1.0, 0.0)], seeds=[0, 1])
    with torch.no_grad():
        out = propose_block(draft, base, anchors, positions, params, all_greedy=False)
    for k in range(draft.num_proposals):
        assert torch.equal(out.tokens[:, k], sample(base[:, k], params, positions[:, k], False))


@pytest.mark.parametrize("which,message", [
    ("base", r"base_logits \(5, 4, 320\) must be \[bs, num_proposals=3, vocab\]"),
    ("anchors", r"anchor_tokens \(4,\) must be \(5,\) like base_logits \(5, 3, 320\)"),
    ("positions", r"positions \(5, 2\) must be \(5, 3\)"),
    ("hidden", r"hidden \(5, 2, 64\) must be \[5, 3, H\]"),
    ("params", "need the requests' sampling parameters"),
])
def test_bad_shapes_name_both(which, message):
    draft = make_draft()
    base, hidden, anchors, positions = inputs(draft)
    args = dict(base=base, anchors=anchors, positions=positions, hidden=hidden)
    bad = {"base": torch.zeros(BS, 4, TINY_VOCAB), "anchors": anchors[:4],
           "positions": positions[:, :2], "hidden": hidden[:, :2]}
    if which in bad:
        args[which] = bad[which]
    with pytest.raises(ValueError, match=message):
        propose_block(draft, args["base"], args["anchors"], args["positions"], None,
                      all_greedy=which != "params", hidden=args["hidden"])


if __name__ == "__main__":
    sys.exit(pytest.main([__file__, "-q"]))
