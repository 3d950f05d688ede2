"""The draft's half of a step (`draft_proposals.py`): DFlash's confidence is the draft's
probability of its proposal, in row slices; DFlash's sampling tail draws block offset j
(1..W-1) from the draft forward's row j and keeps that distribution where the rejection test
reads it (`Proposals.q`)."""

import sys
from types import SimpleNamespace

import pytest
import torch

from sglang_aux.srt.layers.logits_processor import LogitsProcessorOutput
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


@pytest.mark.parametrize("with_confidence", [False, True])
def test_greedy_proposals_are_the_argmax_of_offsets_one_on(with_confidence):
    bs, w, vocab = 2, 4, 32
    proposals = Proposals.create(3, w, vocab, torch.device("cpu"))
    proposer = DFlashProposer(proposals, SamplingRows(3, vocab, "cpu"), w, with_confidence)
    logits = torch.randn(bs, w, vocab, generator=torch.Generator().manual_seed(1))
    proposer.epilogue(SimpleNamespace(batch_size=bs),
                      LogitsProcessorOutput(next_token_logits=logits.view(bs * w, vocab),
                                            hidden_states=None))
    assert torch.equal(proposals.tokens[:bs], logits[:, 1:].argmax(-1))
    want = torch.softmax(logits[:, 1:].double(), -1).amax(-1) if with_confidence \
        else torch.zeros(bs, w - 1, dtype=torch.float64)
    torch.testing.assert_close(proposals.confidence[:bs].double(), want, rtol=1e-6, atol=0)


def test_sampled_drafts_and_their_distributions_line_up():
    """The DRAFT_BLOCK sampling tail: block offset j (1..W-1) proposes from the distribution
    of the draft forward's row j, keeps that distribution at `Proposals.q(bs)[:, j - 1]` for the
    rejection test, and its draws follow the draft's law there (each offset's logits peak on
    a different token here, so a shifted row would show)."""
    bs, w, vocab = 2, 4, 64
    rows = [0, 1]
    sampling_rows = SamplingRows(4, vocab, "cpu")
    for r in rows:
        sampling_rows.stage(r, SamplingParams(temperature=1.0), seed=100 + r)
    sampling_rows.write(rows)
    proposals = Proposals.create(4, w, vocab, torch.device("cpu"))
    proposer = DFlashProposer(proposals, sampling_rows, w, with_confidence=False)
    logits = torch.full((bs, w, vocab), -30.0)
    for j in range(w):
        logits[:, j, 10 + j] = 0.0  # offset j: token 10 + j, near certain
    out = LogitsProcessorOutput(next_token_logits=logits.view(bs * w, vocab),
                                hidden_states=None)
    fb = SimpleNamespace(batch_size=bs, req_pool_indices=torch.tensor(rows),
                         positions=torch.arange(bs * w) + 7)
    proposals.tokens[:bs] = -1
    proposer.sampling(fb, out)
    q = proposals.q(bs)
    assert q.shape == (bs, w - 1, vocab)
    assert q.argmax(-1).tolist() == [list(range(11, 10 + w))] * bs
    assert proposals.tokens[:bs].tolist() == [list(range(11, 10 + w))] * bs


if __name__ == "__main__":
    sys.exit(pytest.main([__file__, "-q"]))
