"""The draft's half of a step (`draft_proposals.py`): the draft's LM head reads block offsets
1..n (`ForwardBatch.logits_per_req`); DFlash's confidence is the draft's probability of its
proposal, in row slices; DFlash's sampling tail draws block offset j (1..n) from the draft
forward's logits row j - 1 and keeps that distribution where the rejection test reads it
(`Proposals.q(bs, n)`: packed by the step's proposals; DSpark's unpacked)."""

import sys
from types import SimpleNamespace

import pytest
import torch

from sglang_aux.srt.forward_state.forward_batch_info import ForwardMode
from sglang_aux.srt.layers.logits_processor import LogitsProcessor, LogitsProcessorOutput
from sglang_aux.srt.sampling.sampling_params import SamplingParams
from sglang_aux.srt.sampling.sampling_rows import SamplingRows
from sglang_aux.srt.speculative import draft_proposals
from sglang_aux.srt.speculative.draft_proposals import DFlashProposer, Proposals
from sglang_aux.test.ci.ci_register import register_cpu_ci

register_cpu_ci(est_time=5, suite="default")


def test_max_probability_is_the_softmax_max():
    torch.manual_seed(0)
    logits = torch.randn(5, 3, 50) * 4
    want = torch.softmax(logits.double(), -1).amax(-1)
    out = torch.empty(5, 3)
    assert draft_proposals.max_probability(logits, out) is out
    torch.testing.assert_close(out.double(), want, rtol=1e-6, atol=0)
    # bf16 logits of a strided view (a draft block's rows 1..W-1), a few rows at a time
    block = (torch.randn(6, 4, 50) * 4).bfloat16()
    whole = draft_proposals.max_probability(block[:, 1:], torch.empty(6, 3))
    old = draft_proposals.CONFIDENCE_ROWS
    draft_proposals.CONFIDENCE_ROWS = 4  # one request (3 rows) per slice
    try:
        sliced = draft_proposals.max_probability(block[:, 1:], torch.empty(6, 3))
    finally:
        draft_proposals.CONFIDENCE_ROWS = old
    assert torch.equal(sliced, whole)
    torch.testing.assert_close(
        whole.double(), torch.softmax(block[:, 1:].double(), -1).amax(-1), rtol=1e-6, atol=0)
    with pytest.raises(ValueError, match=r"\(5, 3\).*\(5, 3, 50\).*\(5,\)"):
        draft_proposals.max_probability(logits, torch.empty(5))


@pytest.mark.parametrize("n", [3, 1])
def test_draft_lm_head_reads_block_offsets_one_to_n(n):
    """`logits_per_req` n: each request's rows 1..n of its block of 4, in order; 0: all."""
    bs, w, hidden, vocab = 3, 4, 8, 16
    g = torch.Generator().manual_seed(2)
    h, weight = torch.randn(bs * w, hidden, generator=g), torch.randn(vocab, hidden, generator=g)
    fb = SimpleNamespace(batch_size=bs, logits_rows=None, logits_per_req=n,
                         forward_mode=ForwardMode.DRAFT_BLOCK, next_token_logits_buffer=None,
                         capture_hidden_mode=None)
    out = LogitsProcessor()(h, weight, fb).next_token_logits
    rows = h.view(bs, w, hidden)[:, 1 : 1 + n].reshape(-1, hidden)
    assert torch.equal(out, torch.matmul(rows, weight.t()))
    every = LogitsProcessor()(h, weight, SimpleNamespace(**{**vars(fb), "logits_per_req": 0}))
    assert torch.equal(every.next_token_logits, torch.matmul(h, weight.t()))


@pytest.mark.parametrize("with_confidence, n", [(False, 3), (True, 3), (False, 1)])
def test_greedy_proposals_are_the_argmax_of_offsets_one_on(with_confidence, n):
    """The forward's logits are offsets 1..n's (a step of width n + 1 <= W); the proposals
    past n keep what was there."""
    bs, w, vocab = 2, 4, 32
    proposals = Proposals.create(3, w, vocab, torch.device("cpu"))
    proposals.tokens.fill_(-1)
    proposer = DFlashProposer(proposals, SamplingRows(3, vocab, "cpu"), w, with_confidence)
    logits = torch.randn(bs, n, vocab, generator=torch.Generator().manual_seed(1))
    proposer.epilogue(SimpleNamespace(batch_size=bs, logits_per_req=n),
                      LogitsProcessorOutput(next_token_logits=logits.view(bs * n, vocab),
                                            hidden_states=None))
    assert torch.equal(proposals.tokens[:bs, :n], logits.argmax(-1))
    assert (proposals.tokens[:bs, n:] == -1).all()
    want = torch.softmax(logits.double(), -1).amax(-1) if with_confidence \
        else torch.zeros(bs, n, dtype=torch.float64)
    torch.testing.assert_close(proposals.confidence[:bs, :n].double(), want, rtol=1e-6, atol=0)


@pytest.mark.parametrize("n", [3, 2])
def test_sampled_drafts_and_their_distributions_line_up(n):
    """The DRAFT_BLOCK sampling tail: block offset j (1..n) proposes from the distribution
    of the draft forward's logits row j - 1, keeps that distribution at
    `Proposals.q(bs, n)[:, j - 1]` for the rejection test, and its draws follow the draft's
    law there (each offset's logits peak on a different token here, so a shifted row would
    show)."""
    bs, w, vocab = 2, 4, 64
    rows = [0, 1]
    sampling_rows = SamplingRows(4, vocab, "cpu")
    for r in rows:
        sampling_rows.stage(r, SamplingParams(temperature=1.0), seed=100 + r)
    sampling_rows.write(rows)
    proposals = Proposals.create(4, w, vocab, torch.device("cpu"))
    proposer = DFlashProposer(proposals, sampling_rows, w, with_confidence=False)
    logits = torch.full((bs, n, vocab), -30.0)
    for j in range(n):
        logits[:, j, 11 + j] = 0.0  # offset j + 1: token 11 + j, near certain
    out = LogitsProcessorOutput(next_token_logits=logits.view(bs * n, vocab),
                                hidden_states=None)
    fb = SimpleNamespace(batch_size=bs, req_pool_indices=torch.tensor(rows), logits_per_req=n,
                         positions=torch.arange(bs * w) + 7)
    proposals.tokens[:bs] = -1
    proposer.sampling(fb, out)
    q = proposals.q(bs, n)
    assert q.shape == (bs, n, vocab) and q.is_contiguous()
    assert q.data_ptr() == proposals.probs.data_ptr()  # packed: the leading bs * n rows
    assert q.argmax(-1).tolist() == [list(range(11, 11 + n))] * bs
    assert proposals.tokens[:bs].tolist() == [[*range(11, 11 + n), *[-1] * (w - 1 - n)]] * bs


def test_a_draft_vocabulary_maps_proposals_and_places_q_at_its_ids():
    """Over a draft vocabulary (`token_ids`, logits column j is token ids[j]): greedy proposals
    are ids[argmax]; a sampled request draws from the columns' distribution, maps the draw,
    and leaves in `q` that distribution at the ids, zero at every other token, summing to 1."""
    bs, w, vocab, n = 2, 4, 64, 3
    ids = torch.tensor([40, 3, 17, 60, 9, 22])
    sampling_rows = SamplingRows(4, vocab, "cpu")
    sampling_rows.stage(0, SamplingParams(temperature=0.0), seed=1)
    sampling_rows.stage(1, SamplingParams(temperature=1.0), seed=5)
    sampling_rows.write([0, 1])
    proposals = Proposals.create(4, w, vocab, torch.device("cpu"))
    proposals.probs.fill_(7.0)  # stale values a step must overwrite
    proposer = DFlashProposer(proposals, sampling_rows, w, with_confidence=True, token_ids=ids)
    logits = torch.randn(bs, n, len(ids), generator=torch.Generator().manual_seed(3))
    logits[1, :, 4] += 30.0  # request 1 samples near-certainly column 4: token 9
    out = LogitsProcessorOutput(next_token_logits=logits.view(bs * n, -1), hidden_states=None)
    fb = SimpleNamespace(batch_size=bs, req_pool_indices=torch.tensor([0, 1]), logits_per_req=n,
                         positions=torch.arange(bs * w) + 7)
    proposer.epilogue(fb, out)
    assert torch.equal(proposals.tokens[:bs, :n], ids[logits.argmax(-1)])
    torch.testing.assert_close(proposals.confidence[:bs, :n].double(),
                               torch.softmax(logits.double(), -1).amax(-1), rtol=1e-6, atol=0)
    greedy = proposals.tokens[0, :n].clone()
    proposer.sampling(fb, out)
    q = proposals.q(bs, n)
    torch.testing.assert_close(q[1][:, ids].double(), torch.softmax(logits[1].double(), -1),
                               rtol=1e-5, atol=1e-7)
    others = torch.ones(vocab, dtype=torch.bool)
    others[ids] = False
    assert (q[:, :, others] == 0).all()
    torch.testing.assert_close(q.sum(-1), torch.ones(bs, n))
    assert torch.equal(proposals.tokens[0, :n], greedy)  # the greedy request keeps its argmax
    assert proposals.tokens[1, :n].tolist() == [9] * n


def test_unpacked_distributions_are_each_requests_leading_rows():
    """DSpark's `Proposals` (packed off): a step of n reads each request's first n of W - 1
    rows; packed, the leading bs * n rows; more than W - 1 is refused."""
    vocab, w = 5, 4
    for packed in (False, True):
        p = Proposals.create(3, w, vocab, torch.device("cpu"), packed=packed)
        p.probs.copy_(torch.arange(p.probs.numel(), dtype=torch.float32).view_as(p.probs))
        rows = p.probs[:2 * (w - 1)].view(2, w - 1, vocab)[:, :2] if not packed \
            else p.probs[:4].view(2, 2, vocab)
        assert torch.equal(p.q(2, 2), rows)
        assert torch.equal(p.q(2), p.probs[:2 * (w - 1)].view(2, w - 1, vocab))
        with pytest.raises(ValueError, match="4 proposals a request: the draft proposes at most 3"):
            p.q(2, 4)


if __name__ == "__main__":
    sys.exit(pytest.main([__file__, "-q"]))
