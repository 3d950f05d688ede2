"""Choosing next tokens on the device: greedy, or temperature / top-k / top-p / min-p sampling.

Every function takes per-row parameters as tensors and never syncs with the host, so a batch
mixing greedy and sampled requests is one set of kernels, capturable in a graph. Randomness is
counter-based (`uniform`): a draw is a hash of (request seed, token position, lane), so a
seeded request gives the same tokens whatever batch it runs in, and nothing depends on a
global generator's state.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from sglang_aux.srt.layers.triton_ops.dispatch import use_triton
from sglang_aux.srt.sampling.sampling_params import GREEDY_EPS
from sglang_aux.srt.sampling.top_k_top_p import top_k_top_p_probs

_MASK32 = 0xFFFFFFFF
# Odd multipliers below 2**31: a 32-bit value times one stays below 2**63, so int64 never
# overflows and the hash is the same on every device.
_MIX = (0x7FEB352D, 0x2C1B3C6D, 0x297A2D39)
# Rows whose CDF `sample_from_probs` holds at a time.
SAMPLE_ROWS = 256
_UNIFORM_BITS = 24  # float32 holds 24 bits exactly: draws are multiples of 2**-24 in [0, 1)


class Lane:
    """Independent streams of draws for the same (seed, position)."""

    SAMPLE = 0  # the token a plain decode step samples
    DRAFT = 1  # a DFlash draft proposal
    ACCEPT = 2  # the rejection test of a draft
    RESIDUAL = 3  # the corrected (or bonus) token after the accepted drafts


def _hash32(x: torch.Tensor) -> torch.Tensor:
    for m in _MIX:
        x = ((x ^ (x >> 16)) * m) & _MASK32
    return x ^ (x >> 16)


def uniform(seed: torch.Tensor, position: torch.Tensor, lane: int) -> torch.Tensor:
    """Draws in [0, 1) (float32), one per element of the broadcast of `seed` and `position`
    (int64 tensors)."""
    s = _hash32((seed & _MASK32) ^ _hash32(((seed >> 32) + lane) & _MASK32))
    x = _hash32(s ^ (position & _MASK32))
    return (x >> (32 - _UNIFORM_BITS)).to(torch.float32) * 2.0**-_UNIFORM_BITS


@dataclass
class SamplingTensors:
    """Per-row parameters `[rows]` on the device (a row is a token to choose)."""

    temperature: torch.Tensor  # float32; rows below GREEDY_EPS are greedy
    top_k: torch.Tensor  # int64; the vocabulary size when off
    top_p: torch.Tensor  # float32; 1.0 when off
    seed: torch.Tensor  # int64
    is_greedy: torch.Tensor  # bool
    min_p: torch.Tensor | None = None  # float32, 0.0 when off; None: no row sets it

    def repeat_interleave(self, n: int) -> SamplingTensors:
        """Each row's parameters for `n` consecutive rows (the tokens of one block); an
        expand, where `Tensor.repeat_interleave` may size its output on the host."""
        return SamplingTensors(*(None if t is None else t[:, None].expand(-1, n).reshape(-1)
                                 for t in (self.temperature, self.top_k, self.top_p, self.seed,
                                           self.is_greedy, self.min_p)))


def sampling_probs(logits: torch.Tensor, params: SamplingTensors,
                   out: torch.Tensor | None = None) -> torch.Tensor:
    """The distribution each row samples from: softmax(logits / T) restricted to its top-k,
    then to its top-p nucleus, renormalized (the exact rule: `top_k_top_p`); with `min_p` set
    (SGLang's order), then to the tokens of probability >= min_p times the
    largest, renormalized. `logits`
    `[rows, vocab]`; the float32 result goes into `out` when given. No sort and no host sync;
    the only temporaries are a `[rows, vocab]` float32 mask (torch twin) or per-chunk partials,
    `[rows, vocab / 4096, 8]` (kernel)."""
    if out is None:
        out = torch.empty(logits.shape, dtype=torch.float32, device=logits.device)
    elif out.shape != logits.shape or out.dtype != torch.float32:
        raise ValueError(f"out must be float32 {tuple(logits.shape)} like the logits, got "
                         f"{out.dtype} {tuple(out.shape)}")
    temperature = params.temperature.clamp_min(GREEDY_EPS)
    restrict = top_k_top_p_probs
    if use_triton(logits, differentiable=False):
        from sglang_aux.srt.sampling.top_k_top_p_kernel import top_k_top_p_kernel as restrict
    probs = restrict(logits, temperature, params.top_k, params.top_p, out)
    return probs if params.min_p is None else _restrict_min_p(probs, params.min_p)


def _restrict_min_p(probs: torch.Tensor, min_p: torch.Tensor) -> torch.Tensor:
    """In place; a row with min_p 0 drops nothing and is divided by exactly 1."""
    threshold = probs.amax(-1, keepdim=True) * min_p[:, None]
    probs.masked_fill_(probs < threshold, 0.0)
    return probs.div_(torch.where(min_p > 0, probs.sum(-1), 1.0)[:, None])


def sample_from_probs(probs: torch.Tensor, u: torch.Tensor) -> torch.Tensor:
    """Inverse-CDF draw per row: the first token whose cumulative mass exceeds `u` times the
    row's total, so a zero-probability token is never chosen. `probs` `[..., V]` (any view)
    and `u` `[...]` -> `[...]` int64. The CDF and its comparison exist for `SAMPLE_ROWS` rows
    at a time (leading slices): whole, a DRAFT_BLOCK tail's would be `[bs * B, V]` float32
    twice over, 583 MB at bs 64, block 16 and Qwen2.5's 151,936 tokens."""
    out = torch.empty(u.shape, dtype=torch.int64, device=probs.device)
    step = max(1, SAMPLE_ROWS // max(1, u[0].numel()))
    for s in range(0, len(u), step):
        cdf = probs[s:s + step].cumsum(-1)
        target = u[s:s + step, ..., None] * cdf[..., -1:]
        out[s:s + step] = (cdf <= target).sum(-1).clamp_max(probs.shape[-1] - 1)
    return out


def sample(logits: torch.Tensor, params: SamplingTensors | None, positions: torch.Tensor,
           all_greedy: bool) -> torch.Tensor:
    """One token per row of `logits` `[rows, vocab]`, chosen for position `positions` `[rows]`
    (int64, device). `all_greedy` (known on the host; `params` may then be None) skips the
    sampling kernels."""
    greedy = logits.argmax(-1)
    if all_greedy:
        return greedy
    drawn = sample_from_probs(sampling_probs(logits, params),
                              uniform(params.seed, positions, Lane.SAMPLE))
    return torch.where(params.is_greedy, greedy, drawn)
