"""The draft's context: K/V the draft reads for every committed target token, made from the
target's aux states, and which aux projection a target forward feeds to make them.

Three paths (`--speculative-dflash-aux-projection`, docs/aux_buffer.md):
- packed: the forward writes `[T, K * H]` aux rows (the runner's one aux storage under a
  graph), and the commit runs the draft fc over them;
- staged: a large eager prefill with an MXFP8 fc quantizes each aux state into the fc's MXFP8
  input as the target produces it (`new_staged_projection`), from
  `--dflash-staged-projection-min-tokens` on;
- streamed: every target forward projects each aux state into the fc's fp32 accumulator as it
  is tapped (`new_streamed_projection`): no `[T, K * H]` tensor at all.
Whatever the path, the commit runs in the epilogue of the forward that wrote it, inside its
graph when one replays: the aux storage is consumed before the next target forward.
"""

from __future__ import annotations

import dataclasses
import logging

import torch

from sglang_aux.srt.forward_state.forward_batch_info import AuxProjection, ForwardBatch
from sglang_aux.srt.layers.logits_processor import LogitsProcessorOutput
from sglang_aux.srt.layers.quantization.staged_input import MXFP8InputAccumulator
from sglang_aux.srt.model_executor.model_runner import ModelRunner
from sglang_aux.srt.model_executor.runner.forward_layout import ForwardInputs
from sglang_aux.srt.model_executor.runner.forward_parts import StreamedAux
from sglang_aux.srt.server_args import ServerArgs

logger = logging.getLogger(__name__)


class DraftContext:
    def __init__(self, target_runner: ModelRunner, draft_runner: ModelRunner,
                 server_args: ServerArgs):
        self.target_runner, self.draft_runner = target_runner, draft_runner
        draft = draft_runner.model
        fc_quant = (server_args.speculative_draft_fc_quantization
                    or getattr(draft_runner.model_config.hf_config, "quantization", None)
                    or "none")
        if fc_quant == "mxfp8":
            draft.quantize_fc_mxfp8()
        self.staged_min_tokens = server_args.dflash_staged_projection_min_tokens
        # set: every target forward projects each aux state into the draft fc's fp32
        # accumulator as the target taps it
        self.streamed_aux: StreamedAux | None = None
        if server_args.speculative_dflash_aux_projection == "streamed":
            self.streamed_aux = StreamedAux(draft.fc.out_features,
                                            draft.new_streamed_projection)
        self._staged_logged = False

    def commit(self, aux: torch.Tensor | AuxProjection, positions: torch.Tensor,
               out_cache_loc: torch.Tensor) -> None:
        """Draft context K/V of the tokens at `positions`, from their aux rows `[N, K * H]` or
        from the projection the forward fed (its `result()` is the fc output `[N, H_draft]`),
        into the draft KV cache at `out_cache_loc`: the one commit of graph and eager paths."""
        draft, pool = self.draft_runner.model, self.draft_runner.token_to_kv_pool
        if isinstance(aux, torch.Tensor):
            draft.write_context_kv(aux, positions, out_cache_loc, pool)
        else:
            draft.write_projected_context_kv(aux.result(), positions, out_cache_loc, pool)

    def commit_forward(self, fb: ForwardBatch, out: LogitsProcessorOutput) -> None:
        """The draft context of every token of a target forward, from what it just left for
        the draft: its projection, else its packed aux rows."""
        aux = fb.aux_projection if fb.aux_projection is not None else out.aux_hidden_states
        self.commit(aux, fb.positions, fb.out_cache_loc)

    def prefill_epilogue(self, fb: ForwardBatch, out: LogitsProcessorOutput) -> None:
        """After every target prefill, inside its graph when one replays: the prompt's draft
        context from the aux rows (or projection) the forward just wrote."""
        self.commit_forward(fb, out)

    def staged_from_tokens(self) -> int | None:
        """The prefill size from which the staged MXFP8 fc input replaces packed aux rows;
        None when it never does (a bf16 fc, a target without the staged path, streamed)."""
        if (self.streamed_aux is not None or not self.draft_runner.model.fc_is_mxfp8
                or not self.target_runner.model.supports_staged_aux_projection):
            return None
        return self.staged_min_tokens

    def with_projection(self, inputs: ForwardInputs) -> ForwardInputs:
        """A prefill's inputs with the staged MXFP8 fc input when it is large enough
        (streamed: the runner feeds its own projection)."""
        if self.streamed_aux is not None:
            return inputs
        return dataclasses.replace(
            inputs, aux_projection=self.staged_projection_for(len(inputs.ids)))

    def staged_projection_for(self, num_tokens: int) -> MXFP8InputAccumulator | None:
        """A staged MXFP8 fc input for a large prefill, else None (list + concat path)."""
        start = self.staged_from_tokens()
        if start is None or num_tokens < start:
            return None
        acc = self.draft_runner.model.new_staged_projection(
            num_tokens, self.target_runner.model_config.dtype)
        if not self._staged_logged:
            self._staged_logged = True
            logger.info("Staged MXFP8 aux projection active: %d tokens, width %d, %d slices",
                        num_tokens, acc.hidden_size * acc.num_slices, acc.num_slices)
        return acc
