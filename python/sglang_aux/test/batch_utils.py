"""Hand-built forward batches for tests: KV pools plus EXTEND and DECODE `ForwardBatch`es.

    pools = BatchPools.for_model(model_config)
    fb = make_extend_batch(pools, [[1, 2, 3], [4, 5]])   # prefill two new requests
    out = model(fb.input_ids, fb.positions, fb)
    rows = fb.req_pool_indices.tolist()
    fb = make_decode_batch(pools, rows, [6, 7])          # one more token for each

The pools remember how many tokens each request row has in the KV cache, and a batch counts
as run once built: later batches for the same rows continue after it.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from sglang_aux.srt.configs.model_config import ModelConfig
from sglang_aux.srt.layers.attention.torch_native_backend import TorchNativeAttnBackend
from sglang_aux.srt.mem_cache.memory_pool import (
    MHATokenToKVPool,
    ReqToTokenPool,
    TokenToKVPoolAllocator,
)
from sglang_aux.srt.model_executor.forward_batch_info import (
    CaptureHiddenMode,
    ForwardBatch,
    ForwardMode,
)


@dataclass
class BatchPools:
    """The KV memory and attention backend one test's batches share."""

    req_to_token_pool: ReqToTokenPool
    allocator: TokenToKVPoolAllocator
    kv_pool: MHATokenToKVPool
    attn_backend: TorchNativeAttnBackend
    cached_lens: dict[int, int] = field(default_factory=dict)  # request row -> tokens in KV

    @classmethod
    def for_model(cls, model_config: ModelConfig, max_reqs: int = 8, max_tokens: int = 512,
                  max_context_len: int = 256, device: torch.device | str = "cpu") -> BatchPools:
        return cls(
            req_to_token_pool=ReqToTokenPool(max_reqs, max_context_len, device),
            allocator=TokenToKVPoolAllocator(max_tokens, device),
            kv_pool=MHATokenToKVPool(max_tokens, model_config.num_layers,
                                     model_config.num_kv_heads, model_config.head_dim,
                                     model_config.dtype, device),
            attn_backend=TorchNativeAttnBackend(),
        )

    @property
    def device(self) -> torch.device:
        return self.req_to_token_pool.req_to_token.device


def make_extend_batch(pools: BatchPools, prompts: list[list[int]], rows: list[int] | None = None,
                      capture_hidden_mode: CaptureHiddenMode = CaptureHiddenMode.NULL
                      ) -> ForwardBatch:
    """An EXTEND batch of `prompts`, one request each.

    Without `rows`, each prompt starts a new request (a fresh request row, no prefix). With
    `rows`, prompt i continues request row `rows[i]` after its cached tokens (chunked prefill).
    """
    if rows is None:
        rows = [pools.req_to_token_pool.alloc() for _ in prompts]
    return _make_batch(pools, ForwardMode.EXTEND, rows, prompts, capture_hidden_mode)


def make_decode_batch(pools: BatchPools, rows: list[int], tokens: list[int],
                      capture_hidden_mode: CaptureHiddenMode = CaptureHiddenMode.NULL
                      ) -> ForwardBatch:
    """A DECODE batch: `tokens[i]` is the next token of request row `rows[i]`."""
    return _make_batch(pools, ForwardMode.DECODE, rows, [[t] for t in tokens],
                       capture_hidden_mode)


def _make_batch(pools: BatchPools, mode: ForwardMode, rows: list[int], chunks: list[list[int]],
                capture_hidden_mode: CaptureHiddenMode) -> ForwardBatch:
    if len(rows) != len(chunks):
        raise ValueError(f"{len(rows)} request rows for {len(chunks)} token lists")
    if any(not chunk for chunk in chunks):
        raise ValueError("every request needs at least one new token")
    device = pools.device
    prefix_lens = [pools.cached_lens.get(row, 0) for row in rows]
    new_lens = [len(chunk) for chunk in chunks]
    out_cache_loc = pools.allocator.alloc(sum(new_lens))  # [num_tokens]
    positions = []
    start = 0
    for row, prefix, n in zip(rows, prefix_lens, new_lens, strict=True):
        pools.req_to_token_pool.write(row, prefix, out_cache_loc[start : start + n])
        positions.append(torch.arange(prefix, prefix + n))
        pools.cached_lens[row] = prefix + n
        start += n
    seq_lens_cpu = torch.tensor([p + n for p, n in zip(prefix_lens, new_lens, strict=True)])
    is_extend = mode.is_extend()
    batch = ForwardBatch(
        forward_mode=mode,
        batch_size=len(rows),
        input_ids=torch.tensor([t for chunk in chunks for t in chunk], device=device),
        req_pool_indices=torch.tensor(rows, device=device),
        seq_lens=seq_lens_cpu.to(device),
        seq_lens_cpu=seq_lens_cpu,
        out_cache_loc=out_cache_loc,
        positions=torch.cat(positions).to(device),
        req_to_token_pool=pools.req_to_token_pool,
        token_to_kv_pool=pools.kv_pool,
        attn_backend=pools.attn_backend,
        extend_prefix_lens_cpu=prefix_lens if is_extend else None,
        extend_seq_lens_cpu=new_lens if is_extend else None,
        capture_hidden_mode=capture_hidden_mode,
    )
    pools.attn_backend.init_forward_metadata(batch)
    return batch
