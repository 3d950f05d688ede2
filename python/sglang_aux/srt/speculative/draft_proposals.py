"""What a draft forward leaves for the verify step, and how the DFlash draft proposes.

Three sizes per request, one name each (docs/dspark.md): the *verify width* W, the tokens a
request carries through one verify step, anchor included; its *proposals*, the W - 1 draft
tokens after the anchor; and the *draft block*, the draft forward's input
`[anchor, MASK x (draft_block_size - 1)]`. DFlash's draft block has W tokens and block offset
j predicts the token at offset j (no shift; the LM head skips offset 0); DSpark's has W - 1, row k
predicting the token at offset k + 1 (`dspark_proposal.py`).

`Proposals` is the storage the DRAFT_BLOCK graph's epilogue writes and the verify step reads,
allocated once for the largest batch (row prefixes per batch) and borrowed until the draft
runner's next forward. A `Proposer` is the draft's half of the step: its block size and the
epilogue and sampling tail that fill `Proposals` inside the DRAFT_BLOCK graph.

A static step of verify width w < W reads the first w - 1 proposals. DFlash's draft then
computes only those: its LM head reads block offsets 1..w-1 (`ForwardBatch.logits_per_req`;
at 32 requests the head is most of the draft's FLOPs), and its sampled distributions lie
packed, `Proposals.q(bs, w - 1)`. DSpark's Markov loop proposes all W - 1 (`packed` off).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

import torch

from sglang_aux.srt.distributed.communication_op import broadcast_from_first_rank
from sglang_aux.srt.forward_state.forward_batch_info import ForwardBatch
from sglang_aux.srt.layers.logits_processor import LogitsProcessorOutput
from sglang_aux.srt.sampling.sampler import Lane, sample_from_probs, sampling_probs, uniform
from sglang_aux.srt.sampling.sampling_rows import SamplingRows

CONFIDENCE_ROWS = 256  # rows of draft logits whose softmax temporaries exist at once


@dataclass(frozen=True)
class Proposals:
    tokens: torch.Tensor  # [rows, W - 1] int64: greedy or drawn proposals
    # [rows * (W - 1), vocab] float32: what sampled proposals were drawn from, for the
    # rejection test (`q`), as the draft's logits rows come, without a copy
    probs: torch.Tensor
    # [rows, W - 1] float32: each proposal's confidence, compact verify's ranking
    confidence: torch.Tensor
    # a step of n < W - 1 proposals a request keeps their distributions in the leading
    # bs * n rows of `probs` (DFlash: its draft computes only those); else in each request's
    # W - 1 rows, of which it reads the first n (DSpark)
    packed: bool = True

    @classmethod
    def create(cls, rows: int, verify_width: int, vocab: int, device: torch.device,
               packed: bool = True) -> Proposals:
        n = verify_width - 1
        return cls(torch.zeros((rows, n), dtype=torch.int64, device=device),
                   torch.zeros((rows * n, vocab), dtype=torch.float32, device=device),
                   torch.zeros((rows, n), dtype=torch.float32, device=device), packed)

    def q(self, bs: int, n: int | None = None) -> torch.Tensor:
        """The distributions `bs` requests' first `n` proposals (None: all W - 1) were drawn
        from, `[bs, n, vocab]` (a view of `probs`)."""
        full = self.tokens.shape[1]
        n = full if n is None else n
        if not 0 <= n <= full:
            raise ValueError(f"{n} proposals a request: the draft proposes at most {full}")
        if self.packed:
            return self.probs[: bs * n].view(bs, n, self.probs.shape[1])
        return self.probs[: bs * full].view(bs, full, -1)[:, :n]


class Proposer(Protocol):
    """The draft's half of a speculative step: the DRAFT_BLOCK forward's tokens per request,
    and what runs after it inside its graph."""

    @property
    def draft_block_size(self) -> int: ...

    # the DRAFT_BLOCK forward's logits rows per request (`ForwardParts.logits_per_req`:
    # block offsets 1..n), fewer in a narrower static step; 0: every block row's, always
    @property
    def logits_per_req(self) -> int: ...

    # greedy proposals into `Proposals.tokens[:bs]` (and, under compact verify, confidences)
    def epilogue(self, fb: ForwardBatch, out: LogitsProcessorOutput) -> None: ...

    # the sampling tail: sampled requests' proposals drawn, their distributions kept
    def sampling(self, fb: ForwardBatch, out: LogitsProcessorOutput) -> None: ...


@dataclass(frozen=True)
class DFlashProposer:
    proposals: Proposals
    sampling_rows: SamplingRows
    draft_block_size: int  # the verify width: `[anchor, MASK x (W - 1)]`
    with_confidence: bool  # compact verify ranks the proposals by `max_probability`
    # the draft vocabulary `[H]` (speculative/token_map.py): logits column j is this token;
    # None: the target's vocabulary
    token_ids: torch.Tensor | None = None

    @property
    def logits_per_req(self) -> int:
        """The draft forward's logits rows per request: block offsets 1..W-1 (the anchor's
        row predicts nothing a step verifies); a narrower static step asks for fewer."""
        return self.draft_block_size - 1

    def epilogue(self, fb: ForwardBatch, out: LogitsProcessorOutput) -> None:
        """Block offsets 1..n propose the tokens at those offsets (no shift); the forward's
        logits are theirs alone (`fb.logits_per_req` = n)."""
        bs, n = fb.batch_size, fb.logits_per_req
        logits = out.next_token_logits.view(bs, n, -1)
        best = logits.argmax(-1)
        self.proposals.tokens[:bs, :n].copy_(best if self.token_ids is None
                                             else self.token_ids[best])
        broadcast_from_first_rank(self.proposals.tokens[:bs])
        if self.with_confidence:
            max_probability(logits, self.proposals.confidence[:bs, :n])

    def sampling(self, fb: ForwardBatch, out: LogitsProcessorOutput) -> None:
        """Sampled requests draw their proposals instead, from the distributions left in
        `Proposals.q(bs, n)`. Over a draft vocabulary the draw is over its H columns and `q`
        holds their probabilities at their tokens, zero elsewhere: the distribution drawn
        from, whole, for the rejection test."""
        bs, n = fb.batch_size, fb.logits_per_req
        params = self.sampling_rows.gather(fb.req_pool_indices)
        q = self.proposals.q(bs, n)
        rows = params.repeat_interleave(n)
        if self.token_ids is None:
            probs = sampling_probs(out.next_token_logits[: bs * n], rows, out=q.view(bs * n, -1))
        else:
            probs = sampling_probs(out.next_token_logits[: bs * n], rows)
            q.view(bs * n, -1).zero_().index_copy_(1, self.token_ids, probs)
        positions = fb.positions.view(bs, -1)[:, 1 : 1 + n]
        drawn = sample_from_probs(probs.view(bs, n, -1),
                                  uniform(params.seed[:, None], positions, Lane.DRAFT))
        if self.token_ids is not None:
            drawn = self.token_ids[drawn]
        tokens = self.proposals.tokens[:bs, :n]
        tokens.copy_(torch.where(params.is_greedy[:, None], tokens, drawn))
        broadcast_from_first_rank(self.proposals.tokens[:bs])


def max_probability(logits: torch.Tensor, out: torch.Tensor) -> torch.Tensor:
    """DFlash's confidence: the largest softmax probability of each row of `logits` `[..., V]`
    (any view), the draft's probability of its greedy proposal, into `out` (float32, the
    leading shape, any view). The softmax exists for `CONFIDENCE_ROWS` rows at a time: whole,
    a Qwen2.5 draft block's at bs 64 would be 583 MB of float32."""
    if logits.dim() < 2 or tuple(out.shape) != tuple(logits.shape[:-1]) \
            or out.dtype != torch.float32:
        raise ValueError(f"out must be float32 {tuple(logits.shape[:-1])} for logits "
                         f"{tuple(logits.shape)} [..., vocab], got {out.dtype} "
                         f"{tuple(out.shape)}")
    step = max(1, CONFIDENCE_ROWS // max(1, logits[0, ..., 0].numel()))
    for s in range(0, logits.shape[0], step):
        rows = logits[s:s + step].float()
        out[s:s + step] = rows.amax(-1).sub_(rows.logsumexp(-1)).exp_()
    return out
