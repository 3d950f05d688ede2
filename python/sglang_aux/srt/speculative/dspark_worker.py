"""DSpark speculative decoding: the DFlash worker with a sequential Markov proposal and a
confidence head.

Everything DFlash does stays (`DFlashWorker`): the target's prefill commits the draft
context, the TARGET_VERIFY graph writes the packed aux rows into the runner's one aux storage
and consumes them in its epilogue (draft context commit, acceptance), the sampling tail runs
lossless rejection sampling, overlap and mixed steps. What differs:

- The draft block is `[anchor, MASK x (gamma - 1)]` (gamma rows, `draft_width`) and row k
  proposes the token at anchor + k + 1, so a request verifies gamma + 1 tokens (`block_size`).
  The DRAFT_BLOCK graph's epilogue runs the Markov loop (`propose_block`): proposals chosen
  row by row, greedy in the main graph, drawn in the sampling tail (which keeps the
  distributions for the rejection test), and each row's confidence.
- Compact verify (`DFlashWorker`) reads the confidence head's values, which the Markov loop
  writes into `_confidence`; a draft without the head is refused in that mode.
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from sglang_aux.srt.configs.dspark_config import DSparkConfig
from sglang_aux.srt.configs.model_config import ModelConfig
from sglang_aux.srt.forward_state.forward_batch_info import ForwardBatch
from sglang_aux.srt.layers.logits_processor import LogitsProcessorOutput
from sglang_aux.srt.sampling.sampler import SamplingTensors
from sglang_aux.srt.server_args import ServerArgs
from sglang_aux.srt.speculative.dflash_worker import DFlashWorker
from sglang_aux.srt.speculative.dspark_proposal import DSparkProposal, propose_block


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
        if server_args.ragged_verify_mode() == "compact" and not dspark.confidence_head:
            raise ValueError("SGLANG_RAGGED_VERIFY_MODE=compact needs the draft's confidence "
                             "head (its config sets enable_confidence_head false)")
        super().__init__(target_config, draft_config, server_args, token_to_id)

    def _num_verify_tokens(self, server_args, dc) -> int:
        return self.gamma + 1

    @property
    def draft_width(self) -> int:
        """The draft block has gamma rows, one proposal each."""
        return self.gamma

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
