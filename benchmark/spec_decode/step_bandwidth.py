"""What one decode or verify step must read from device memory, and what the device copies.

A step reads every target weight once: the input embedding only for its tokens, an MoE layer's
routed experts only as many as its tokens reach (the expected number of distinct experts under
uniform routing, `E * (1 - (1 - k / E) ** tokens)`), an LM head tied to the embedding once, as
the head. It reads each request's K and V of its context (plus the tokens it writes) in every
layer. Activations are not counted: at decode they are kilobytes. The floor of a step is these
bytes over the copy bandwidth, measured in the same process as a device-to-device copy (bytes
read plus bytes written per second: what "the H200 copies at 4.3 TB/s" means).
"""

from __future__ import annotations

import statistics
import time

import torch
from torch import nn


def _nbytes(t: torch.Tensor) -> int:
    return t.numel() * t.element_size()


def weight_bytes(model: nn.Module, hf_config, tokens: int) -> int:
    """Weight bytes a forward of `tokens` tokens reads: `tokens` rows of the embedding, the
    whole LM head, each other parameter (MoE experts by the share `tokens` reach). A DFlash
    draft's embedding and head are the target's, borrowed, not its parameters: counted too
    (over a draft vocabulary, its cut head, and DSpark's markov_w2 rows of it)."""
    embed = model.get_input_embeddings().weight
    head = model.lm_head_weight
    experts = getattr(hf_config, "num_experts", 0) or 0
    top_k = getattr(hf_config, "num_experts_per_tok", 0) or 0
    reached = experts * (1 - (1 - top_k / experts) ** tokens) if experts else 0.0
    total = 0.0
    params = dict(model.named_parameters())  # a tied head is listed once, as the embedding
    for name, p in params.items():
        if p is embed:
            rows = min(tokens, p.shape[0]) if head is not embed else p.shape[0]
            total += _nbytes(p) * rows / p.shape[0]
        elif ".experts." in name and experts:
            total += _nbytes(p) * reached / experts
        else:
            total += _nbytes(p)
    owned = {id(p) for p in params.values()}
    if id(embed) not in owned and embed is not head:
        total += _nbytes(embed) * min(tokens, embed.shape[0]) / embed.shape[0]
    if id(head) not in owned:
        total += _nbytes(head)
    return int(total)


def kv_bytes(kv_pool, bs: int, context: int, tokens_per_req: int) -> int:
    """K and V bytes the attention of `bs` requests of `context` cached tokens reads, each
    request stepping `tokens_per_req` tokens (their K/V written, then read)."""
    per_token = sum(_nbytes(k[0]) + _nbytes(v[0])
                    for k, v in zip(kv_pool.k_buffer, kv_pool.v_buffer, strict=True))
    return per_token * bs * (context + tokens_per_req)


def copy_bandwidth(device: torch.device, nbytes: int = 1 << 30, iters: int = 20) -> float:
    """Bytes per second a device-to-device copy moves (read + written), median of `iters`."""
    src = torch.empty(nbytes // 2, dtype=torch.uint8, device=device)
    dst = torch.empty_like(src)
    dst.copy_(src)
    times = []
    for _ in range(iters):
        if device.type == "cuda":
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            dst.copy_(src)
            end.record()
            end.synchronize()
            times.append(start.elapsed_time(end) / 1e3)
        else:
            t0 = time.perf_counter()
            dst.copy_(src)
            times.append(time.perf_counter() - t0)
    return 2 * src.numel() / statistics.median(times)
