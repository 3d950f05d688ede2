"""Which proposals a verify step accepts, decided on the device, inside the TARGET_VERIFY graph
where one replays.

The verify forward's epilogue consumes what the target just wrote, before the next target
forward: it commits every verified token's draft context (`DraftContext`) and accepts greedily
(`greedy_verify`: the longest prefix of proposals equal to the target's argmax, plus the
target's token after it); its sampling tail, run for batches with a sampled request, replaces
the sampled requests' verdicts by lossless rejection sampling (`rejection_verify`) against the
distributions the draft drew from. A compact (ragged) step's requests accept at most their
verified proposals; a static step narrower than W (the draft length schedule's width w)
verifies and accepts its first w - 1, its verdicts filling the rows' first 1 + w columns. A
step whose logits are processed (penalties, min_new_tokens, min-p) or restricted by a grammar
is decided again after the forward, from the processed logits (`verify_processed`). Verdict
rows `[1 + W]` per request: accepted proposals, then the emitted tokens; rank 0 decides, so
tensor-parallel ranks cannot diverge.
"""

from __future__ import annotations

import torch

from sglang_aux.srt.constrained.token_bitmask import apply_token_bitmask
from sglang_aux.srt.distributed.communication_op import broadcast_from_first_rank
from sglang_aux.srt.forward_state.forward_batch_info import ForwardBatch
from sglang_aux.srt.layers.logits_processor import LogitsProcessorOutput
from sglang_aux.srt.mem_cache.memory_pool import ReqToTokenPool
from sglang_aux.srt.sampling.penalties import PenaltyRows
from sglang_aux.srt.sampling.sampler import Lane, sampling_probs, uniform
from sglang_aux.srt.sampling.sampling_rows import SamplingRows
from sglang_aux.srt.speculative.dflash_info import greedy_verify, rejection_verify
from sglang_aux.srt.speculative.draft_context import DraftContext
from sglang_aux.srt.speculative.draft_proposals import Proposals
from sglang_aux.srt.speculative.verify_plan import VerifyPlan


class Acceptance:
    def __init__(self, proposals: Proposals, plan: VerifyPlan, draft_context: DraftContext,
                 sampling_rows: SamplingRows, penalty_rows: PenaltyRows,
                 req_to_token_pool: ReqToTokenPool):
        self.proposals, self.plan, self.draft_context = proposals, plan, draft_context
        self.sampling_rows, self.penalty_rows = sampling_rows, penalty_rows
        self.req_to_token_pool = req_to_token_pool
        self.verify_width = w = plan.verify_width
        rows = proposals.tokens.shape[0]
        # `[rows, 1 + W]` per step request: accepted proposals, then the new tokens; a mixed
        # step's readback adds its arrivals' first tokens in the rows after
        # (`DFlashWorker.mixed`). Borrowed until the target's next verify forward.
        self.verdicts = torch.zeros((rows, w + 1), dtype=torch.int64,
                                    device=proposals.tokens.device)

    def verify_epilogue(self, fb: ForwardBatch, out: LogitsProcessorOutput) -> None:
        """Inside the TARGET_VERIFY graph: consume the aux rows (or the streamed projection)
        the forward just wrote, and accept greedily (`verdicts[:bs]`)."""
        self.draft_context.commit_forward(fb, out)
        if not self.plan.compact:
            bs = fb.batch_size
            self.accept_greedy(bs, fb.input_ids.view(bs, -1)[:, 1:], out.next_token_logits)
            return
        n = fb.batch_size
        r = min(n, self.verdicts.shape[0])  # every request holds a token: at most n
        target_argmax = out.next_token_logits.argmax(-1)[self.plan.block_index(n, r)]
        self.verdicts[:r] = greedy_verify(self.proposals.tokens[:r], target_argmax,
                                          self.plan.verify_lens[:r]).packed()

    def verify_sampling(self, fb: ForwardBatch, out: LogitsProcessorOutput) -> None:
        """The TARGET_VERIFY sampling tail (`rejection_sample`)."""
        if not self.plan.compact:
            bs = fb.batch_size
            self.rejection_sample(bs, fb.input_ids.view(bs, -1)[:, 1:],
                                  fb.positions.view(bs, -1), fb.req_pool_indices,
                                  out.next_token_logits)
            return
        n = fb.batch_size
        r = min(n, self.verdicts.shape[0])
        index = self.plan.block_index(n, r)
        self.rejection_sample(r, self.proposals.tokens[:r], fb.positions[index],
                              self.plan.request_rows[:r], out.next_token_logits[index.flatten()],
                              num_verified=self.plan.verify_lens[:r])

    def mixed_epilogue(self, fb: ForwardBatch, out: LogitsProcessorOutput) -> None:
        """Inside the MIXED graph: the draft context of every token (step rows and prompts),
        then greedy acceptance of the leading step rows (a graph's padded step requests get
        verdicts nobody reads)."""
        self.draft_context.commit_forward(fb, out)
        bs = fb.mixed_step_bs
        n = bs * fb.mixed_step_width
        self.accept_greedy(bs, fb.input_ids[:n].view(bs, -1)[:, 1:], out.next_token_logits[:n])

    def accept_greedy(self, bs: int, proposals: torch.Tensor, logits: torch.Tensor) -> None:
        """`verdicts[:bs]` from `bs` requests' verified proposals `[bs, w - 1]` (w <= W)
        and their logits rows `[bs * w, vocab]`."""
        w = proposals.shape[1] + 1
        target_argmax = logits.view(bs, w, -1).argmax(-1)
        self.verdicts[:bs, : w + 1] = greedy_verify(proposals, target_argmax).packed()
        broadcast_from_first_rank(self.verdicts[:bs])

    def rejection_sample(self, bs: int, proposals: torch.Tensor, positions: torch.Tensor,
                         rows: torch.Tensor, logits: torch.Tensor, min_p: bool = False,
                         num_verified: torch.Tensor | None = None) -> None:
        """Lossless rejection sampling of `bs` requests' proposals `[bs, w - 1]` (w <= W;
        verify positions `[bs, w]`, logits `[bs * w, vocab]`) against the leading w - 1 of
        `Proposals.q(bs, w - 1)`; greedy requests keep their greedy verdicts. `min_p`: a request may
        set it (known on the host); `num_verified` `[bs]`: tokens each request verified
        (`rejection_verify`)."""
        w = proposals.shape[1] + 1
        params = self.sampling_rows.gather(rows, min_p)
        p = sampling_probs(logits, params.repeat_interleave(w)).view(bs, w, -1)
        seed = params.seed[:, None]
        sampled = rejection_verify(proposals, self.proposals.q(bs, w - 1), p,
                                   uniform(seed, positions[:, 1:], Lane.ACCEPT),
                                   uniform(seed, positions + 1, Lane.RESIDUAL),
                                   num_verified).packed()
        verdicts = self.verdicts[:bs, : w + 1]
        verdicts.copy_(torch.where(params.is_greedy[:, None], verdicts, sampled))
        broadcast_from_first_rank(self.verdicts[:bs])

    def verify_processed(self, rows: torch.Tensor, logits: torch.Tensor, *, penalized: bool,
                         has_sampling: bool, token_bitmask: torch.Tensor | None = None) -> None:
        """`verdicts[:bs]` again (bs = len(rows)), from the verify logits `[bs * W, vocab]`
        processed as target-only decoding would after each verify position's proposals
        (`penalized`: penalties, min_new_tokens, min-p) and restricted to what each position's
        grammar mask allows (`token_bitmask` `[bs * W, words]`), so greedy acceptance and
        rejection sampling use the target-only distribution (the graph accepted against the
        raw logits); then the emitted tokens are counted. Runs before the rows' kv_len
        advances: verify position j sits at kv_len + j."""
        bs, w = len(rows), self.verify_width
        proposals = self.proposals.tokens[:bs]
        processed = (self.penalty_rows.apply(logits, rows, proposals) if penalized
                     else logits.to(torch.float32, copy=True))
        if token_bitmask is not None:
            apply_token_bitmask(processed, token_bitmask)
        self.accept_greedy(bs, proposals, processed)
        if has_sampling:
            kv_lens = self.req_to_token_pool.kv_lens[rows]
            positions = kv_lens[:, None] + torch.arange(w, device=kv_lens.device)
            self.rejection_sample(bs, proposals, positions, rows, processed, min_p=penalized)
        if penalized:
            verdicts = self.verdicts[:bs]
            self.penalty_rows.advance(rows, verdicts[:, 1:], verdicts[:, 0] + 1)
