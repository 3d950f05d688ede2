"""DSpark's sequential (semi-autoregressive) proposal over one draft block, and its
`Proposer`.

The draft block is `[anchor, MASK x (num_proposals - 1)]`, one row per proposal: row k
proposes the token at anchor + k + 1, so a request verifies num_proposals + 1 tokens. The
draft forward gives base logits for every block row at once; the proposals are then chosen
row by row, because row k's logits add the Markov bias of the token chosen at row k - 1 (the
anchor for row 0). The loop runs num_proposals fixed steps of fixed shapes with no host
sync, so it is captured inside the draft's graph as it stands. Greedy rows take the argmax;
sampled rows draw from temperature / top-k / top-p / min-p of the corrected logits, exactly
as the target-only sampler restricts (`sampling_probs`), with counter-based draws on the
DRAFT lane keyed by (request seed, the proposal's token position).
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from dataclasses import dataclass

import torch

from sglang_aux.srt.forward_state.forward_batch_info import ForwardBatch
from sglang_aux.srt.layers.logits_processor import LogitsProcessorOutput
from sglang_aux.srt.layers.triton_ops.dispatch import (
    MARKOV_ARGMAX_ENV_VAR,
    MARKOV_TOPK_ENV_VAR,
    switch,
    use_triton,
)
from sglang_aux.srt.models.dspark import DSparkDraftModel, DSparkMarkovHead
from sglang_aux.srt.sampling.sampler import (
    Lane,
    SamplingTensors,
    sample_from_probs,
    sampling_probs,
    uniform,
)
from sglang_aux.srt.sampling.sampling_rows import SamplingRows
from sglang_aux.srt.speculative.draft_proposals import Proposals


@dataclass
class DSparkProposal:
    tokens: torch.Tensor  # [bs, n] int64 (n: proposals per request)
    confidence: torch.Tensor | None  # [bs, n] float32; None without a confidence head
    # [bs, n, vocab] float32: what each sampled proposal was drawn from (the rejection
    # test's q); None when every request is greedy
    probs: torch.Tensor | None


def _check_shapes(draft: DSparkDraftModel, base_logits: torch.Tensor, anchor_tokens: torch.Tensor,
                  positions: torch.Tensor, hidden: torch.Tensor | None) -> None:
    bs, n = base_logits.shape[:2]
    if base_logits.dim() != 3 or n != draft.num_proposals:
        raise ValueError(f"base_logits {tuple(base_logits.shape)} must be [bs, num_proposals="
                         f"{draft.num_proposals}, vocab]")
    if tuple(anchor_tokens.shape) != (bs,):
        raise ValueError(f"anchor_tokens {tuple(anchor_tokens.shape)} must be ({bs},) like "
                         f"base_logits {tuple(base_logits.shape)}")
    if tuple(positions.shape) != (bs, n):
        raise ValueError(f"positions {tuple(positions.shape)} must be ({bs}, {n}) like "
                         f"base_logits {tuple(base_logits.shape)}")
    if hidden is not None and tuple(hidden.shape[:2]) != (bs, n):
        raise ValueError(f"hidden {tuple(hidden.shape)} must be [{bs}, {n}, H] like "
                         f"base_logits {tuple(base_logits.shape)}")


@torch.no_grad()
def propose_block(draft: DSparkDraftModel, base_logits: torch.Tensor, anchor_tokens: torch.Tensor,
                  positions: torch.Tensor, params: SamplingTensors | None, *, all_greedy: bool,
                  hidden: torch.Tensor | None = None,
                  probs_out: torch.Tensor | None = None) -> DSparkProposal:
    """The block's proposals, chosen in order, and each one's acceptance confidence.

    base_logits `[bs, n, V]` (n: proposals per request; `[bs, n, H]` over the draft's vocabulary,
    `draft.token_ids`, column j being token ids[j]): the draft's row logits (row k for the
    token at anchor + k + 1); anchor_tokens `[bs]`; positions `[bs, n]` int64: each proposal's
    token position (the seed counter of its draw); params: per-request sampling parameters
    (None when `all_greedy`, known on the host); hidden `[bs, n, H]`: the rows' final draft
    hidden states, needed for confidences (without it, or without a confidence head, confidence
    is None); probs_out `[bs, n, V]` float32 (any view): where the sampled proposals'
    distributions go, instead of a new tensor.
    """
    _check_shapes(draft, base_logits, anchor_tokens, positions, hidden)
    if not all_greedy and params is None:
        raise ValueError("sampled proposals need the requests' sampling parameters")
    markov, head = draft.markov_head, draft.confidence_head
    ids = draft.token_ids  # a draft vocabulary: base logits column j is token ids[j]
    bs, n = base_logits.shape[:2]
    vocab = markov.markov_w1.num_embeddings
    tokens = torch.empty((bs, n), dtype=torch.int64, device=base_logits.device)
    if probs_out is not None and (tuple(probs_out.shape) != (bs, n, vocab)
                                  or probs_out.dtype != torch.float32):
        raise ValueError(f"probs_out must be float32 {(bs, n, vocab)} (the vocabulary's), "
                         f"got {probs_out.dtype} {tuple(probs_out.shape)}")
    probs = None if all_greedy else probs_out if probs_out is not None else torch.empty(
        (bs, n, vocab), dtype=torch.float32, device=base_logits.device)
    with_confidence = head is not None and hidden is not None
    confidence = torch.empty((bs, n), dtype=torch.float32, device=base_logits.device) \
        if with_confidence else None
    kernel = _greedy_kernel(base_logits, markov, ids) if all_greedy else None
    if kernel is not None:
        kernel(base_logits, anchor_tokens, markov.markov_w1.weight, markov.markov_w2.weight, tokens)
        if with_confidence:
            prevs = torch.cat([anchor_tokens[:, None].to(torch.int64), tokens[:, :-1]], dim=1)
            confidence.copy_(draft.confidence(hidden, prevs))
        return DSparkProposal(tokens, confidence, None)
    prev = anchor_tokens.to(torch.int64)
    for k in range(n):
        if with_confidence:
            confidence[:, k] = draft.confidence(hidden[:, k], prev)
        step = base_logits[:, k] + markov.bias(prev).to(base_logits.dtype)  # [bs, V or H]
        chosen = step.argmax(-1)
        if not all_greedy:
            q = sampling_probs(step, params)
            if ids is None:
                probs[:, k] = q
            else:  # the distribution drawn from, whole: zero off the draft vocabulary
                probs[:, k] = 0.0
                probs[:, k].index_copy_(-1, ids, q)
            drawn = sample_from_probs(q, uniform(params.seed, positions[:, k], Lane.DRAFT))
            chosen = torch.where(params.is_greedy, chosen, drawn)
        if ids is not None:
            chosen = ids[chosen]
        tokens[:, k] = chosen
        prev = chosen
    return DSparkProposal(tokens, confidence, probs)


def _greedy_kernel(base_logits: torch.Tensor, markov: DSparkMarkovHead,
                   token_ids: torch.Tensor | None = None) -> Callable[..., None] | None:
    """The kernel the greedy loop runs as, or None for the torch loop: on a Triton device (or
    `force`), the certified top-K candidates' (`markov_topk_kernel`) where
    `SGLANG_AUX_MARKOV_TOPK` names a K and the batch has at most its MAX_REQUESTS, else the
    exact n + 1 launches (`markov_argmax_kernel`) unless `SGLANG_AUX_MARKOV_ARGMAX=0`; each
    only at shapes its tiles take. Over a draft vocabulary (`token_ids`) only the exact one."""
    topk, exact = int(switch(MARKOV_TOPK_ENV_VAR)), switch(MARKOV_ARGMAX_ENV_VAR) == "1"
    if not use_triton(base_logits, False) or base_logits.stride(-1) != 1:
        return None
    rank = markov.markov_w1.weight.shape[1]
    if topk and token_ids is None:
        from sglang_aux.srt.speculative import markov_topk_kernel

        if markov_topk_kernel.supports(rank, base_logits.shape[-1], topk) and \
                base_logits.shape[0] <= markov_topk_kernel.MAX_REQUESTS:
            return functools.partial(markov_topk_kernel.markov_topk_tokens, k=topk,
                                     bounds=markov.bias_bounds())
    if not exact:
        return None
    from sglang_aux.srt.speculative import markov_argmax_kernel

    if not markov_argmax_kernel.supports(rank):
        return None
    return markov_argmax_kernel.markov_greedy_tokens if token_ids is None else \
        functools.partial(markov_argmax_kernel.markov_greedy_tokens, token_ids=token_ids)


@dataclass(frozen=True)
class DSparkProposer:
    """DSpark's `Proposer`: the Markov loop (`propose_block`) inside the DRAFT_BLOCK graph,
    greedy in the main graph, drawing in the sampling tail (which keeps the distributions for
    the rejection test); under compact verify, each proposal's confidence from the head."""

    draft: DSparkDraftModel
    proposals: Proposals
    sampling_rows: SamplingRows
    with_confidence: bool

    @property
    def draft_block_size(self) -> int:
        """One row per proposal."""
        return self.draft.num_proposals

    @property
    def logits_per_req(self) -> int:
        """Every block row's: the Markov loop reads them all, whatever a step verifies."""
        return 0

    def epilogue(self, fb: ForwardBatch, out: LogitsProcessorOutput) -> None:
        self._propose(fb, out, None)

    def sampling(self, fb: ForwardBatch, out: LogitsProcessorOutput) -> None:
        """The loop again, drawing the sampled requests' proposals (greedy ones choose as in
        the main graph), their distributions written straight into `Proposals.q(bs)`."""
        self._propose(fb, out, self.sampling_rows.gather(fb.req_pool_indices),
                      self.proposals.q(fb.batch_size))

    def _propose(self, fb: ForwardBatch, out: LogitsProcessorOutput,
                 params: SamplingTensors | None, probs_out: torch.Tensor | None = None) -> None:
        bs, n = fb.batch_size, self.draft_block_size
        hidden = out.hidden_states.view(bs, n, -1) if self.with_confidence else None
        proposal = propose_block(
            self.draft, out.next_token_logits.view(bs, n, -1), fb.input_ids.view(bs, n)[:, 0],
            fb.positions.view(bs, n) + 1, params, all_greedy=params is None, hidden=hidden,
            probs_out=probs_out)
        self.proposals.tokens[:bs] = proposal.tokens
        if proposal.confidence is not None:
            self.proposals.confidence[:bs] = proposal.confidence
