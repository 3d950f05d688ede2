"""Validated requests from user input: the Engine's `make_request`, and the HTTP front end's,
which runs in another process than the scheduler and checks against the limits it sent."""

from __future__ import annotations

import itertools

import torch

from sglang_aux.srt.managers.request_limits import RequestLimits
from sglang_aux.srt.managers.schedule_batch import Req
from sglang_aux.srt.model_loader.tokenizer import Tokenizer
from sglang_aux.srt.sampling.logprobs import logprob_params
from sglang_aux.srt.sampling.sampling_params import SamplingParams


class RequestFactory:
    def __init__(self, tokenizer: Tokenizer, limits: RequestLimits, vocab_size: int,
                 random_seed: int):
        self.tokenizer = tokenizer
        self.limits = limits
        self.vocab_size = vocab_size
        # Seeds for requests that give none, from a private CPU generator: reseeding the
        # global CUDA one after another engine captured graphs breaks later random ops.
        self._seeds = torch.Generator().manual_seed(random_seed)
        self._rids = itertools.count()

    def make(self, *, text: str | None = None, input_ids: list[int] | None = None,
             sampling_params: dict | SamplingParams | None = None,
             rid: str | None = None, logprob: dict | None = None) -> Req:
        """A validated request (ValueError with the reason otherwise); `logprob`: SGLang's
        native logprob fields (`logprob_params`)."""
        if (text is None) == (input_ids is None):
            raise ValueError("give exactly one of text and input_ids")
        if text is not None:
            self.limits.validate_text(text)
        ids = self.tokenizer.encode(text) if text is not None else list(input_ids)
        vocab = self.vocab_size
        # the tokenizer's ids are ints; min/max keep a long prompt's check off Python loops
        if ((text is None and not all(isinstance(t, int) for t in ids))
                or (ids and not 0 <= min(ids) <= max(ids) < vocab)):
            raise ValueError(f"input_ids must be integers in [0, {vocab})")
        params = (sampling_params if isinstance(sampling_params, SamplingParams)
                  else SamplingParams.from_dict(sampling_params))
        seed = params.seed
        if seed is None:
            seed = int(torch.randint(0, 2**62, (1,), generator=self._seeds))
        req = Req(rid or f"req-{next(self._rids)}", ids, params, seed=seed,
                  logprob=logprob_params(logprob, len(ids), vocab))
        self.limits.validate(req)
        return req
