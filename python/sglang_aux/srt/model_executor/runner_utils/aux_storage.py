"""The aux storage of a DFlash target runner: its width, its one allocation, its row views.

DFlash's draft reads the target's aux states (K captured layers, `[K * hidden]` per token) of
every forward, inside that forward (the epilogue commits them to the draft KV cache before it
returns). So one `[rows, K * hidden]` tensor, sized once for the largest forward the runner can
run, serves every forward: each writes a row prefix and its epilogue consumes it before the
next forward starts. With the streamed projection (`--speculative-dflash-aux-projection
streamed`) the same rows hold the draft fc's fp32 accumulator `[rows, H_draft]` instead.

Life cycle: `resolve_aux_hidden_states_width` (who gets one, how wide; SGLang's
`model_runner_components/misc_utils.py`), then here `aux_rows` (how many rows),
`AuxStorage.create` (the one allocation, `ModelRunner.init_forwards`), `rows` (a forward's
view, `GraphRunner.capture_prepare` and `ModelRunner.forward`). Written by
`layers/aux_hidden_states.py`, consumed by `speculative/dflash_worker.py`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch

if TYPE_CHECKING:
    from sglang_aux.srt.server_args import ServerArgs


def aux_rows(args: ServerArgs, *, tokens_per_req: int, prefill_graph_tokens: int,
             chunk_tokens: int, mixed: bool) -> int:
    """The rows the storage needs: the largest step any graph
    or eager path runs (every running request, or a padded graph's, times `tokens_per_req`),
    the largest prefill graph, the largest mixed forward (a step plus
    `--mixed-chunk-max-prefill-tokens`), and with chunked prefill a chunk (`chunk_tokens`,
    `--chunked-prefill-size`: no prefill step runs more; the caller caps it below a staged
    projection's start). Without chunked prefill an eager prefill has no bound: one past the
    rows writes a transient tensor."""
    reqs = max([args.max_running_requests, *(args.cuda_graph_bs_decode or [])])
    step = reqs * tokens_per_req
    if mixed:
        step += args.mixed_chunk_max_prefill_tokens
    return max(step, prefill_graph_tokens, chunk_tokens)


@dataclass(frozen=True)
class AuxStorage:
    # [rows, K * hidden] in the model dtype (the packer's output), or
    # [rows, H_draft] fp32 (the streamed projection's accumulator)
    buffer: torch.Tensor
    streamed: bool

    @classmethod
    def create(cls, *, rows: int, width: int, streamed: bool,
               dtype: torch.dtype, device: torch.device) -> AuxStorage:
        """The runner's one aux allocation; `dtype` is the model's (fp32 when streamed)."""
        if rows < 1 or width < 1:
            raise ValueError(f"aux storage needs rows and a width, got {rows} x {width}")
        dtype = torch.float32 if streamed else dtype
        buffer = torch.zeros((rows, width), dtype=dtype, device=device)
        return cls(buffer, streamed)

    def rows(self, num_tokens: int) -> torch.Tensor | None:
        """The row view `[num_tokens, width]` a forward writes, or None when it has more
        tokens than the storage rows (an eager prefill past every bound: chunked prefill
        off)."""
        return self.buffer[:num_tokens] if num_tokens <= self.buffer.shape[0] else None

    def nbytes(self) -> int:
        return self.buffer.numel() * self.buffer.element_size()

    @property
    def path(self) -> str:
        return "streamed" if self.streamed else "shared"
