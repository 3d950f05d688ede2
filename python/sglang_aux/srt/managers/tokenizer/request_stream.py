"""One request's progress on the event loop: the updates the front end's reader thread posts
from the scheduler process, turned into streamed text deltas or a final output dict."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass

from sglang_aux.srt.managers.io_struct import Finished, NewLogprobs
from sglang_aux.srt.managers.request_output import logprob_meta, request_output
from sglang_aux.srt.managers.schedule_batch import Req
from sglang_aux.srt.model_loader.tokenizer import Tokenizer

REPLACEMENT_CHAR = "\ufffd"  # what a cut-off UTF-8 sequence decodes to
STOP_REGEX_HOLDBACK = 64  # characters


@dataclass
class RequestUpdate:
    """New output tokens of one request; `finished` on its last update, or `error` saying why
    the request failed instead."""

    new_ids: list[int]
    finished: Finished | None = None
    error: str | None = None
    logprobs: NewLogprobs | None = None


@dataclass
class StreamDelta:
    """What a streaming client gets next: text and token ids since the previous delta, the
    native logprob meta_info fields (`logprob_meta`) of those ids and, with the first delta,
    of the prompt (None unless the request asks for logprobs), and the full output
    (`request_output`) with the last one. The text of a token may come in a later delta than
    the token (stop strings and partial characters are held back)."""

    text: str
    output_ids: list[int]
    logprobs: dict | None = None
    output: dict | None = None


class RequestFailed(RuntimeError):
    """The scheduler failed while running the request (a bug, never bad input)."""


class RequestStream:
    """One request's updates on the event loop. Iterate for StreamDeltas, or await
    `result()` for the output dict only; use one of the two, once."""

    def __init__(self, tokenizer: Tokenizer, req: Req):
        self.tokenizer = tokenizer
        self.req = req  # the front end's copy: its output fields are set when it finishes
        self.rid = req.rid
        self.prompt_tokens = len(req.origin_input_ids)
        self.finished = False
        self.output: dict | None = None  # the output dict, once finished
        self.queue: asyncio.Queue[RequestUpdate] = asyncio.Queue()
        self._start = time.perf_counter()
        self._output_ids: list[int] = []
        self._sent_text = ""
        # NOTE: text that may be the start of a stop string is held back; at the end the
        # stop string is cut, so the streamed pieces always add up to the final text.
        # A stop regex's match is held back while it is at most STOP_REGEX_HOLDBACK long.
        params = req.sampling_params
        self._holdback = max(max(map(len, params.stop), default=1) - 1,
                             STOP_REGEX_HOLDBACK if params.stop_regex else 0)

    @property
    def completion_tokens(self) -> int:
        return len(self._output_ids)

    async def _next(self) -> RequestUpdate:
        update = await self.queue.get()
        if update.error is not None:
            self.finished = True
            raise RequestFailed(update.error)
        self._output_ids += update.new_ids
        if update.logprobs is not None:
            self.req.input_logprobs += update.logprobs.input
            self.req.output_logprobs += update.logprobs.output
        return update

    def _logprobs(self, update: RequestUpdate) -> dict | None:
        new = update.logprobs
        return None if new is None else logprob_meta(self.tokenizer, self.req.logprob,
                                                     new.input, new.output)

    def _final(self, finished: Finished) -> dict:
        self.finished = True
        self.req.output_ids = self._output_ids
        finished.apply(self.req)
        self.output = request_output(self.tokenizer, self.req, time.perf_counter() - self._start)
        return self.output

    async def result(self) -> dict:
        while (update := await self._next()).finished is None:
            pass
        return self._final(update.finished)

    async def __aiter__(self) -> AsyncIterator[StreamDelta]:
        while True:
            update = await self._next()
            if update.finished is not None:
                out = self._final(update.finished)
                yield StreamDelta(out["text"][len(self._sent_text):], update.new_ids,
                                  self._logprobs(update), out)
                return
            text = self.tokenizer.decode(
                self._output_ids, skip_special_tokens=self.req.sampling_params.skip_special_tokens
            ).rstrip(REPLACEMENT_CHAR)
            text = text[: max(len(text) - self._holdback, 0)]
            delta = text[len(self._sent_text):] if text.startswith(self._sent_text) else ""
            self._sent_text += delta
            yield StreamDelta(delta, update.new_ids, self._logprobs(update))
