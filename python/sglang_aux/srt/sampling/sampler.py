"""Choosing next tokens from logits: greedy, or temperature / top-k / top-p sampling."""

from __future__ import annotations

import torch

from sglang_aux.srt.sampling.sampling_params import SamplingParams


def sampling_probs(logits: torch.Tensor, params: SamplingParams) -> torch.Tensor:
    """The distribution a request samples from: softmax(logits / T) restricted to top-k and
    the top-p nucleus, renormalized. `logits` `[..., vocab]`, float32 result."""
    probs = torch.softmax(logits.float() / params.temperature, dim=-1)
    if params.top_k > 0 and params.top_k < probs.shape[-1]:
        kth = probs.topk(params.top_k, dim=-1).values[..., -1:]
        probs = torch.where(probs >= kth, probs, 0.0)
    if params.top_p < 1.0:
        sorted_p, order = probs.sort(dim=-1, descending=True)
        # keep a token while the mass before it is below top_p (the first always stays)
        drop = (sorted_p.cumsum(-1) - sorted_p) >= params.top_p
        probs = probs.scatter(-1, order, sorted_p.masked_fill(drop, 0.0))
    return probs / probs.sum(-1, keepdim=True)


def sample(logits: torch.Tensor, params: list[SamplingParams],
           generators: list[torch.Generator | None]) -> list[int]:
    """One token per row of `logits` `[bs, vocab]`."""
    greedy = logits.argmax(-1).tolist()
    out = []
    for i, p in enumerate(params):
        if p.is_greedy:
            out.append(greedy[i])
            continue
        probs = sampling_probs(logits[i], p).cpu()
        out.append(int(torch.multinomial(probs, 1, generator=generators[i])))
    return out
