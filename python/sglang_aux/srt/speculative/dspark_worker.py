"""DSpark speculative decoding: the DFlash worker with a sequential Markov proposal and a
confidence head.

Everything DFlash does stays (`DFlashWorker`): the target's prefill commits the draft
context, the TARGET_VERIFY graph writes the packed aux rows into the runner's one aux storage
and consumes them in its epilogue (draft context commit, acceptance), the sampling tail runs
lossless rejection sampling, overlap and mixed steps, static and compact verify. What differs
is the draft's half of the step, its `Proposer` (`dspark_proposal.DSparkProposer`): the draft
block has one row per proposal, `[anchor, MASK x (num_proposals - 1)]`, so the verify width is
num_proposals + 1, and its Markov loop writes the confidence head's values, which compact
verify ranks; a draft without the head is refused in that mode.
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from sglang_aux.srt.configs.dspark_config import DSparkConfig
from sglang_aux.srt.configs.model_config import ModelConfig
from sglang_aux.srt.server_args import ServerArgs
from sglang_aux.srt.speculative.dflash_worker import DFlashWorker
from sglang_aux.srt.speculative.draft_proposals import Proposals, Proposer
from sglang_aux.srt.speculative.dspark_proposal import DSparkProposer


class DSparkWorker(DFlashWorker):
    logprob_refusal = ("DSpark speculative decoding returns no logprobs (as in SGLang); "
                       "serve with --speculative-algorithm DFLASH or NONE for them")

    def __init__(self, target_config: ModelConfig, draft_config: ModelConfig,
                 server_args: ServerArgs, token_to_id: Callable[[str], int | None] | None = None):
        hf = draft_config.hf_config
        dspark = DSparkConfig.from_hf_config(hf)  # refuses a draft without a Markov head
        verify_width = server_args.speculative_verify_width or dspark.num_proposals + 1
        # the draft model reads its proposal count from the checkpoint's key: the flag
        # overrides the checkpoint's
        hf.dspark_config = dict(getattr(hf, "dspark_config", None) or {},
                                block_size=verify_width - 1)
        if server_args.speculative_verify_mode == "compact" and not dspark.confidence_head:
            raise ValueError("--speculative-verify-mode compact needs the draft's confidence "
                             "head (its config sets enable_confidence_head false)")
        super().__init__(target_config, draft_config, server_args, token_to_id,
                         verify_width=verify_width)

    def _proposals(self, rows: int, vocab: int, device: torch.device) -> Proposals:
        """Each request's W - 1 distributions, whatever a step verifies: the loop draws all."""
        return Proposals.create(rows, self.verify_width, vocab, device, packed=False)

    def _proposer(self) -> Proposer:
        return DSparkProposer(self.draft_runner.model, self.proposals, self.sampling_rows,
                              with_confidence=self.verify_plan.compact)
