"""DFlash speculative decoding: a target runner and a draft runner sharing KV slots.

Per decode step and batch: (1) the draft proposes B-1 tokens per request from
`[anchor, MASK x (B-1)]`; (2) the target verifies `[anchor, drafts]` (its TARGET_VERIFY graph
writes the packed aux states into the runner's shared buffer); (3) the longest acceptable
prefix is kept; (4) the accepted rows' aux states become draft context K/V, and the KV slots
of rejected positions go back, all before the next target forward can overwrite the buffer.
"""

from __future__ import annotations

import logging
from collections.abc import Callable

import torch

from sglang_aux.srt.configs.model_config import ModelConfig
from sglang_aux.srt.managers.schedule_batch import (
    Req,
    alloc_tokens,
    build_extend_batch,
    build_fixed_batch,
)
from sglang_aux.srt.model_executor.forward_batch_info import ForwardMode
from sglang_aux.srt.model_executor.model_runner import ModelRunner
from sglang_aux.srt.sampling.sampler import sample, sampling_probs
from sglang_aux.srt.server_args import ServerArgs
from sglang_aux.srt.speculative.dflash_info import BlockVerdict, greedy_verify, rejection_verify
from sglang_aux.srt.speculative.dflash_utils import DFlashConfig

logger = logging.getLogger(__name__)

# (requests, draft logits `[bs * B, vocab]`) -> (B-1 drafts per request, their distributions
# `[B-1, vocab]` per request, or None for greedy requests)
Proposer = Callable[[list[Req], torch.Tensor], tuple[list[list[int]], list[torch.Tensor | None]]]


class DFlashWorker:
    def __init__(self, target_config: ModelConfig, draft_config: ModelConfig,
                 server_args: ServerArgs, token_to_id: Callable[[str], int | None] | None = None):
        dc = DFlashConfig.from_hf_config(draft_config.hf_config, token_to_id=token_to_id,
                                         num_target_layers=target_config.num_layers)
        draft_config.hf_config.dflash_config = dc.as_dflash_config()  # the draft reads it whole
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
        # streamed: prefills project each aux state into the draft fc's fp32 accumulator as the
        # target taps it (DFlashDraftModel.new_streamed_projection); verify graphs stay packed
        # until the GPU step loop commits draft context inside the graph.
        self.streamed_aux = server_args.speculative_dflash_aux_projection == "streamed"
        self._staged_logged = False
        draft_runner.model.set_target_modules(
            self.target_runner.model.get_input_embeddings(), self.target_runner.model.lm_head_weight
        )
        self.block_size = server_args.speculative_num_draft_tokens or dc.block_size
        self.mask_token_id = dc.mask_token_id
        self.tokens_per_step = self.block_size
        self.propose: Proposer = self._draft_propose
        # Called after each step's aux rows are consumed (tests poison the buffer here).
        self.on_aux_consumed: Callable[[], None] | None = None
        self.target_runner.init_decode_graphs(ForwardMode.TARGET_VERIFY, self.block_size)
        draft_runner.init_decode_graphs(ForwardMode.DRAFT_BLOCK, self.block_size)

    @property
    def model_runner(self) -> ModelRunner:
        """The runner whose request rows and KV slots the scheduler manages."""
        return self.target_runner

    def prefill(self, reqs: list[Req]) -> list[list[int]]:
        fb = build_extend_batch(self.target_runner, reqs)
        fb.aux_projection = (self.draft_runner.model.new_streamed_projection(
            fb.num_tokens, self.target_runner.model_config.dtype) if self.streamed_aux
            else self._staged_projection_for(fb.num_tokens))
        out = self.target_runner.forward(fb)
        if fb.aux_projection is not None:
            self.draft_runner.model.write_projected_context_kv(
                fb.aux_projection.result(), fb.positions, fb.out_cache_loc,
                self.draft_runner.token_to_kv_pool)
        else:
            self._write_draft_context(out.aux_hidden_states, fb.positions, fb.out_cache_loc)
        tokens = sample(out.next_token_logits, [r.sampling_params for r in reqs],
                        [r.generator for r in reqs])
        return [[t] for t in tokens]

    def decode(self, reqs: list[Req]) -> list[list[int]]:
        b = self.block_size
        starts = [r.kv_len for r in reqs]
        locs = torch.cat([alloc_tokens(self.target_runner, r, b) for r in reqs])
        block_ids = [t for r in reqs for t in [r.last_token] + [self.mask_token_id] * (b - 1)]
        draft_fb = build_fixed_batch(self.draft_runner, reqs, ForwardMode.DRAFT_BLOCK,
                                     block_ids, locs, starts)
        drafts, draft_probs = self.propose(reqs, self.draft_runner.forward(draft_fb)
                                           .next_token_logits)
        verify_ids = [t for r, d in zip(reqs, drafts, strict=True) for t in [r.last_token, *d]]
        verify_fb = build_fixed_batch(self.target_runner, reqs, ForwardMode.TARGET_VERIFY,
                                      verify_ids, locs, starts)
        # Borrowed from the target's graph: valid until its next replay.
        out = self.target_runner.forward(verify_fb)
        verdicts = self._verify(reqs, drafts, draft_probs, out.next_token_logits)
        keep = torch.zeros(len(locs), dtype=torch.bool)
        for i, v in enumerate(verdicts):
            keep[i * b : i * b + v.accepted + 1] = True
        keep = keep.to(locs.device)
        self._write_draft_context(out.aux_hidden_states[keep], verify_fb.positions[keep],
                                  locs[keep])
        if self.on_aux_consumed is not None:
            self.on_aux_consumed()
        self.target_runner.token_to_kv_pool_allocator.free(locs[~keep])
        for r, v in zip(reqs, verdicts, strict=True):
            r.kv_len += v.accepted + 1
            r.record_spec_verify(v.accepted, b)
        return [v.tokens for v in verdicts]

    def _staged_projection_for(self, num_tokens: int):
        """A staged MXFP8 fc input for a large prefill, else None (list + concat path)."""
        draft, target = self.draft_runner.model, self.target_runner.model
        if (num_tokens < self.staged_min_tokens or not draft.fc_is_mxfp8
                or not target.supports_staged_aux_projection):
            return None
        acc = draft.new_staged_projection(num_tokens, self.target_runner.model_config.dtype)
        if not self._staged_logged:
            self._staged_logged = True
            logger.info("Staged MXFP8 aux projection active: %d tokens, width %d, %d slices",
                        num_tokens, acc.hidden_size * acc.num_slices, acc.num_slices)
        return acc

    def _write_draft_context(self, aux: torch.Tensor, positions: torch.Tensor,
                             locs: torch.Tensor) -> None:
        self.draft_runner.model.write_context_kv(aux, positions, locs,
                                                 self.draft_runner.token_to_kv_pool)

    def _draft_propose(self, reqs: list[Req], logits: torch.Tensor):
        """Block offsets 1..B-1 propose the tokens at those offsets (no shift)."""
        logits = logits.view(len(reqs), self.block_size, -1)[:, 1:]
        greedy = logits.argmax(-1).tolist()
        drafts, probs = [], []
        for i, r in enumerate(reqs):
            if r.sampling_params.is_greedy:
                drafts.append(greedy[i])
                probs.append(None)
                continue
            q = sampling_probs(logits[i], r.sampling_params).cpu()  # [B-1, vocab]
            drafts.append(torch.multinomial(q, 1, generator=r.generator).squeeze(1).tolist())
            probs.append(q)
        return drafts, probs

    def _verify(self, reqs: list[Req], drafts: list[list[int]],
                draft_probs: list[torch.Tensor | None], logits: torch.Tensor
                ) -> list[BlockVerdict]:
        logits = logits.view(len(reqs), self.block_size, -1)
        target_argmax = logits.argmax(-1).tolist()
        verdicts = []
        for i, r in enumerate(reqs):
            if r.sampling_params.is_greedy:
                verdicts.append(greedy_verify(drafts[i], target_argmax[i]))
                continue
            q = draft_probs[i]
            if q is None:  # an external proposer without distributions: a point mass
                q = torch.zeros(self.block_size - 1, logits.shape[-1])
                q[torch.arange(self.block_size - 1), torch.tensor(drafts[i])] = 1.0
            p = sampling_probs(logits[i], r.sampling_params).cpu()
            verdicts.append(rejection_verify(drafts[i], q, p, r.generator))
        return verdicts
