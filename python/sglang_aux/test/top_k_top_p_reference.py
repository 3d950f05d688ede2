"""The sorted reference the top-k / top-p tests compare `sampling_probs` with (CPU and H200):
logits of several kinds, rows of (T, top_k, top_p), parameters as the engine hands them out,
and a per-row check of kept set and probabilities. Where top-p decides within BOUNDARY of a
cumulative mass, either side of that token is accepted. `sorted_sampling_probs` is the path
the sort-free one replaced (a baseline for the benchmark)."""

from __future__ import annotations

import torch

from sglang_aux.srt.sampling.sampler import SamplingTensors, sampling_probs
from sglang_aux.srt.sampling.sampling_params import GREEDY_EPS, SamplingParams
from sglang_aux.srt.sampling.sampling_rows import SamplingRows

BOUNDARY = 1e-6
TINY = 1e-30
# torch's float32 exp on CPU is off by up to 1.5e-4 relative (at exp(-12)) over a worker thread's
# share of a tensor in about 1 process in 10 at 2 threads, never at 1; a wrong kept set or
# temperature moves probabilities far more
EXP_RTOL = 5e-4


def check_row(got: torch.Tensor, logits: torch.Tensor, t: float, k: int, p: float,
               what: str) -> bool:
    """One row against sorting. The kept set must be a prefix of the (probability, index)
    order whose length meets the top-p rule with top_p moved by up to BOUNDARY either way.
    Returns whether the check was exact: that length unique, and no cut between two different
    logits that float32 rounding could merge (there only the sorted values are compared)."""
    x = logits.float() / max(t, 1e-6)
    order = x.sort(descending=True, stable=True).indices  # ties: lower vocabulary index first
    probs = torch.softmax(x.double(), -1)[order]
    k = min(k, len(x))
    before, mass = probs[:k].cumsum(0) - probs[:k], probs[:k].sum()
    n_lo, n_hi = ((max(1, int((before < (p + d) * mass).sum())) for d in (-BOUNDARY, BOUNDARY))
                  if p < 1 else (k, k))
    xs = x[order]
    loose = False
    for cut in {k, n_lo, n_hi} - {len(x)}:
        gap = float(xs[cut - 1] - xs[cut])
        loose |= 0 < gap <= BOUNDARY * max(1.0, abs(float(xs[cut])))
    # float32 keeps probabilities down to ~1e-38; the float64 reference goes lower
    seen = int((probs > TINY).sum())
    got = got.double()
    mine = got[order] if not loose else got.sort(descending=True).values
    n = int((mine[:seen] > 0).sum())
    assert min(n_lo, seen) <= n <= min(n_hi, seen), f"{what}: kept {n}, not {n_lo}..{n_hi}"
    assert (mine[:n] > 0).all(), f"{what}: the kept set is not a prefix of the ranking"
    want = torch.zeros_like(probs)
    want[:n] = probs[:n] / probs[:n].sum()
    torch.testing.assert_close(mine, want, rtol=EXP_RTOL, atol=1e-6, msg=what)
    return not loose and n_lo == n_hi


def logits_of(kind: str, rows: int, vocab: int, g: torch.Generator) -> torch.Tensor:
    x = torch.randn(rows, vocab, generator=g)
    if kind == "ties":  # few distinct values, many exact ties
        return (x * 2).round()
    if kind == "constant":
        return torch.full((rows, vocab), 0.25)
    if kind == "peaked":
        return x * 40
    if kind == "flat":
        return x * 0.01
    return x * 3


# (T, top_k, top_p); None = the vocabulary size
ROWS = [(1.0, None, 1.0), (0.7, 1, 1.0), (1.0, None, 0.9), (1.3, 5, 1.0), (0.5, 4, 0.8),
        (2.0, None, 1e-7), (1.0, 40, 0.95), (0.9, None, 0.5), (1.1, 3, 0.3), (1.0, None, 0.999),
        (0.3, 17, 0.7), (1.5, 2, 1.0), (0.8, None, 0.2), (1.0, 1000, 0.6),
        (1.0, None, 1e-50)]  # top_p 0.0 in float32: the first token still stays
KINDS = ["random", "ties", "constant", "peaked", "flat"]
DTYPES = [torch.float32, torch.bfloat16, torch.float16]


def params_of(rows, vocab: int, device: str = "cpu") -> SamplingTensors:
    """Parameters of (T, top_k or None for the vocabulary size, top_p) rows."""
    t, k, p = zip(*rows, strict=True)
    return SamplingTensors(
        temperature=torch.tensor(t, dtype=torch.float32, device=device),
        top_k=torch.tensor([vocab if v is None else v for v in k], device=device),
        top_p=torch.tensor(p, dtype=torch.float32, device=device),
        seed=torch.arange(len(rows), device=device),
        is_greedy=torch.zeros(len(rows), dtype=torch.bool, device=device))


def gathered_params(rows, vocab: int, device: str = "cpu") -> SamplingTensors:
    """`params_of(rows)` as a decode step reads them: `SamplingRows.gather`, whose per-row
    tensors are strided views of its tables."""
    table = SamplingRows(len(rows), vocab, device)
    for i, (t, k, p) in enumerate(rows):
        table.stage(i + 1, SamplingParams(temperature=t, top_k=k or -1, top_p=p), i)
    table.write(list(range(1, len(rows) + 1)))
    return table.gather(torch.arange(1, len(rows) + 1, device=device))


def sorted_sampling_probs(logits: torch.Tensor, params: SamplingTensors,
                          out: torch.Tensor | None = None) -> torch.Tensor:
    """`sampling_probs` as it was before the sort-free rule: softmax(logits / T) cut to top-k,
    then top-p, by a stable sort and a cumulative sum."""
    temperature = params.temperature.clamp_min(GREEDY_EPS)[:, None]
    sorted_p, order = torch.softmax(logits.float() / temperature, -1).sort(
        dim=-1, descending=True, stable=True)
    rank = torch.arange(sorted_p.shape[-1], device=sorted_p.device)
    sorted_p.masked_fill_(rank >= params.top_k[:, None], 0.0)
    before = sorted_p.cumsum(-1).sub_(sorted_p)
    sorted_p.masked_fill_(before >= params.top_p[:, None] * sorted_p.sum(-1, keepdim=True), 0.0)
    out = torch.empty_like(sorted_p) if out is None else out
    out.scatter_(-1, order, sorted_p)
    return out.div_(out.sum(-1, keepdim=True))


def check_rows(kind: str, dtype: torch.dtype, vocab: int, rows, seed: int,
               device: str = "cpu", params_fn=params_of) -> int:
    """`sampling_probs` on fresh logits of `kind` against the reference, row by row, with the
    parameters `params_fn(rows, vocab, device)`; returns how many rows were checked exactly."""
    g = torch.Generator().manual_seed(seed)
    logits = logits_of(kind, len(rows), vocab, g).to(device=device, dtype=dtype)
    got = sampling_probs(logits, params_fn(rows, vocab, device)).cpu()
    logits = logits.cpu()
    return sum(check_row(got[i], logits[i], t, vocab if k is None else k, p,
                          f"{kind} {dtype} seed {seed} row {i} (T={t}, k={k}, p={p})")
               for i, (t, k, p) in enumerate(rows))


