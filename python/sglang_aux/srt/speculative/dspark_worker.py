"""DSpark speculative decoding: the DFlash worker with a sequential Markov proposal and,
under compact verify, per-request verify lengths.

Everything DFlash does stays (`DFlashWorker`): the target's prefill commits the draft
context, the TARGET_VERIFY graph writes the packed aux rows into the runner's one aux storage
and consumes them in its epilogue (draft context commit, acceptance), the sampling tail runs
lossless rejection sampling, overlap and mixed steps. What differs:

- The draft block is `[anchor, MASK x (gamma - 1)]` (gamma rows, `draft_width`) and row k
  proposes the token at anchor + k + 1, so a request verifies gamma + 1 tokens (`block_size`).
  The DRAFT_BLOCK graph's epilogue runs the Markov loop (`propose_block`): proposals chosen
  row by row, greedy in the main graph, drawn in the sampling tail (which keeps the
  distributions for the rejection test), and each row's confidence.
- `SGLANG_RAGGED_VERIFY_MODE=compact`: after the draft forward, `compact_verify_lens` turns
  the confidences into per-request lengths under the step's token budget (device only; the
  bucket is known on the host). The verify forward is ragged (`RaggedStepPrologue`: token
  major, graphs per token bucket, the aux storage sized for the largest); its epilogue
  gathers each request's block rows and accepts at most `lens - 1` drafts. A step with a
  request whose logits are processed (penalties, min_new_tokens) or restricted by a grammar
  verifies every token, as static, so target-only's processing and the grammar's block masks
  apply row by row.

Each request's verify tokens are counted (`spec_verify_tokens`), so verify tokens per
accepted token compare static with compact.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable

import torch

from sglang_aux.srt.configs.dspark_config import DSparkConfig
from sglang_aux.srt.configs.model_config import ModelConfig
from sglang_aux.srt.forward_state.forward_batch_info import ForwardBatch, ForwardMode
from sglang_aux.srt.layers.logits_processor import LogitsProcessorOutput
from sglang_aux.srt.managers.pending_step import PendingStep
from sglang_aux.srt.managers.schedule_batch import Req, step_inputs
from sglang_aux.srt.mem_cache.memory_pool import PADDING_REQ_ROW
from sglang_aux.srt.model_executor.runner.epilogue import Epilogue
from sglang_aux.srt.model_executor.runner.forward_parts import ForwardParts
from sglang_aux.srt.model_executor.runner.ragged_step_prologue import RaggedStepPrologue
from sglang_aux.srt.sampling.sampler import SamplingTensors
from sglang_aux.srt.server_args import ServerArgs
from sglang_aux.srt.speculative.dflash_info import greedy_verify
from sglang_aux.srt.speculative.dflash_worker import DFlashWorker
from sglang_aux.srt.speculative.dspark_proposal import DSparkProposal, propose_block
from sglang_aux.srt.speculative.dspark_verify_lens import (
    compact_verify_lens,
    round_up_to_bucket,
)


class DSparkWorker(DFlashWorker):
    logprob_refusal = ("DSpark speculative decoding returns no logprobs (as in SGLang); "
                       "serve with --speculative-algorithm DFLASH or NONE for them")

    def __init__(self, target_config: ModelConfig, draft_config: ModelConfig,
                 server_args: ServerArgs, token_to_id: Callable[[str], int | None] | None = None):
        hf = draft_config.hf_config
        dspark = DSparkConfig.from_hf_config(hf)  # refuses a draft without a Markov head
        self.gamma = server_args.speculative_dspark_block_size or dspark.gamma
        # the draft model reads its gamma from here: the flag overrides the checkpoint's
        hf.dspark_config = dict(getattr(hf, "dspark_config", None) or {}, block_size=self.gamma)
        self.compact = server_args.ragged_verify_mode() == "compact"
        if self.compact and not dspark.confidence_head:
            raise ValueError("SGLANG_RAGGED_VERIFY_MODE=compact needs the draft's confidence "
                             "head (its config sets enable_confidence_head false)")
        self.align_to_bucket = server_args.speculative_dspark_align_verify_tokens_to_graph_tier
        self.budget_frac = server_args.dspark_verify_budget_frac
        super().__init__(target_config, draft_config, server_args, token_to_id)

    def _num_verify_tokens(self, server_args, dc) -> int:
        return self.gamma + 1

    @property
    def draft_width(self) -> int:
        """The draft block has gamma rows, one proposal each."""
        return self.gamma

    def _init_step_storage(self, rows: int, vocab: int, device: torch.device) -> None:
        super()._init_step_storage(rows, vocab, device)
        self._confidence = torch.zeros((rows, self.gamma), dtype=torch.float32, device=device)
        # a ragged verify step's tokens: at most every request's whole block
        tokens = rows * self.block_size
        self._verify_lens = torch.zeros(tokens, dtype=torch.int64, device=device)
        self._request_rows = torch.zeros(tokens, dtype=torch.int64, device=device)

    def _verify_parts(self) -> ForwardParts:
        if not self.compact:
            return super()._verify_parts()
        verify = ForwardMode.TARGET_VERIFY
        prologue = RaggedStepPrologue(block_tokens=lambda n: self._drafts[:n],
                                      lens=lambda n: self._verify_lens[:n],
                                      request_rows=lambda n: self._request_rows[:n])
        return ForwardParts(verify, self.block_size, prologue,
                            Epilogue(verify, self._verify_epilogue, self._verify_sampling),
                            self.streamed_aux, ragged=True)

    def decode(self, reqs: list[Req]) -> PendingStep:
        if not self.compact:
            return super().decode(reqs)
        bs, b = len(reqs), self.block_size
        has_sampling = self._draft(reqs)
        token_bitmask = self._block_bitmask(reqs)
        processed = token_bitmask is not None or any(r.sampling_params.processes_logits
                                                     for r in reqs)
        n = self._plan_verify(bs, every_token=processed)
        inputs = step_inputs(reqs, ForwardMode.TARGET_VERIFY, b)
        # token-major: n entries, the requests' rows first; each token's length is bounded
        # by its request's kv_len bound plus the block
        bound = max(inputs.step_kv_bounds) + b - 1
        inputs = dataclasses.replace(
            inputs, step_rows=inputs.step_rows + [PADDING_REQ_ROW] * (n - bs),
            step_kv_bounds=[bound] * n)
        fb = self.target_runner.prepare(inputs)
        fb.has_sampling = has_sampling
        out = self.target_runner.forward(fb)  # commits the draft context, leaves the verdicts
        if self.on_aux_consumed is not None:
            self.on_aux_consumed()
        rows = self._request_rows[:bs]
        if processed:  # every token verified, request-major: the static layout's rows
            self._verify_processed(reqs, rows, out.next_token_logits[: bs * b], has_sampling,
                                   token_bitmask)
        verdicts = self._verdicts[:bs]
        added = verdicts[:, 0] + 1
        self.target_runner.req_to_token_pool.advance_rows(
            rows, added, verdicts.gather(1, added[:, None])[:, 0])
        # [bs, 2 + B]: the verdicts, then the tokens each request verified
        readback = torch.cat([verdicts, self._verify_lens[:bs, None]], dim=1)
        return PendingStep(reqs, self.readback.start(readback), self._verified, kv_growth=b)

    def _plan_verify(self, bs: int, every_token: bool) -> int:
        """Each request's verify length into `_verify_lens[:bs]` (0 after, up to the step's
        tokens) and the step's token count: the captured bucket holding the budget, or
        exactly the budget where no graph does (an eager step). No host sync: the lengths
        stay on the device."""
        gamma, b = self.gamma, self.block_size
        take = bs * gamma if every_token else min(bs * gamma,
                                                  round(self.budget_frac * bs * gamma))
        graphs = self.target_runner.step_graphs
        buckets = [x.step_bs for x in graphs.layouts] if graphs is not None else []
        if not buckets or bs + take > buckets[-1]:
            buckets = [bs + take]
        if every_token:
            lens = torch.full((bs,), b, dtype=torch.int64, device=self._verify_lens.device)
            n = round_up_to_bucket(bs + take, buckets)
        else:
            if self.align_to_bucket:
                take = min(round_up_to_bucket(bs + take, buckets) - bs, bs * gamma)
            plan = compact_verify_lens(self._confidence[:bs], take, buckets)
            lens, n = plan.verify_lens, plan.num_tokens
        self._verify_lens[:n].zero_()
        self._verify_lens[:bs] = lens
        return n

    def _verified(self, req: Req, row: list[int]) -> list[int]:
        if not self.compact:
            return super()._verified(req, row)
        req.kv_len += row[0] + 1
        req.record_spec_verify(row[0], self.block_size, row[-1])
        return row[1 : row[0] + 2]

    def _block_index(self, n: int, r: int) -> torch.Tensor:
        """`[r, B]`: the token rows of the first `r` requests' blocks in a ragged forward of
        `n` tokens (rows past a request's length repeat a valid row, never read)."""
        lens = self._verify_lens[:n]
        starts = lens.cumsum(0) - lens
        offsets = torch.arange(self.block_size, device=lens.device)
        return (starts[:r, None] + offsets).clamp_max_(n - 1)

    def _accept_verified(self, fb: ForwardBatch, out: LogitsProcessorOutput) -> None:
        if not self.compact:
            super()._accept_verified(fb, out)
            return
        n = fb.batch_size
        r = min(n, self._drafts.shape[0])  # every request holds a token: at most n
        target_argmax = out.next_token_logits.argmax(-1)[self._block_index(n, r)]
        self._verdicts[:r] = greedy_verify(self._drafts[:r], target_argmax,
                                           self._verify_lens[:r]).packed()

    def _verify_sampling(self, fb: ForwardBatch, out: LogitsProcessorOutput) -> None:
        if not self.compact:
            super()._verify_sampling(fb, out)
            return
        n = fb.batch_size
        r = min(n, self._drafts.shape[0])
        index = self._block_index(n, r)
        self._rejection_sample(r, self._drafts[:r], fb.positions[index],
                               self._request_rows[:r],
                               out.next_token_logits[index.flatten()],
                               num_verified=self._verify_lens[:r])

    def _draft_epilogue(self, fb: ForwardBatch, out: LogitsProcessorOutput) -> None:
        """Inside the DRAFT_BLOCK graph: the greedy Markov loop over the block's rows."""
        self._propose(fb, out, None)

    def _draft_sampling(self, fb: ForwardBatch, out: LogitsProcessorOutput) -> None:
        """The DRAFT_BLOCK sampling tail: the loop again, drawing the sampled requests'
        proposals (greedy ones choose as in the main graph) and writing what they were drawn
        from straight into `_draft_q(bs)`."""
        self._propose(fb, out, self.sampling_rows.gather(fb.req_pool_indices),
                      self._draft_q(fb.batch_size))

    def _propose(self, fb: ForwardBatch, out: LogitsProcessorOutput,
                 params: SamplingTensors | None, probs_out: torch.Tensor | None = None
                 ) -> DSparkProposal:
        """`propose_block` over the draft forward's rows into `_drafts[:bs]` and, under
        compact verify, the confidences into `_confidence[:bs]`; sampled proposals'
        distributions into `probs_out`."""
        bs, gamma = fb.batch_size, self.gamma
        hidden = out.hidden_states.view(bs, gamma, -1) if self.compact else None
        proposal = propose_block(
            self.draft_runner.model, out.next_token_logits.view(bs, gamma, -1),
            fb.input_ids.view(bs, gamma)[:, 0], fb.positions.view(bs, gamma) + 1, params,
            all_greedy=params is None, hidden=hidden, probs_out=probs_out)
        self._drafts[:bs] = proposal.tokens
        if proposal.confidence is not None:
            self._confidence[:bs] = proposal.confidence
        return proposal
