"""Static storage a decode graph runner owns: every graph input and output, at max size.

`load(batch, bs)` copies a live batch into the row prefixes of a captured size and makes the
padded rows inert; `load_step(rows, ...)` instead queues the request rows a graph with a step
prologue derives every input from.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from sglang_aux.srt.forward_state.forward_batch_info import ForwardBatch
from sglang_aux.srt.mem_cache.memory_pool import PADDING_REQ_ROW, PADDING_SLOT
from sglang_aux.srt.model_executor.runner_utils.host_transfer import to_device_into

_TOKEN_MAJOR = ("input_ids", "out_cache_loc", "positions")
_PADDED = ("req_pool_indices", "seq_lens", *_TOKEN_MAJOR)


@dataclass
class DecodeInputBuffers:
    input_ids: torch.Tensor  # [max_num_token]
    req_pool_indices: torch.Tensor  # [max_bs]
    seq_lens: torch.Tensor  # [max_bs]
    seq_lens_cpu: torch.Tensor  # [max_bs], host
    out_cache_loc: torch.Tensor  # [max_num_token]
    positions: torch.Tensor  # [max_num_token]
    next_token_logits_buffer: torch.Tensor  # [max_num_token, vocab]
    # [max_num_token, K * hidden] in the model dtype (more rows when the runner's prefill graphs
    # share it), shared by every captured size; None when the runner does not share (width
    # 0). The DFlash worker must consume rows [:num_tokens] (write them into the draft KV
    # cache) before the next replay of any size overwrites them.
    aux_hidden_states: torch.Tensor | None
    # [max_num_token, H_draft] fp32, the streamed projection's accumulator (then no aux buffer);
    # the verify graph's epilogue consumes rows [:num_tokens] inside the same replay.
    aux_projection_acc: torch.Tensor | None
    pp_proxy_tensors: dict[str, torch.Tensor] | None  # [max_num_token, hidden] each, pp > 1
    # [max_bs]: the request rows of a step whose graph derives every input above from them
    # and the pool's row state (StepPrologue); padded columns hold the padding row.
    step_rows: torch.Tensor
    tokens_per_req: int
    seq_len_fill_value: int
    padding: dict[str, torch.Tensor] = field(default_factory=dict)

    @classmethod
    def create(
        cls,
        *,
        max_bs: int,
        tokens_per_req: int,
        vocab_size: int,
        hidden_size: int,
        dtype: torch.dtype,
        device: torch.device | str,
        aux_hidden_states_width: int = 0,
        aux_projection_width: int = 0,
        pp_size: int = 1,
        aux_rows: int = 0,
    ) -> DecodeInputBuffers:
        """`aux_rows`: the aux storage's rows when more than `max_num_token` (the same
        runner's prefill graphs write it too)."""
        max_num_token = max_bs * tokens_per_req
        rows = max(max_num_token, aux_rows)
        ints = dict(dtype=torch.int64, device=device)
        aux = None
        if aux_hidden_states_width > 0:
            aux = torch.zeros((rows, aux_hidden_states_width), dtype=dtype, device=device)
        acc = None
        if aux_projection_width > 0:
            if aux is not None:
                raise ValueError("a runner streams its aux states or shares a packed buffer, "
                                 "not both")
            acc = torch.zeros((rows, aux_projection_width), dtype=torch.float32, device=device)
        proxy = None
        if pp_size > 1:
            proxy = {name: torch.zeros((max_num_token, hidden_size), dtype=dtype, device=device)
                     for name in ("hidden_states", "residual")}
        buffers = cls(
            input_ids=torch.zeros(max_num_token, **ints),
            req_pool_indices=torch.full((max_bs,), PADDING_REQ_ROW, **ints),
            seq_lens=torch.full((max_bs,), tokens_per_req, **ints),
            seq_lens_cpu=torch.full((max_bs,), tokens_per_req, dtype=torch.int64),
            out_cache_loc=torch.full((max_num_token,), PADDING_SLOT, **ints),
            positions=torch.arange(tokens_per_req, **ints).repeat(max_bs),
            next_token_logits_buffer=torch.zeros((max_num_token, vocab_size), dtype=dtype,
                                                 device=device),
            aux_hidden_states=aux,
            aux_projection_acc=acc,
            pp_proxy_tensors=proxy,
            step_rows=torch.full((max_bs,), PADDING_REQ_ROW, **ints),
            tokens_per_req=tokens_per_req,
            # A padded request holds one block at positions [0, B): every query sees a key.
            seq_len_fill_value=tokens_per_req,
        )
        # The inert contents padded rows get (the initial ones), copied with the live rows.
        buffers.padding = {name: getattr(buffers, name).clone() for name in _PADDED}
        return buffers

    @property
    def max_bs(self) -> int:
        return self.req_pool_indices.shape[0]

    def aux_nbytes(self) -> int:
        """Bytes of the retained aux storage: the shared buffer or the streamed accumulator."""
        return sum(t.numel() * t.element_size()
                   for t in (self.aux_hidden_states, self.aux_projection_acc) if t is not None)

    @property
    def aux_path(self) -> str:
        if self.aux_projection_acc is not None:
            return "streamed"
        return "per-graph" if self.aux_hidden_states is None else "shared"

    def load(self, batch: ForwardBatch, bs: int) -> None:
        """Copy `batch` into rows `[:batch.batch_size]` and pad rows up to `bs` inertly:
        padded requests read request row 0 and write their K/V into the padding slot."""
        raw_bs, raw_tokens = batch.batch_size, batch.num_tokens
        num_tokens = bs * self.tokens_per_req
        dst, src = [], []
        for name in _PADDED:
            live, end = (raw_tokens, num_tokens) if name in _TOKEN_MAJOR else (raw_bs, bs)
            buf = getattr(self, name)
            dst += [buf[:live], buf[live:end]]
            src += [getattr(batch, name), self.padding[name][live:end]]
        if batch.pp_proxy_tensors is not None:
            for name, t in batch.pp_proxy_tensors.items():
                dst.append(self.pp_proxy_tensors[name][:raw_tokens])
                src.append(t)
        torch._foreach_copy_(dst, src)  # one launch for the live rows and the padding
        self.seq_lens_cpu[:raw_bs].copy_(batch.seq_lens_cpu)
        self.seq_lens_cpu[raw_bs:bs].fill_(self.seq_len_fill_value)

    def load_step(self, rows: list[int], kv_len_bounds: list[int]) -> None:
        """Queue a step's request `rows` (padding included) into `step_rows`: the replay's
        one input copy. `seq_lens_cpu` gets upper bounds of the live lengths (kv_len bounds
        + width) for host-side code."""
        to_device_into(self.step_rows, rows)
        live = len(kv_len_bounds)
        self.seq_lens_cpu[:live] = torch.tensor(kv_len_bounds) + self.tokens_per_req
        self.seq_lens_cpu[live : len(rows)].fill_(self.seq_len_fill_value)
