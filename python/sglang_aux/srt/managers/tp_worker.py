"""Target-only generation on one ModelRunner: prefill, then one token per decode step."""

from __future__ import annotations

import torch

from sglang_aux.srt.configs.model_config import ModelConfig
from sglang_aux.srt.managers.schedule_batch import Req, build_extend_batch, build_step_batch
from sglang_aux.srt.model_executor.forward_batch_info import ForwardMode
from sglang_aux.srt.model_executor.model_runner import ModelRunner
from sglang_aux.srt.model_executor.runner.step_prologue import StepPrologue
from sglang_aux.srt.model_executor.runner_utils.host_transfer import HostReadback
from sglang_aux.srt.sampling.sampling_rows import SamplingRows
from sglang_aux.srt.server_args import ServerArgs


class TpModelWorker:
    """The worker interface the scheduler drives: `prefill` and `decode` return each
    request's new tokens; the scheduler appends them and decides when a request ends.

    A decode step issues no per-request device work: one input copy (`build_step_batch`;
    a graph derives the rest in its prologue), the forward (a graph replay when one fits),
    sampling on the device, one readback. A
    prefill likewise: one input copy, a prefill graph when one fits, sampling, one readback.
    """

    tokens_per_step = 1

    def __init__(self, model_config: ModelConfig, server_args: ServerArgs,
                 model_runner: ModelRunner | None = None):
        self.model_runner = runner = model_runner or ModelRunner(model_config, server_args)
        runner.init_decode_graphs(ForwardMode.DECODE, captured_req_width=1,
                                  step_prologue=StepPrologue())
        runner.init_prefill_graphs()
        self.sampling_rows = SamplingRows(server_args.max_running_requests,
                                          model_config.hf_config.vocab_size, runner.device)
        self.readback = HostReadback(runner.device)

    def prefill(self, reqs: list[Req]) -> list[list[int]]:
        self.sampling_rows.set([r.req_pool_idx for r in reqs],
                               [r.sampling_params for r in reqs], [r.seed for r in reqs])
        fb = build_extend_batch(self.model_runner, reqs)
        logits = self.model_runner.forward(fb).next_token_logits
        # the sampled token sits at position seq_len (= kv_len after the prefill)
        return self._sample(logits, reqs, fb.req_pool_indices, fb.seq_lens)

    def decode(self, reqs: list[Req]) -> list[list[int]]:
        fb = build_step_batch(self.model_runner, reqs, ForwardMode.DECODE, 1)
        for r in reqs:
            r.kv_len += 1
        logits = self.model_runner.forward(fb).next_token_logits
        return self._sample(logits, reqs, fb.req_pool_indices, fb.seq_lens)

    def _sample(self, logits: torch.Tensor, reqs: list[Req], rows: torch.Tensor,
                positions: torch.Tensor) -> list[list[int]]:
        all_greedy = all(r.sampling_params.is_greedy for r in reqs)
        tokens = self.sampling_rows.sample(logits, rows, positions, all_greedy)
        # the step's one device-to-host copy; .tolist() then reads host memory
        return [[t] for t in self.readback.fetch(tokens).tolist()]
