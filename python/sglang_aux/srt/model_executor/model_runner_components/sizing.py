"""How many KV slots a runner gets."""

from __future__ import annotations

import torch

from sglang_aux.srt.configs.model_config import ModelConfig
from sglang_aux.srt.server_args import ServerArgs

CPU_KV_BUDGET_BYTES = 2 << 30


def kv_bytes_per_token(model_config: ModelConfig, num_kv_heads: int | None = None) -> int:
    """K and V bytes of one token over all layers, for `num_kv_heads` heads (default: all of
    the model's; a tensor-parallel rank holds fewer)."""
    elem = torch.empty((), dtype=model_config.dtype).element_size()
    heads = num_kv_heads or model_config.num_kv_heads
    return 2 * model_config.num_layers * heads * model_config.head_dim * elem


def kv_pool_size(model_config: ModelConfig, server_args: ServerArgs, device: torch.device,
                 num_kv_heads: int | None = None) -> int:
    """`--max-total-tokens` when given; else what the memory budget holds (for this rank's
    `num_kv_heads`), capped at every request running at full context (more could never be
    used)."""
    if server_args.max_total_tokens is not None:
        return server_args.max_total_tokens
    if device.type == "cuda":
        free, total = torch.cuda.mem_get_info(device)
        used = total - free
        budget = max(int(total * server_args.mem_fraction_static) - used, 0)
    else:
        budget = CPU_KV_BUDGET_BYTES
    # The draft's KV pool mirrors the target's slots: leave it room by halving speculative
    # budgets.
    if not server_args.spec_algorithm.is_none():
        budget //= 2
    cap = server_args.max_running_requests * model_config.context_len
    size = min(budget // kv_bytes_per_token(model_config, num_kv_heads), cap)
    if size < model_config.context_len:
        raise RuntimeError(
            f"KV memory holds {size} tokens, less than one context of {model_config.context_len};"
            " lower --context-length or raise --mem-fraction-static"
        )
    return size
