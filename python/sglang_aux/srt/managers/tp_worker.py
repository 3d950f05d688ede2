"""Target-only generation on one ModelRunner: prefill, then one token per decode step."""

from __future__ import annotations

from sglang_aux.srt.configs.model_config import ModelConfig
from sglang_aux.srt.managers.schedule_batch import Req, build_decode_batch, build_extend_batch
from sglang_aux.srt.model_executor.forward_batch_info import ForwardMode
from sglang_aux.srt.model_executor.model_runner import ModelRunner
from sglang_aux.srt.sampling.sampler import sample
from sglang_aux.srt.server_args import ServerArgs


class TpModelWorker:
    """The worker interface the scheduler drives: `prefill` and `decode` return each
    request's new tokens; the scheduler appends them and decides when a request ends."""

    tokens_per_step = 1

    def __init__(self, model_config: ModelConfig, server_args: ServerArgs,
                 model_runner: ModelRunner | None = None):
        self.model_runner = model_runner or ModelRunner(model_config, server_args)
        self.model_runner.init_decode_graphs(ForwardMode.DECODE, captured_req_width=1)

    def prefill(self, reqs: list[Req]) -> list[list[int]]:
        out = self.model_runner.forward(build_extend_batch(self.model_runner, reqs))
        return self._sample(out.next_token_logits, reqs)

    def decode(self, reqs: list[Req]) -> list[list[int]]:
        out = self.model_runner.forward(build_decode_batch(self.model_runner, reqs))
        return self._sample(out.next_token_logits, reqs)

    @staticmethod
    def _sample(logits, reqs: list[Req]) -> list[list[int]]:
        tokens = sample(logits, [r.sampling_params for r in reqs], [r.generator for r in reqs])
        return [[t] for t in tokens]
