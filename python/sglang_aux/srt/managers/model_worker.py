"""Target-only generation on one ModelRunner: prefill, then one token per decode step."""

from __future__ import annotations

import torch

from sglang_aux.srt.configs.model_config import ModelConfig
from sglang_aux.srt.constrained.request_grammar import batch_bitmask
from sglang_aux.srt.distributed.communication_op import broadcast_from_first_rank
from sglang_aux.srt.forward_state.forward_batch_info import CaptureHiddenMode, ForwardMode
from sglang_aux.srt.managers.pending_step import PendingStep
from sglang_aux.srt.managers.schedule_batch import (
    Req,
    extend_inputs,
    mixed_inputs,
    step_inputs,
)
from sglang_aux.srt.managers.step_logprobs import StepLogprobs, packed_prefill
from sglang_aux.srt.model_executor.model_runner import ModelRunner
from sglang_aux.srt.model_executor.runner.forward_parts import ForwardParts
from sglang_aux.srt.model_executor.runner.step_prologue import StepPrologue
from sglang_aux.srt.model_executor.runner_utils.host_transfer import HostReadback, PendingRows
from sglang_aux.srt.sampling.penalties import PenaltyRows, sample_next_tokens
from sglang_aux.srt.sampling.sampling_rows import SamplingRows
from sglang_aux.srt.server_args import ServerArgs


class RequestRowStaging:
    """A worker's per-request sampling state on the device, staged at admission; the
    target-only and the speculative workers share it."""

    sampling_rows: SamplingRows
    penalty_rows: PenaltyRows

    def admit(self, req: Req, eos_token_ids: set[int] = frozenset()) -> None:
        """Per-request work at admission (its row and KV are reserved): stage its sampling
        parameters (min_new_tokens masks `eos_token_ids` too) for the prefill that runs it."""
        self.sampling_rows.stage(req.req_pool_idx, req.sampling_params, req.seed)
        self.penalty_rows.stage(req.req_pool_idx, req.sampling_params, req.output_ids,
                                eos_token_ids)

    def _write_rows(self, reqs: list[Req]) -> None:
        """Copy the staged rows of `reqs` to the device tables the step reads."""
        rows = [r.req_pool_idx for r in reqs]
        self.sampling_rows.write(rows)
        self.penalty_rows.write(rows)

    def _sample(self, logits: torch.Tensor, reqs: list[Req], rows: torch.Tensor,
                positions: torch.Tensor) -> torch.Tensor:
        """The next token of each request from its logits at `positions` (penalties,
        min_new_tokens, its grammar and its sampling parameters applied); rank 0's under
        tensor parallelism, so ranks cannot diverge."""
        return broadcast_from_first_rank(sample_next_tokens(
            self.sampling_rows, self.penalty_rows, logits, [r.sampling_params for r in reqs],
            rows, positions, self._token_bitmask(reqs)))

    def _token_bitmask(self, reqs: list[Req],
                       drafts: list[list[int]] | None = None) -> torch.Tensor | None:
        """The step's grammar masks (`batch_bitmask`: one row per request, or per block
        position with `drafts`) in one copy to the device; None when no request has a
        grammar. Filled on the host from each matcher's state: the scheduler never leaves a
        step with a grammar request in flight (`Scheduler.step`)."""
        host = batch_bitmask([r.grammar for r in reqs], self.sampling_rows.vocab_size, drafts)
        if host is None:
            return None
        device = self.sampling_rows.device
        if device.type == "cuda":  # pinned and non-blocking: a pageable copy would wait
            return host.pin_memory().to(device, non_blocking=True)
        return host.to(device)


class ModelWorker(RequestRowStaging):
    """The scheduler's `Worker` without speculation: one ModelRunner, one token per request per
    step (SGLang's `ModelWorker`; under tensor parallelism each rank runs one, on its shard).
    `prefill` and `decode` launch a step and return it pending; its `tokens()` gives each
    request's new tokens, and the scheduler appends them and decides when a request ends.

    A decode step issues no per-request device work: one input copy, the rows
    (`step_inputs`; a graph derives the rest in its prologue from the rows' device
    state), the forward (a graph replay when one fits), sampling on the device, the rows'
    state advanced on the device, one readback queued. A prefill likewise: one input copy, a
    prefill graph when one fits, sampling, the rows' state set, one readback.
    """

    tokens_per_req = 1
    logprob_refusal = None

    def __init__(self, model_config: ModelConfig, server_args: ServerArgs,
                 model_runner: ModelRunner | None = None):
        self.model_runner = runner = model_runner or ModelRunner(model_config, server_args)
        prologue = StepPrologue()
        forwards = [ForwardParts(ForwardMode.DECODE, self.tokens_per_req, prologue),
                    ForwardParts(ForwardMode.EXTEND)]
        if server_args.enable_mixed_chunk:
            forwards.append(ForwardParts(ForwardMode.MIXED, self.tokens_per_req, prologue))
        runner.init_forwards(*forwards)
        self.sampling_rows = SamplingRows(server_args.max_running_requests,
                                          model_config.hf_config.vocab_size, runner.device)
        self.penalty_rows = PenaltyRows(server_args.max_running_requests,
                                        model_config.hf_config.vocab_size, runner.device)
        self.readback = HostReadback(runner.device)

    @property
    def step_stats(self) -> dict[str, int]:
        return {}

    def server_info(self) -> dict:
        return {}

    def prefill(self, reqs: list[Req]) -> PendingStep:
        self._write_rows(reqs)
        logprobs = StepLogprobs.of(reqs, prefill=True)
        hidden = CaptureHiddenMode.FULL if logprobs is not None and logprobs.needs_hidden \
            else CaptureHiddenMode.NULL
        fb = self.model_runner.prepare(extend_inputs(self.model_runner, reqs, hidden))
        out = self.model_runner.forward(fb)
        # the sampled token sits at position seq_len (= kv_len after the prefill)
        tokens = self._sample(out.next_token_logits, reqs, fb.req_pool_indices, fb.seq_lens)
        self.model_runner.req_to_token_pool.set_rows(fb.req_pool_indices, fb.seq_lens, tokens)
        return PendingStep(reqs, self.readback.start(packed_prefill(
            logprobs, tokens, out, fb, self.model_runner.model.lm_head_weight)), _one_token,
            kv_growth=0, logprobs=logprobs)

    def prefill_chunk(self, req: Req, num_tokens: int) -> None:
        """A chunk of `req`'s prompt that is not its last (chunked prefill): the K/V of its
        next `num_tokens` tokens, nothing sampled or read back; its last chunk is a
        `prefill`."""
        runner = self.model_runner
        runner.forward(runner.prepare(extend_inputs(runner, [req], chunk=num_tokens)))

    def decode(self, reqs: list[Req]) -> PendingStep:
        fb = self.model_runner.prepare(step_inputs(reqs, ForwardMode.DECODE, self.tokens_per_req))
        logits = self.model_runner.forward(fb).next_token_logits
        tokens = self._sample(logits, reqs, fb.req_pool_indices, fb.seq_lens)
        self.model_runner.req_to_token_pool.advance_rows(fb.req_pool_indices, 1, tokens)
        logprobs = StepLogprobs.of(reqs)
        readback = tokens if logprobs is None else logprobs.pack(tokens, logits, tokens)
        return PendingStep(reqs, self.readback.start(readback), _decoded, kv_growth=1,
                           logprobs=logprobs)

    def mixed(self, reqs: list[Req], arrivals: list[Req],
              chunk: int | None = None) -> list[PendingStep]:
        """One forward of a decode step of `reqs` and the prefill of `arrivals` (MIXED), one
        readback: the two steps it returns share it. With `chunk`, `arrivals` is the one
        chunked request and the forward runs its next `chunk` prompt tokens, a chunk that is
        not its last: nothing is sampled for it and only the decode step comes back."""
        runner, bs = self.model_runner, len(reqs)
        n = 0 if chunk is not None else len(arrivals)  # arrivals sampled
        if n:  # a chunked request's rows are staged once, for its last chunk
            self._write_rows(arrivals)
        fb = runner.prepare(mixed_inputs(runner, reqs, arrivals, self.tokens_per_req, chunk))
        logits = runner.forward(fb).next_token_logits[: bs + n]  # step rows, then arrivals
        sb = fb.mixed_step_bs
        rows = torch.cat([fb.req_pool_indices[:bs], fb.req_pool_indices[sb : sb + n]])
        # a decode token sits at kv_len + 1, a first token at the prompt's length
        positions = torch.cat([fb.seq_lens[:bs], fb.seq_lens[sb : sb + n]])
        tokens = self._sample(logits, reqs + arrivals[:n], rows, positions)
        runner.req_to_token_pool.advance_rows(rows[:bs], 1, tokens[:bs])
        copy = self.readback.start(tokens)
        steps = [PendingStep(reqs, PendingRows(copy, 0, bs), _decoded, kv_growth=1)]
        if n:
            runner.req_to_token_pool.set_rows(rows[bs:], positions[bs:], tokens[bs:])
            steps.append(PendingStep(arrivals, PendingRows(copy, bs, bs + n), _one_token,
                                     kv_growth=0))
        return steps


def _one_token(_req: Req, token: int) -> list[int]:
    return [token]


def _decoded(req: Req, token: int) -> list[int]:
    req.kv_len += 1  # the step wrote the K/V of the token it consumed
    return [token]
