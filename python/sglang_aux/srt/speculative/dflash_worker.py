"""DFlash speculative decoding: a target runner and a draft runner sharing KV slots.

Per decode step and batch, all on the device after one copy per runner of (row, kv_len, last
token) per request, from which each graph's prologue derives its inputs (StepPrologue):
(1) the draft proposes B-1 tokens per request
from `[anchor, MASK x (B-1)]`: its DRAFT_BLOCK graph emits the argmax proposals, and when a
request samples, the graph's sampling tail draws that request's proposals and keeps the
distributions they came from; (2) the target verifies `[anchor, drafts]`: its TARGET_VERIFY
graph writes the packed aux states into the runner's shared buffer (or, streamed, projects them
into the draft fc's fp32 accumulator as they are tapped), then, in the same graph, commits
every block row's draft context K/V (`commit_draft_context`) and runs greedy acceptance; its
sampling tail runs lossless rejection sampling for the sampled requests; (3) one readback
gives the host each request's accepted count and tokens. Block rows past the accepted prefix
leave K/V at positions past the new kv_len, never read before the next step writes them again
(the invariant in schedule_batch.py). The scheduler owns the KV slots; this worker only
advances each request's kv_len.

`SGLANG_RAGGED_VERIFY_MODE=compact` (SGLang's DSpark mode, here for the whole family): the
draft graph also keeps each proposal's confidence (DFlash: the draft's probability of it,
`max_probability`; DSpark: its confidence head), `compact_verify_lens` turns them into
per-request lengths under the step's token budget (device only; the bucket is known on the
host), and the verify forward is ragged (`RaggedStepPrologue`: token-major, graphs per token
bucket, the aux storage sized for the largest); its epilogue gathers each request's block rows
and accepts at most `lens - 1` drafts. A step with a request whose logits are processed
(penalties, min_new_tokens), restricted by a grammar or scored (logprobs) verifies every
token, as static. Each request's verify tokens are counted (`spec_verify_tokens`), so verify
tokens per accepted token compare static with compact.
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Callable

import torch

from sglang_aux.srt.configs.dflash_config import DFlashConfig
from sglang_aux.srt.configs.model_config import ModelConfig
from sglang_aux.srt.constrained.token_bitmask import apply_token_bitmask
from sglang_aux.srt.distributed.communication_op import broadcast_from_first_rank
from sglang_aux.srt.forward_state.forward_batch_info import (
    AuxProjection,
    CaptureHiddenMode,
    ForwardBatch,
    ForwardMode,
)
from sglang_aux.srt.layers.logits_processor import LogitsProcessorOutput
from sglang_aux.srt.managers.model_worker import RequestRowStaging
from sglang_aux.srt.managers.pending_step import PendingStep
from sglang_aux.srt.managers.schedule_batch import (
    Req,
    extend_inputs,
    mixed_inputs,
    step_inputs,
)
from sglang_aux.srt.managers.step_logprobs import StepLogprobs, packed_prefill
from sglang_aux.srt.mem_cache.memory_pool import PADDING_REQ_ROW
from sglang_aux.srt.model_executor.model_runner import ModelRunner
from sglang_aux.srt.model_executor.runner.epilogue import Epilogue
from sglang_aux.srt.model_executor.runner.forward_layout import ForwardInputs
from sglang_aux.srt.model_executor.runner.forward_parts import ForwardParts, StreamedAux
from sglang_aux.srt.model_executor.runner.ragged_step_prologue import RaggedStepPrologue
from sglang_aux.srt.model_executor.runner.step_prologue import StepPrologue
from sglang_aux.srt.model_executor.runner_utils.host_transfer import HostReadback, PendingRows
from sglang_aux.srt.sampling.penalties import PenaltyRows
from sglang_aux.srt.sampling.sampler import Lane, sample_from_probs, sampling_probs, uniform
from sglang_aux.srt.sampling.sampling_rows import SamplingRows
from sglang_aux.srt.server_args import ServerArgs
from sglang_aux.srt.speculative.compact_verify import (
    compact_verify_lens,
    max_probability,
    round_up_to_bucket,
)
from sglang_aux.srt.speculative.dflash_info import greedy_verify, rejection_verify

logger = logging.getLogger(__name__)

# (requests, their DRAFT_BLOCK batch, after its forward) -> drafts `[bs, B-1]`. Sampled
# requests are verified against the distributions the draft forward left in `_draft_probs`,
# so a replacement proposer (tests) serves greedy requests.
Proposer = Callable[[list[Req], ForwardBatch], torch.Tensor]


class DFlashWorker(RequestRowStaging):
    logprob_refusal: str | None = None

    def __init__(self, target_config: ModelConfig, draft_config: ModelConfig,
                 server_args: ServerArgs, token_to_id: Callable[[str], int | None] | None = None):
        dc = DFlashConfig.from_hf_config(draft_config.hf_config, token_to_id=token_to_id,
                                         num_target_layers=target_config.num_layers)
        vocab = target_config.hf_config.vocab_size
        if not 0 <= dc.mask_token_id < vocab:
            raise ValueError(f"the draft's mask_token_id {dc.mask_token_id} is outside the "
                             f"target's vocabulary [0, {vocab})")
        draft_config.hf_config.dflash_config = dc.as_dflash_config()  # the draft reads it whole
        self.compact = server_args.ragged_verify_mode() == "compact"
        self.align_to_bucket = server_args.speculative_dspark_align_verify_tokens_to_graph_tier
        self.budget_frac = server_args.compact_verify_budget_frac
        self.max_verify_tokens = server_args.compact_verify_max_tokens
        self.target_runner = ModelRunner(target_config, server_args,
                                         aux_layer_ids=dc.target_layer_ids)
        draft_runner = ModelRunner(
            draft_config, server_args, is_draft_worker=True,
            req_to_token_pool=self.target_runner.req_to_token_pool,
            token_to_kv_pool_allocator=self.target_runner.token_to_kv_pool_allocator,
        )
        self.draft_runner = draft_runner
        fc_quant = (server_args.speculative_draft_fc_quantization
                    or getattr(draft_config.hf_config, "quantization", None) or "none")
        if fc_quant == "mxfp8":
            draft_runner.model.quantize_fc_mxfp8()
        self.staged_min_tokens = server_args.dflash_staged_projection_min_tokens
        # set: every target forward projects each aux state into the draft fc's fp32
        # accumulator as the target taps it (DFlashDraftModel.new_streamed_projection)
        self.streamed_aux: StreamedAux | None = None
        if server_args.speculative_dflash_aux_projection == "streamed":
            self.streamed_aux = StreamedAux(draft_runner.model.fc.out_features,
                                            draft_runner.model.new_streamed_projection)
        self._staged_logged = False
        draft_runner.model.set_target_modules(
            self.target_runner.model.get_input_embeddings(), self.target_runner.model.lm_head_weight
        )
        self.block_size = b = self._num_verify_tokens(server_args, dc)
        self.mask_token_id = dc.mask_token_id
        self.tokens_per_req = b
        self.propose: Proposer = self._graph_proposals
        # Called after each step's aux rows (or streamed accumulator) are consumed (tests poison
        # the storage here).
        self.on_aux_consumed: Callable[[], None] | None = None
        device = self.target_runner.device
        # a batch never exceeds the running limit, but a padded graph may
        rows = max([server_args.max_running_requests, *(server_args.cuda_graph_bs_decode or [])])
        self.sampling_rows = SamplingRows(rows, target_config.hf_config.vocab_size, device)
        self.penalty_rows = PenaltyRows(rows, target_config.hf_config.vocab_size, device)
        self.readback = HostReadback(device)
        self._init_step_storage(rows, vocab, device)
        block = ForwardMode.DRAFT_BLOCK
        # What the target's verify forwards run besides the model, inside their graphs
        # (bench_graph_memory.py captures them too): the prologue (`[anchor, drafts]` from
        # `_drafts`), the commit + acceptance epilogue and its rejection-sampling tail, the
        # streamed projection.
        self.verify_parts = self._verify_parts()
        forwards = [self.verify_parts,
                    # prefills commit the prompt's draft context in their own forward
                    ForwardParts(ForwardMode.EXTEND,
                                 epilogue=Epilogue(ForwardMode.EXTEND, self._prefill_epilogue),
                                 streamed_aux=self.streamed_aux,
                                 staged_from_tokens=self._staged_from_tokens())]
        if server_args.enable_mixed_chunk:
            # Verify steps that carry arrivals' prefills: the commit covers both, greedy
            # acceptance the step rows; the rejection tail runs after (`mixed`).
            mixed = ForwardMode.MIXED
            forwards.append(ForwardParts(mixed, b, self.verify_parts.prologue,
                                         Epilogue(mixed, self._mixed_epilogue),
                                         self.streamed_aux))
        self.target_runner.init_forwards(*forwards)
        draft_runner.init_forwards(ForwardParts(
            block, self.draft_width, StepPrologue(fill_token_id=self.mask_token_id),
            Epilogue(block, self._draft_epilogue, self._draft_sampling)))

    def _num_verify_tokens(self, server_args: ServerArgs, dc: DFlashConfig) -> int:
        """Tokens a request verifies per step: DFlash's block, `[anchor, B-1 drafts]`."""
        return server_args.speculative_num_draft_tokens or dc.block_size

    @property
    def draft_width(self) -> int:
        """Tokens per request of a draft forward: DFlash drafts over the verify block."""
        return self.block_size

    def _init_step_storage(self, rows: int, vocab: int, device: torch.device) -> None:
        """The epilogues' outputs, row prefixes per batch; borrowed until the runner's next
        forward."""
        b = self.block_size
        self._drafts = torch.zeros((rows, b - 1), dtype=torch.int64, device=device)
        # what sampled drafts were drawn from, `[rows, B, vocab]`, for the rejection test:
        # offsets 1..B-1 (`_draft_q`); offset 0, the anchor's, is kept so that the draft
        # forward's logits rows go in whole, without a `[bs * (B-1), vocab]` copy
        self._draft_probs = torch.zeros((rows, b, vocab), dtype=torch.float32, device=device)
        # `[rows, 1 + B]` per step request: accepted drafts, then the new tokens; a mixed
        # step's readback adds its arrivals' first tokens in the rows after (`mixed`)
        self._verdicts = torch.zeros((rows, b + 1), dtype=torch.int64, device=device)
        # compact verify: each proposal's confidence, and a ragged step's per-token lengths
        # and request rows (at most every request's whole block)
        self._confidence = torch.zeros((rows, b - 1), dtype=torch.float32, device=device)
        self._verify_lens = torch.zeros(rows * b, dtype=torch.int64, device=device)
        self._request_rows = torch.zeros(rows * b, dtype=torch.int64, device=device)

    def _draft_q(self, bs: int) -> torch.Tensor:
        """The distributions `bs` requests' drafts were drawn from, `[bs, B-1, vocab]` (a view
        of `_draft_probs`)."""
        return self._draft_probs[:bs, 1:]

    def _verify_parts(self) -> ForwardParts:
        verify = ForwardMode.TARGET_VERIFY
        epilogue = Epilogue(verify, self._verify_epilogue, self._verify_sampling)
        if not self.compact:
            return ForwardParts(verify, self.block_size,
                                StepPrologue(block_tokens=lambda bs: self._drafts[:bs]),
                                epilogue, self.streamed_aux)
        prologue = RaggedStepPrologue(block_tokens=lambda n: self._drafts[:n],
                                      lens=lambda n: self._verify_lens[:n],
                                      request_rows=lambda n: self._request_rows[:n])
        return ForwardParts(verify, self.block_size, prologue, epilogue, self.streamed_aux,
                            ragged=True)

    @property
    def model_runner(self) -> ModelRunner:
        """The runner whose request rows and KV slots the scheduler manages."""
        return self.target_runner

    def prefill(self, reqs: list[Req]) -> PendingStep:
        self._write_rows(reqs)
        logprobs = StepLogprobs.of(reqs, prefill=True)
        inputs = extend_inputs(self.target_runner, reqs)
        if logprobs is not None and logprobs.needs_hidden:
            inputs = dataclasses.replace(inputs, capture_hidden_mode=CaptureHiddenMode.FULL)
        fb = self.target_runner.prepare(self._with_projection(inputs))
        out = self.target_runner.forward(fb)  # its epilogue committed the draft context
        tokens = self._sample(out.next_token_logits, reqs, fb.req_pool_indices,
                                    fb.seq_lens)
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
        runner.forward(runner.prepare(self._with_projection(
            extend_inputs(runner, [req], chunk=num_tokens))))
        if self.on_aux_consumed is not None:
            self.on_aux_consumed()

    def _with_projection(self, inputs: ForwardInputs) -> ForwardInputs:
        """A prefill's inputs with the staged MXFP8 fc input when it is large enough
        (streamed: the runner feeds its own projection)."""
        if self.streamed_aux is not None:
            return inputs
        return dataclasses.replace(
            inputs, aux_projection=self._staged_projection_for(len(inputs.ids)))

    def decode(self, reqs: list[Req]) -> PendingStep:
        bs, b = len(reqs), self.block_size
        has_sampling = self._draft(reqs)
        token_bitmask = self._block_bitmask(reqs)
        processed = token_bitmask is not None or any(r.sampling_params.processes_logits
                                                     for r in reqs)
        logprobs = StepLogprobs.of(reqs, b)
        # `[anchor, drafts]` per request: the verify prologue reads `_drafts` itself
        inputs = step_inputs(reqs, ForwardMode.TARGET_VERIFY, b)
        if self.compact:
            # A step whose logits are processed, grammar-restricted or scored verifies every
            # token, request-major (the static rows), so they apply row by row.
            inputs = self._ragged_inputs(inputs, every_token=processed or logprobs is not None)
        verify_fb = self.target_runner.prepare(inputs)
        verify_fb.has_sampling = has_sampling
        # The graph (or the eager forward) commits the draft context and leaves the verdicts.
        out = self.target_runner.forward(verify_fb)
        if self.on_aux_consumed is not None:
            self.on_aux_consumed()
        rows = self._request_rows[:bs] if self.compact else verify_fb.req_pool_indices
        logits = out.next_token_logits[: bs * b]  # static rows wherever they are read
        if processed:
            self._verify_processed(reqs, rows, logits, has_sampling, token_bitmask)
        verdicts = self._verdicts[:bs]  # [bs, 1 + B]: accepted drafts, then the new tokens
        added = verdicts[:, 0] + 1
        self.target_runner.req_to_token_pool.advance_rows(
            rows, added, verdicts.gather(1, added[:, None])[:, 0])
        readback = verdicts
        if self.compact:  # then the tokens each request verified
            readback = torch.cat([verdicts, self._verify_lens[:bs, None]], dim=1)
        if logprobs is not None:
            # block position j's target row scores the token emitted there: the verify
            # logits (borrowed until the next forward) are read before any other forward
            readback = logprobs.pack(readback, logits, verdicts[:, 1:])
        return PendingStep(reqs, self.readback.start(readback), self._verified, kv_growth=b,
                           logprobs=logprobs)

    def _ragged_inputs(self, inputs: ForwardInputs, every_token: bool) -> ForwardInputs:
        """A compact verify step's inputs: `_plan_verify`'s token count, token-major, the
        requests' rows first; each token's length bounded by its request's bound plus the
        block."""
        bs = len(inputs.step_rows)
        n = self._plan_verify(bs, every_token)
        bound = max(inputs.step_kv_bounds) + self.block_size - 1
        return dataclasses.replace(
            inputs, step_rows=inputs.step_rows + [PADDING_REQ_ROW] * (n - bs),
            step_kv_bounds=[bound] * n)

    def _plan_verify(self, bs: int, every_token: bool) -> int:
        """Each request's verify length into `_verify_lens[:bs]` (0 after, up to the step's
        tokens) and the step's token count: the captured bucket holding the budget, or
        exactly the budget where no graph does (an eager step). No host sync: the lengths
        stay on the device."""
        b = self.block_size
        drafts = b - 1
        if every_token:
            take = bs * drafts
        elif self.max_verify_tokens is not None:
            take = min(bs * drafts, max(0, self.max_verify_tokens - bs))
        else:
            take = min(bs * drafts, round(self.budget_frac * bs * drafts))
        graphs = self.target_runner.step_graphs
        buckets = [x.step_bs for x in graphs.layouts] if graphs is not None else []
        if not buckets or bs + take > buckets[-1]:
            buckets = [bs + take]
        if every_token:
            lens = torch.full((bs,), b, dtype=torch.int64, device=self._verify_lens.device)
            n = round_up_to_bucket(bs + take, buckets)
        else:
            if self.align_to_bucket:
                take = min(round_up_to_bucket(bs + take, buckets) - bs, bs * drafts)
            plan = compact_verify_lens(self._confidence[:bs], take, buckets)
            lens, n = plan.verify_lens, plan.num_tokens
        self._verify_lens[:n].zero_()
        self._verify_lens[:bs] = lens
        return n

    def mixed(self, reqs: list[Req], arrivals: list[Req],
              chunk: int | None = None) -> list[PendingStep]:
        """A verify step of `reqs` and the prefill of `arrivals` in one target forward
        (MIXED): drafts as `decode`, then one forward whose epilogue commits the draft context
        of every token (block rows and prompts) and accepts greedily; one readback, shared by
        the two steps it returns. With `chunk`, `arrivals` is the one chunked request and the
        forward runs (and commits the draft context of) its next `chunk` prompt tokens, not
        its last: nothing is sampled for it and only the verify step comes back."""
        bs, b = len(reqs), self.block_size
        n = 0 if chunk is not None else len(arrivals)  # arrivals sampled
        if n:  # a chunked request's rows are staged once, for its last chunk
            self._write_rows(arrivals)
        has_sampling = self._draft(reqs)
        fb = self.target_runner.prepare(mixed_inputs(self.target_runner, reqs, arrivals, b,
                                                     chunk))
        out = self.target_runner.forward(fb)
        if self.on_aux_consumed is not None:
            self.on_aux_consumed()
        step_tokens, sb = bs * b, fb.mixed_step_bs
        logits = out.next_token_logits
        if any(r.sampling_params.processes_logits for r in reqs):
            self._verify_processed(reqs, fb.req_pool_indices[:bs], logits[:step_tokens],
                                   has_sampling)
        elif has_sampling:
            self._rejection_sample(bs, fb.input_ids[:step_tokens].view(bs, b)[:, 1:],
                                   fb.positions[:step_tokens].view(bs, b),
                                   fb.req_pool_indices[:bs], logits[:step_tokens])
        verdicts = self._verdicts[:bs]
        added = verdicts[:, 0] + 1
        pool = self.target_runner.req_to_token_pool
        pool.advance_rows(fb.req_pool_indices[:bs], added,
                          verdicts.gather(1, added[:, None])[:, 0])
        if not n:
            return [PendingStep(reqs, self.readback.start(verdicts), self._verified,
                                kv_growth=b)]
        rows, seq_lens = fb.req_pool_indices[sb : sb + n], fb.seq_lens[sb : sb + n]
        first = self._sample(logits[step_tokens : step_tokens + n], arrivals, rows,
                                   seq_lens)
        pool.set_rows(rows, seq_lens, first)
        # One readback of both halves: each arrival's first token leads a row after the
        # verdicts (rows a padded step's unread verdicts may hold; every request holds its own
        # request row, so bs + n rows fit)
        self._verdicts[bs : bs + n, 0] = first
        copy = self.readback.start(self._verdicts[: bs + n])
        return [PendingStep(reqs, PendingRows(copy, 0, bs), self._verified, kv_growth=b),
                PendingStep(arrivals, PendingRows(copy, bs, bs + n), _first_of_row,
                            kv_growth=0)]


    def _verify_processed(self, reqs: list[Req], rows: torch.Tensor, logits: torch.Tensor,
                          has_sampling: bool, token_bitmask: torch.Tensor | None = None) -> None:
        """`_verdicts[:bs]` again, from the verify logits processed (penalties,
        min_new_tokens, min-p) as target-only decoding would after each block position's
        drafts, and restricted to what each position's grammar mask allows (`token_bitmask`
        `[bs * B, words]`, `_block_bitmask`), so greedy acceptance and rejection sampling use
        the target-only distribution (the graph accepted against the raw logits); then the
        emitted tokens are counted. Runs before the rows' kv_len advances: block position j
        sits at kv_len + j."""
        bs, b = len(reqs), self.block_size
        drafts = self._drafts[:bs]
        penalized = any(r.sampling_params.processes_logits for r in reqs)
        processed = (self.penalty_rows.apply(logits, rows, drafts) if penalized
                     else logits.to(torch.float32, copy=True))
        if token_bitmask is not None:
            apply_token_bitmask(processed, token_bitmask)
        self._accept_greedy(bs, drafts, processed)
        if has_sampling:
            kv_lens = self.target_runner.req_to_token_pool.kv_lens[rows]
            positions = kv_lens[:, None] + torch.arange(b, device=kv_lens.device)
            self._rejection_sample(bs, drafts, positions, rows, processed, min_p=penalized)
        if penalized:
            verdicts = self._verdicts[:bs]
            self.penalty_rows.advance(rows, verdicts[:, 1:], verdicts[:, 0] + 1)

    def _block_bitmask(self, reqs: list[Req]) -> torch.Tensor | None:
        """The grammar masks of every block position (`RequestGrammar.fill_block`) on the
        device, None when no request has a grammar. Walking the matchers along the drafts
        needs them on the host: one readback, in grammar batches only."""
        if all(r.grammar is None for r in reqs):
            return None
        # the step's second host sync, grammar batches only: xgrammar's matchers walk on the host
        return self._token_bitmask(reqs, self._drafts[: len(reqs)].tolist())

    def _draft(self, reqs: list[Req]) -> bool:
        """The draft block's proposals for `reqs` into `_drafts[:bs]`; whether a request
        samples (known on the host: only then do the epilogues' sampling steps run)."""
        has_sampling = not all(r.sampling_params.is_greedy for r in reqs)
        draft_fb = self.draft_runner.prepare(step_inputs(reqs, ForwardMode.DRAFT_BLOCK,
                                                         self.draft_width))
        draft_fb.has_sampling = has_sampling
        self.draft_runner.forward(draft_fb)  # proposals in `_drafts[:bs]`
        drafts = self.propose(reqs, draft_fb)
        if drafts.data_ptr() != self._drafts.data_ptr():  # a proposer with its own storage
            self._drafts[: len(reqs)].copy_(drafts)
        return has_sampling

    def _verified(self, req: Req, row: list[int]) -> list[int]:
        """One request's verdict row (compact: then the tokens it verified): the anchor and
        the accepted drafts are now KV."""
        req.kv_len += row[0] + 1
        req.record_spec_verify(row[0], self.block_size,
                               row[-1] if self.compact else self.block_size)
        return row[1 : row[0] + 2]

    def _block_index(self, n: int, r: int) -> torch.Tensor:
        """`[r, B]`: the token rows of the first `r` requests' blocks in a ragged forward of
        `n` tokens (rows past a request's length repeat a valid row, never read)."""
        lens = self._verify_lens[:n]
        starts = lens.cumsum(0) - lens
        offsets = torch.arange(self.block_size, device=lens.device)
        return (starts[:r, None] + offsets).clamp_max_(n - 1)

    def commit_draft_context(self, aux: torch.Tensor | AuxProjection, positions: torch.Tensor,
                             out_cache_loc: torch.Tensor) -> None:
        """Draft context K/V of the tokens at `positions`, from their aux rows `[N, K * H]` or
        from the projection the forward fed (its `result()` is the fc output `[N, H_draft]`),
        into the draft KV cache at `out_cache_loc`: the one commit of graph and eager paths."""
        draft, pool = self.draft_runner.model, self.draft_runner.token_to_kv_pool
        if isinstance(aux, torch.Tensor):
            draft.write_context_kv(aux, positions, out_cache_loc, pool)
        else:
            draft.write_projected_context_kv(aux.result(), positions, out_cache_loc, pool)

    def _prefill_epilogue(self, fb: ForwardBatch, out: LogitsProcessorOutput) -> None:
        """After every target prefill, inside its graph when one replays: the prompt's draft
        context from the aux rows (or projection) the forward just wrote."""
        self.commit_draft_context(_aux_of(fb, out), fb.positions, fb.out_cache_loc)

    def _verify_epilogue(self, fb: ForwardBatch, out: LogitsProcessorOutput) -> None:
        """Inside the TARGET_VERIFY graph: consume the aux rows (or the streamed projection)
        the forward just wrote, and accept greedily (`_verdicts[:bs]`)."""
        self.commit_draft_context(_aux_of(fb, out), fb.positions, fb.out_cache_loc)
        self._accept_verified(fb, out)

    def _accept_verified(self, fb: ForwardBatch, out: LogitsProcessorOutput) -> None:
        """Greedy acceptance of a verify forward's blocks into `_verdicts`; a ragged (compact)
        forward's requests accept at most their verified drafts."""
        if not self.compact:
            bs = fb.batch_size
            self._accept_greedy(bs, fb.input_ids.view(bs, -1)[:, 1:], out.next_token_logits)
            return
        n = fb.batch_size
        r = min(n, self._drafts.shape[0])  # every request holds a token: at most n
        target_argmax = out.next_token_logits.argmax(-1)[self._block_index(n, r)]
        self._verdicts[:r] = greedy_verify(self._drafts[:r], target_argmax,
                                           self._verify_lens[:r]).packed()

    def _mixed_epilogue(self, fb: ForwardBatch, out: LogitsProcessorOutput) -> None:
        """Inside the MIXED graph: the draft context of every token (step blocks and
        prompts), then greedy acceptance of the leading step rows (a graph's padded step
        requests get verdicts nobody reads)."""
        self.commit_draft_context(_aux_of(fb, out), fb.positions, fb.out_cache_loc)
        bs = fb.mixed_step_bs
        n = bs * self.block_size
        self._accept_greedy(bs, fb.input_ids[:n].view(bs, -1)[:, 1:], out.next_token_logits[:n])

    def _accept_greedy(self, bs: int, drafts: torch.Tensor, logits: torch.Tensor) -> None:
        """`_verdicts[:bs]` from `bs` blocks' drafts `[bs, B-1]` and their logits rows."""
        target_argmax = logits.view(bs, self.block_size, -1).argmax(-1)
        self._verdicts[:bs] = greedy_verify(drafts, target_argmax).packed()
        broadcast_from_first_rank(self._verdicts[:bs])  # rank 0 decides: ranks cannot diverge

    def _verify_sampling(self, fb: ForwardBatch, out: LogitsProcessorOutput) -> None:
        """The TARGET_VERIFY sampling tail (`_rejection_sample`)."""
        if not self.compact:
            bs = fb.batch_size
            self._rejection_sample(bs, fb.input_ids.view(bs, -1)[:, 1:],
                                   fb.positions.view(bs, -1), fb.req_pool_indices,
                                   out.next_token_logits)
            return
        n = fb.batch_size
        r = min(n, self._drafts.shape[0])
        index = self._block_index(n, r)
        self._rejection_sample(r, self._drafts[:r], fb.positions[index],
                               self._request_rows[:r], out.next_token_logits[index.flatten()],
                               num_verified=self._verify_lens[:r])

    def _rejection_sample(self, bs: int, drafts: torch.Tensor, positions: torch.Tensor,
                          rows: torch.Tensor, logits: torch.Tensor, min_p: bool = False,
                          num_verified: torch.Tensor | None = None) -> None:
        """Lossless rejection sampling of `bs` blocks' drafts `[bs, B-1]` (block positions
        `[bs, B]`, logits `[bs * B, vocab]`) against `_draft_q(bs)`; greedy requests keep
        their greedy verdicts. `min_p`: a request may set it (known on the host);
        `num_verified` `[bs]`: block tokens each request verified (`rejection_verify`)."""
        b = self.block_size
        params = self.sampling_rows.gather(rows, min_p)
        p = sampling_probs(logits, params.repeat_interleave(b)).view(bs, b, -1)
        seed = params.seed[:, None]
        sampled = rejection_verify(drafts, self._draft_q(bs), p,
                                   uniform(seed, positions[:, 1:], Lane.ACCEPT),
                                   uniform(seed, positions + 1, Lane.RESIDUAL),
                                   num_verified).packed()
        verdicts = self._verdicts[:bs]
        broadcast_from_first_rank(verdicts.copy_(torch.where(params.is_greedy[:, None],
                                                             verdicts, sampled)))

    def _graph_proposals(self, reqs: list[Req], _fb: ForwardBatch) -> torch.Tensor:
        return self._drafts[: len(reqs)]

    def _draft_epilogue(self, fb: ForwardBatch, out: LogitsProcessorOutput) -> None:
        """Inside the DRAFT_BLOCK graph: block offsets 1..B-1 propose the tokens at those
        offsets (no shift); greedy proposals land in `_drafts[:bs]`."""
        bs, b = fb.batch_size, self.block_size
        logits = out.next_token_logits.view(bs, b, -1)[:, 1:]
        self._drafts[:bs] = logits.argmax(-1)
        broadcast_from_first_rank(self._drafts[:bs])
        if self.compact:
            max_probability(logits, self._confidence[:bs])

    def _draft_sampling(self, fb: ForwardBatch, out: LogitsProcessorOutput) -> None:
        """The DRAFT_BLOCK sampling tail: sampled requests draw their proposals instead, from
        the distributions it leaves in `_draft_q(bs)`."""
        bs, b = fb.batch_size, self.block_size
        params = self.sampling_rows.gather(fb.req_pool_indices)
        # every block row, the anchor's too: the logits go in as the forward left them
        sampling_probs(out.next_token_logits[: bs * b], params.repeat_interleave(b),
                       out=self._draft_probs[:bs].view(bs * b, -1))
        positions = fb.positions.view(bs, b)[:, 1:]
        drawn = sample_from_probs(self._draft_q(bs),
                                  uniform(params.seed[:, None], positions, Lane.DRAFT))
        drafts = self._drafts[:bs]
        broadcast_from_first_rank(drafts.copy_(torch.where(params.is_greedy[:, None], drafts,
                                                           drawn)))

    def _staged_from_tokens(self) -> int | None:
        """The prefill size from which the staged MXFP8 fc input replaces packed aux rows;
        None when it never does (a bf16 fc, a target without the staged path, streamed)."""
        if (self.streamed_aux is not None or not self.draft_runner.model.fc_is_mxfp8
                or not self.target_runner.model.supports_staged_aux_projection):
            return None
        return self.staged_min_tokens

    def _staged_projection_for(self, num_tokens: int):
        """A staged MXFP8 fc input for a large prefill, else None (list + concat path)."""
        start = self._staged_from_tokens()
        if start is None or num_tokens < start:
            return None
        acc = self.draft_runner.model.new_staged_projection(
            num_tokens, self.target_runner.model_config.dtype)
        if not self._staged_logged:
            self._staged_logged = True
            logger.info("Staged MXFP8 aux projection active: %d tokens, width %d, %d slices",
                        num_tokens, acc.hidden_size * acc.num_slices, acc.num_slices)
        return acc


def _first_token(_req: Req, token: int) -> list[int]:
    return [token]


def _first_of_row(_req: Req, row: list[int]) -> list[int]:
    """An arrival's row of a mixed step's readback: its first token leads."""
    return [row[0]]


def _aux_of(fb: ForwardBatch, out: LogitsProcessorOutput) -> torch.Tensor | AuxProjection:
    """What a target forward left for the draft commit: its projection, else its packed rows."""
    return fb.aux_projection if fb.aux_projection is not None else out.aux_hidden_states
