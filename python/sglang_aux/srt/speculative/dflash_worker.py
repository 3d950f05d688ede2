"""DFlash speculative decoding: a target runner and a draft runner sharing KV slots; this file
orchestrates the steps (prefill, prefill chunk, decode, mixed), the pieces do the work:

- `draft_proposals.py`: the draft forward's proposals (`Proposals`) and how DFlash's draft
  proposes (`DFlashProposer`; DSpark's is `dspark_proposal.DSparkProposer`);
- `verify_plan.py`: how many tokens each request verifies (static or compact) and the verify
  forward's prologue;
- `acceptance.py`: the verify forward's epilogue and sampling tail (greedy acceptance,
  rejection sampling) and the re-decision of processed steps;
- `draft_context.py`: the draft context commit and the aux projection a forward feeds;
- `draft_len_planner.py`: the verify width each batch size gets (the draft length schedule).

Per decode step and batch, all on the device after one copy per runner of (row, kv_len, last
token) per request, from which each graph's prologue derives its inputs (StepPrologue):
(1) the DRAFT_BLOCK graph leaves each request's W - 1 proposals (W: the verify width), and
when a request samples, its sampling tail draws them and keeps their distributions; (2) the
TARGET_VERIFY graph runs `[anchor, proposals]`, writes the aux states into the runner's shared
storage (or streams them into the draft fc's accumulator), then, in the same graph, commits
every verified token's draft context and accepts; (3) one readback gives the host each
request's accepted count and tokens. Verify rows past the accepted prefix leave K/V at
positions past the new kv_len, never read before the next step writes them again (the
invariant in schedule_batch.py). The scheduler owns the KV slots; this worker only advances
each request's kv_len. Each request's verify tokens are counted (`spec_verify_tokens`), so
verify tokens per accepted token compare static with compact verify.

A step of bs requests verifies the draft length schedule's width w(bs) <= W per request:
static verify the leading w(bs) tokens of each block (graphs per batch size and width; its
mixed steps too; its draft's LM head over their w(bs) - 1 proposals alone), compact verify at
most w(bs) on average (it caps the step's budget at bs * (w - 1) proposals; its mixed steps
verify the full width). Steps whose logits are processed, grammar-restricted or scored
verify every token of the full width, request-major. At width 1 the step is plain decoding:
no draft forward, the verify forward runs the anchors alone and its epilogue still commits
their draft context, so a later step speculates again.
"""

from __future__ import annotations

import dataclasses
import logging
import os
from collections.abc import Callable

import torch

from sglang_aux.srt.configs.dflash_config import DFlashConfig
from sglang_aux.srt.configs.model_config import ModelConfig
from sglang_aux.srt.configs.step_costs import StepCosts
from sglang_aux.srt.distributed.parallel_state import get_tp_group
from sglang_aux.srt.forward_state.forward_batch_info import (
    CaptureHiddenMode,
    ForwardBatch,
    ForwardMode,
)
from sglang_aux.srt.managers.model_worker import RequestRowStaging
from sglang_aux.srt.managers.pending_step import PendingStep
from sglang_aux.srt.managers.schedule_batch import (
    Req,
    extend_inputs,
    mixed_inputs,
    step_inputs,
)
from sglang_aux.srt.managers.step_logprobs import StepLogprobs, packed_prefill
from sglang_aux.srt.model_executor.model_runner import ModelRunner
from sglang_aux.srt.model_executor.runner.epilogue import Epilogue
from sglang_aux.srt.model_executor.runner.forward_parts import ForwardParts
from sglang_aux.srt.model_executor.runner.step_prologue import StepPrologue
from sglang_aux.srt.model_executor.runner_utils.host_transfer import HostReadback, PendingRows
from sglang_aux.srt.sampling.penalties import PenaltyRows
from sglang_aux.srt.sampling.sampling_rows import SamplingRows
from sglang_aux.srt.server_args import ServerArgs
from sglang_aux.srt.speculative.acceptance import Acceptance
from sglang_aux.srt.speculative.draft_context import DraftContext
from sglang_aux.srt.speculative.draft_len_planner import DraftLenPlanner
from sglang_aux.srt.speculative.draft_proposals import DFlashProposer, Proposals, Proposer
from sglang_aux.srt.speculative.step_cost_probe import measure_step_costs
from sglang_aux.srt.speculative.token_map import cut_lm_head, load_token_map
from sglang_aux.srt.speculative.verify_plan import VerifyPlan

logger = logging.getLogger(__name__)

# (requests, their DRAFT_BLOCK batch, after its forward) -> proposals `[bs, W - 1]`. Sampled
# requests are verified against the distributions the draft forward left in
# `Proposals.probs`, so a replacement (tests) serves greedy requests.
ProposalSource = Callable[[list[Req], ForwardBatch], torch.Tensor]


class DFlashWorker(RequestRowStaging):
    logprob_refusal: str | None = None

    def __init__(self, target_config: ModelConfig, draft_config: ModelConfig,
                 server_args: ServerArgs, token_to_id: Callable[[str], int | None] | None = None,
                 *, verify_width: int | None = None):
        """`verify_width`: the tokens per request of a verify step when the draft decides it
        (DSpark); None: `--speculative-verify-width`, else the draft block's size."""
        dc = DFlashConfig.from_hf_config(draft_config.hf_config, token_to_id=token_to_id,
                                         num_target_layers=target_config.num_layers)
        vocab = target_config.hf_config.vocab_size
        if not 0 <= dc.mask_token_id < vocab:
            raise ValueError(f"the draft's mask_token_id {dc.mask_token_id} is outside the "
                             f"target's vocabulary [0, {vocab})")
        draft_config.hf_config.dflash_config = dc.as_dflash_config()  # the draft reads it whole
        # the draft vocabulary, read before any model loads; its size is the draft's logits
        # width (SGLang's `hot_vocab_size` override), which its graphs' buffers take
        token_ids = None
        map_path = server_args.speculative_token_map or (
            dc.token_map and os.path.join(draft_config.model_path, dc.token_map))
        if map_path:
            token_ids = load_token_map(map_path, vocab)
            draft_config.hf_config.hot_vocab_size = token_ids.numel()
        if type(self) is DFlashWorker and "DSparkDraftModel" in (
                getattr(draft_config.hf_config, "architectures", None) or ()):
            logger.warning("%s is a DSpark draft: --speculative-algorithm DFLASH runs its DFlash "
                           "layers and never reads its Markov head (DSPARK does)",
                           draft_config.model_path)
        self.verify_width = w = (verify_width or server_args.speculative_verify_width
                                 or dc.draft_block_size)
        # the draft length flags checked against the draft before the models load
        self.draft_len = DraftLenPlanner(server_args, w,
                                         compact=server_args.speculative_verify_mode == "compact",
                                         draft_dir=draft_config.model_path)
        self.target_runner = ModelRunner(target_config, server_args,
                                         aux_layer_ids=dc.target_layer_ids)
        self.draft_runner = ModelRunner(
            draft_config, server_args, is_draft_worker=True,
            req_to_token_pool=self.target_runner.req_to_token_pool,
            token_to_kv_pool_allocator=self.target_runner.token_to_kv_pool_allocator,
        )
        self.draft_context = DraftContext(self.target_runner, self.draft_runner, server_args)
        self.step_cost_context = server_args.speculative_step_cost_context
        lm_head = self.target_runner.model.lm_head_weight
        if token_ids is not None:  # the draft model keeps them (`token_ids`)
            token_ids = token_ids.to(self.target_runner.device)
            lm_head = cut_lm_head(lm_head, token_ids, vocab)
            logger.info("Draft vocabulary: %d of %d tokens (%s), its LM head %.1f MiB",
                        len(token_ids), vocab, map_path,
                        lm_head.numel() * lm_head.element_size() / 2**20)
        self.draft_runner.model.set_target_modules(
            self.target_runner.model.get_input_embeddings(), lm_head, token_ids)
        self.mask_token_id = dc.mask_token_id
        self.propose: ProposalSource = self._graph_proposals
        # Called after each step's aux rows (or streamed accumulator) are consumed (tests poison
        # the storage here).
        self.on_aux_consumed: Callable[[], None] | None = None
        device = self.target_runner.device
        # a batch never exceeds the running limit, but a padded graph may
        rows = max([server_args.max_running_requests, *(server_args.cuda_graph_bs_decode or [])])
        self.sampling_rows = SamplingRows(rows, vocab, device)
        self.penalty_rows = PenaltyRows(rows, vocab, device)
        self.readback = HostReadback(device)
        self.proposals = self._proposals(rows, vocab, device)
        self.verify_plan = VerifyPlan(server_args, w, rows, self.target_runner)
        self.acceptance = Acceptance(self.proposals, self.verify_plan, self.draft_context,
                                     self.sampling_rows, self.penalty_rows,
                                     self.target_runner.req_to_token_pool)
        self.proposer = self._proposer()
        self._init_forwards(server_args)
        draft_graphs = self.draft_runner.step_graphs
        plan = self.verify_plan
        self.draft_len.start([] if draft_graphs is None else
                             [x.step_bs for x in draft_graphs.layouts],
                             plan.budget if plan.compact else lambda bs: bs * (w - 1),
                             self._measure_step_costs)
        if not plan.compact and self.draft_len.schedule.min_width < w:
            # static verify's graphs at the schedule's narrower widths (it stays fixed), and
            # the draft's that compute only their proposals' logits
            self.target_runner.capture_step_widths(self.draft_len.width)
            self.draft_runner.capture_logits_widths(lambda bs: self.draft_len.width(bs) - 1)

    def _measure_step_costs(self) -> StepCosts | None:
        """The draft and verify graphs' costs (None without both), over padding rows and
        over requests of `--speculative-step-cost-context` tokens; rank 0's on every rank,
        so tensor-parallel ranks derive one schedule."""
        draft, verify = self.draft_runner.step_graphs, self.target_runner.step_graphs
        if draft is None or verify is None:
            return None
        plan = self.verify_plan
        costs = measure_step_costs(draft, verify, context=self.step_cost_context,
                                   ragged_lens=plan.verify_lens if plan.compact else None,
                                   narrow_draft=not plan.compact)
        return get_tp_group().broadcast_object(costs)

    @property
    def step_stats(self) -> dict[str, int]:
        """Verify steps by kind, for the scheduler's statistics (`Worker`)."""
        return {"spec_verify_steps": self.draft_len.verify_steps,
                "spec_plain_steps": self.draft_len.plain_steps}

    def server_info(self) -> dict:
        """The draft length schedule in force and its source, and the draft's forwards by
        mode, graph or eager (`Worker`)."""
        return {"speculative_draft_len_schedule": self.draft_len.info(),
                "draft_forwards": self.draft_runner.forwards_info()}

    def _proposals(self, rows: int, vocab: int, device: torch.device) -> Proposals:
        """A step's distributions packed by its proposals: the draft computes only those."""
        return Proposals.create(rows, self.verify_width, vocab, device, packed=True)

    def _proposer(self) -> Proposer:
        """The draft's half of the step: DFlash drafts over the whole verify width."""
        return DFlashProposer(self.proposals, self.sampling_rows, self.verify_width,
                              with_confidence=self.verify_plan.compact,
                              token_ids=self.draft_runner.model.token_ids)

    def _init_forwards(self, server_args: ServerArgs) -> None:
        """What the runners' forwards run besides the model, inside their graphs
        (bench_graph_memory.py captures them too): the verify prologue (`[anchor, proposals]`
        from `Proposals.tokens`), the commit + acceptance epilogue and its rejection-sampling
        tail, the streamed projection; prefills commit the prompt's draft context in their
        own forward; the draft block's proposer."""
        acceptance, context = self.acceptance, self.draft_context
        verify, extend = ForwardMode.TARGET_VERIFY, ForwardMode.EXTEND
        block = ForwardMode.DRAFT_BLOCK
        self.verify_parts = self.verify_plan.forward_parts(
            self.proposals.tokens,
            Epilogue(verify, acceptance.verify_epilogue, acceptance.verify_sampling),
            context.streamed_aux)
        forwards = [self.verify_parts,
                    ForwardParts(extend, epilogue=Epilogue(extend, context.prefill_epilogue),
                                 streamed_aux=context.streamed_aux,
                                 staged_from_tokens=context.staged_from_tokens())]
        if server_args.enable_mixed_chunk:
            # Verify steps that carry arrivals' prefills: the commit covers both, greedy
            # acceptance the step rows; the rejection tail runs after (`mixed`).
            mixed = ForwardMode.MIXED
            forwards.append(ForwardParts(mixed, self.verify_width, self.verify_parts.prologue,
                                         Epilogue(mixed, acceptance.mixed_epilogue),
                                         context.streamed_aux))
        self.target_runner.init_forwards(*forwards)
        proposer = self.proposer
        self.draft_runner.init_forwards(ForwardParts(
            block, proposer.draft_block_size, StepPrologue(fill_token_id=self.mask_token_id),
            Epilogue(block, proposer.epilogue, proposer.sampling),
            logits_per_req=proposer.logits_per_req))

    @property
    def model_runner(self) -> ModelRunner:
        """The runner whose request rows and KV slots the scheduler manages."""
        return self.target_runner

    @property
    def tokens_per_req(self) -> int:
        """The scheduler's most tokens one step adds to a request (`Worker`): a verify
        step emits up to the verify width."""
        return self.verify_width

    def prefill(self, reqs: list[Req]) -> PendingStep:
        self._write_rows(reqs)
        logprobs = StepLogprobs.of(reqs, prefill=True)
        inputs = extend_inputs(self.target_runner, reqs)
        if logprobs is not None and logprobs.needs_hidden:
            inputs = dataclasses.replace(inputs, capture_hidden_mode=CaptureHiddenMode.FULL)
        fb = self.target_runner.prepare(self.draft_context.with_projection(inputs))
        out = self.target_runner.forward(fb)  # its epilogue committed the draft context
        tokens = self._sample(out.next_token_logits, reqs, fb.req_pool_indices, fb.seq_lens)
        self.target_runner.req_to_token_pool.set_rows(fb.req_pool_indices, fb.seq_lens, tokens)
        return PendingStep(reqs, self.readback.start(packed_prefill(
            logprobs, tokens, out, fb, self.target_runner.model.lm_head_weight)),
            _first_token, kv_growth=0, logprobs=logprobs)

    def prefill_chunk(self, req: Req, num_tokens: int) -> None:
        """A chunk of `req`'s prompt that is not its last (chunked prefill): the target K/V
        of its next `num_tokens` tokens, and their draft context, committed by the forward's
        epilogue from that forward's aux rows, staged input or streamed projection (so a
        step's aux memory is bounded by the chunk). Nothing is sampled: the last chunk is a
        `prefill`."""
        runner = self.target_runner
        runner.forward(runner.prepare(self.draft_context.with_projection(
            extend_inputs(runner, [req], chunk=num_tokens))))
        if self.on_aux_consumed is not None:
            self.on_aux_consumed()

    def decode(self, reqs: list[Req]) -> PendingStep:
        bs, w, plan = len(reqs), self.verify_width, self.verify_plan
        penalized = any(r.sampling_params.processes_logits for r in reqs)
        logprobs = StepLogprobs.of(reqs, w)
        # A step whose logits are processed, grammar-restricted or scored verifies every
        # token, request-major (the static rows), so they apply row by row.
        every_token = (penalized or logprobs is not None
                       or any(r.grammar is not None for r in reqs))
        width = w if every_token else self.draft_len.width(bs)
        self.draft_len.count_step(width)
        has_sampling = _samples(reqs)
        if width > 1:  # else plain decoding: the verify forward runs the anchors alone
            # compact verify ranks every proposal by its confidence: the full block's
            self._draft(reqs, has_sampling, None if plan.compact else width)
        token_bitmask = self._verify_bitmask(reqs)
        processed = token_bitmask is not None or penalized
        # `[anchor, proposals]` per request: the verify prologue reads `Proposals` itself
        if plan.compact:
            inputs = plan.ragged_inputs(step_inputs(reqs, ForwardMode.TARGET_VERIFY, w),
                                        every_token, self.proposals.confidence, width)
        else:  # the leading `width` of each request's block
            inputs = step_inputs(reqs, ForwardMode.TARGET_VERIFY, width)
        verify_fb = self.target_runner.prepare(inputs)
        verify_fb.has_sampling = has_sampling
        # The graph (or the eager forward) commits the draft context and leaves the verdicts.
        out = self.target_runner.forward(verify_fb)
        if self.on_aux_consumed is not None:
            self.on_aux_consumed()
        rows = plan.request_rows[:bs] if plan.compact else verify_fb.req_pool_indices
        logits = out.next_token_logits[: bs * w]  # static rows wherever they are read
        if processed:
            self.acceptance.verify_processed(rows, logits, penalized=penalized,
                                             has_sampling=has_sampling,
                                             token_bitmask=token_bitmask)
        verdicts = self._advance(rows, bs)
        readback = verdicts
        if plan.compact:  # then the tokens each request verified
            readback = torch.cat([verdicts, plan.verify_lens[:bs, None]], dim=1)
        if logprobs is not None:
            # verify position j's target row scores the token emitted there: the verify
            # logits (borrowed until the next forward) are read before any other forward
            readback = logprobs.pack(readback, logits, verdicts[:, 1:])
        return PendingStep(reqs, self.readback.start(readback), self._verified(width),
                           kv_growth=w if plan.compact else width, logprobs=logprobs)

    def mixed(self, reqs: list[Req], arrivals: list[Req],
              chunk: int | None = None) -> list[PendingStep]:
        """A verify step of `reqs` and the prefill of `arrivals` in one target forward
        (MIXED): proposals as `decode`, then one forward whose epilogue commits the draft
        context of every token (verify rows and prompts) and accepts greedily; one readback,
        shared by the two steps it returns. With `chunk`, `arrivals` is the one chunked request
        and the forward runs (and commits the draft context of) its next `chunk` prompt
        tokens, not its last: nothing is sampled for it and only the verify step comes back."""
        bs, acceptance = len(reqs), self.acceptance
        n = 0 if chunk is not None else len(arrivals)  # arrivals sampled
        if n:  # a chunked request's rows are staged once, for its last chunk
            self._write_rows(arrivals)
        has_sampling = _samples(reqs)
        penalized = any(r.sampling_params.processes_logits for r in reqs)
        # mixed steps are static: the schedule's width (its graphs captured with the verify
        # ones), the full one under compact verify and where logits are processed row by row
        w = (self.verify_width if penalized or self.verify_plan.compact
             else self.draft_len.width(bs))
        self.draft_len.count_step(w)
        if w > 1:  # else plain decoding: the step rows are the anchors alone
            self._draft(reqs, has_sampling, w)
        fb = self.target_runner.prepare(mixed_inputs(self.target_runner, reqs, arrivals, w,
                                                     chunk))
        out = self.target_runner.forward(fb)
        if self.on_aux_consumed is not None:
            self.on_aux_consumed()
        step_tokens, sb = bs * w, fb.mixed_step_bs
        logits = out.next_token_logits
        if penalized:
            acceptance.verify_processed(fb.req_pool_indices[:bs], logits[:step_tokens],
                                        penalized=True, has_sampling=has_sampling)
        elif has_sampling:
            acceptance.rejection_sample(bs, fb.input_ids[:step_tokens].view(bs, w)[:, 1:],
                                        fb.positions[:step_tokens].view(bs, w),
                                        fb.req_pool_indices[:bs], logits[:step_tokens])
        verdicts = self._advance(fb.req_pool_indices[:bs], bs)
        if not n:
            return [PendingStep(reqs, self.readback.start(verdicts), self._verified(w),
                                kv_growth=w)]
        rows, seq_lens = fb.req_pool_indices[sb : sb + n], fb.seq_lens[sb : sb + n]
        first = self._sample(logits[step_tokens : step_tokens + n], arrivals, rows, seq_lens)
        self.target_runner.req_to_token_pool.set_rows(rows, seq_lens, first)
        # One readback of both halves: each arrival's first token leads a row after the
        # verdicts (rows a padded step's unread verdicts may hold; every request holds its own
        # request row, so bs + n rows fit)
        all_verdicts = acceptance.verdicts
        all_verdicts[bs : bs + n, 0] = first
        copy = self.readback.start(all_verdicts[: bs + n])
        return [PendingStep(reqs, PendingRows(copy, 0, bs), self._verified(w), kv_growth=w),
                PendingStep(arrivals, PendingRows(copy, bs, bs + n), _first_of_row,
                            kv_growth=0)]

    def _advance(self, rows: torch.Tensor, bs: int) -> torch.Tensor:
        """The step's verdicts `[bs, 1 + W]` (accepted proposals, then the new tokens), with
        each request row's device kv_len and last token advanced past the emitted tokens."""
        verdicts = self.acceptance.verdicts[:bs]
        added = verdicts[:, 0] + 1
        self.target_runner.req_to_token_pool.advance_rows(
            rows, added, verdicts.gather(1, added[:, None])[:, 0])
        return verdicts

    def _verify_bitmask(self, reqs: list[Req]) -> torch.Tensor | None:
        """The grammar masks of every verify position (`RequestGrammar.fill_block`) on the
        device, None when no request has a grammar. Walking the matchers along the proposals
        needs them on the host: one readback, in grammar batches only."""
        if all(r.grammar is None for r in reqs):
            return None
        # the step's second host sync, grammar batches only: xgrammar's matchers walk on the host
        return self._token_bitmask(reqs, self.proposals.tokens[: len(reqs)].tolist())

    def _draft(self, reqs: list[Req], has_sampling: bool, width: int | None = None) -> None:
        """The draft's proposals for `reqs` into `Proposals.tokens[:bs]`, the first
        `width` - 1 of them for a step of that verify width (None: all); `has_sampling`: a
        request samples (only then do the epilogues' sampling steps run)."""
        inputs = step_inputs(reqs, ForwardMode.DRAFT_BLOCK, self.proposer.draft_block_size)
        if width is not None and width < self.verify_width and self.proposer.logits_per_req:
            inputs = dataclasses.replace(inputs, logits_per_req=width - 1)
        draft_fb = self.draft_runner.prepare(inputs)
        draft_fb.has_sampling = has_sampling
        self.draft_runner.forward(draft_fb)  # proposals in `Proposals.tokens[:bs]`
        proposals = self.propose(reqs, draft_fb)
        tokens = self.proposals.tokens
        if proposals.data_ptr() != tokens.data_ptr():  # a replacement with its own storage
            tokens[: len(reqs)].copy_(proposals)

    def _graph_proposals(self, reqs: list[Req], _fb: ForwardBatch) -> torch.Tensor:
        return self.proposals.tokens[: len(reqs)]

    def _verified(self, width: int) -> Callable[[Req, list[int]], list[int]]:
        """What the host does with one request's verdict row of a step of `width` tokens a
        request (compact: the row ends with the tokens the request verified): the anchor and
        the accepted proposals are now KV; the emitted tokens."""
        def verified(req: Req, row: list[int]) -> list[int]:
            req.kv_len += row[0] + 1
            tokens = row[-1] if self.verify_plan.compact else width
            req.record_spec_verify(row[0], self.verify_width, tokens)
            self.draft_len.observe(row[0], tokens)
            return row[1 : row[0] + 2]

        return verified


def _samples(reqs: list[Req]) -> bool:
    """Whether a request samples (known on the host: only then do the epilogues' sampling
    steps run)."""
    return not all(r.sampling_params.is_greedy for r in reqs)


def _first_token(_req: Req, token: int) -> list[int]:
    return [token]


def _first_of_row(_req: Req, row: list[int]) -> list[int]:
    """An arrival's row of a mixed step's readback: its first token leads."""
    return [row[0]]
