"""Sort-free top-k / top-p (`sampling_probs`) == a sorted reference, for the torch twin and the
Triton kernel (Triton's CPU interpreter): kept sets exactly, probabilities allclose, on many
(T, top_k, top_p) rows over random, tied, constant, peaked and flat logits in fp32/bf16/fp16.
Where top-p decides within 1e-6 of a cumulative mass, either side of that token is accepted."""

import os

# NOTE: must precede any @triton.jit definition, i.e. any import of the sampler.
os.environ["TRITON_INTERPRET"] = "1"

import sys  # noqa: E402

import pytest  # noqa: E402
import torch  # noqa: E402

from sglang_aux.srt.layers.triton_ops.dispatch import ENV_VAR  # noqa: E402
from sglang_aux.srt.sampling.sampler import SamplingTensors, sampling_probs  # noqa: E402
from sglang_aux.srt.sampling.top_k_top_p_kernel import MAX_BLOCK  # noqa: E402
from sglang_aux.test.ci.ci_register import register_cpu_ci  # noqa: E402

register_cpu_ci(est_time=60, suite="default")

BOUNDARY = 1e-6
TINY = 1e-30


def _check_row(got: torch.Tensor, logits: torch.Tensor, t: float, k: int, p: float,
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
    torch.testing.assert_close(mine, want, rtol=1e-4, atol=1e-6, msg=what)
    return not loose and n_lo == n_hi


def _logits(kind: str, rows: int, vocab: int, g: torch.Generator) -> torch.Tensor:
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


def _params(rows, vocab: int) -> SamplingTensors:
    t, k, p = zip(*rows, strict=True)
    t = torch.tensor(t, dtype=torch.float32)
    return SamplingTensors(temperature=t,
                           top_k=torch.tensor([vocab if v is None else v for v in k]),
                           top_p=torch.tensor(p, dtype=torch.float32),
                           seed=torch.arange(len(rows)),
                           is_greedy=torch.zeros(len(rows), dtype=torch.bool))


def _check(kind: str, dtype: torch.dtype, vocab: int, rows, seed: int) -> int:
    g = torch.Generator().manual_seed(seed)
    logits = _logits(kind, len(rows), vocab, g).to(dtype)
    with torch.no_grad():  # the fused-kernel dispatch runs the twin while autograd records
        got = sampling_probs(logits, _params(rows, vocab))
    return sum(_check_row(got[i], logits[i], t, vocab if k is None else k, p,
                          f"{kind} {dtype} seed {seed} row {i} (T={t}, k={k}, p={p})")
               for i, (t, k, p) in enumerate(rows))


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("kind", KINDS)
def test_twin_matches_the_sorted_reference(kind, dtype):
    exact = sum(_check(kind, dtype, vocab, ROWS, seed) for seed, vocab in ((0, 1000), (1, 97)))
    assert exact >= 3 * len(ROWS) // 2, f"only {exact} rows checked exactly"


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])  # bf16: broken interpreter
@pytest.mark.parametrize("kind", KINDS)
def test_kernel_matches_the_sorted_reference(kind, dtype, monkeypatch):
    monkeypatch.setenv(ENV_VAR, "force")
    rows = ROWS[::2] if kind in ("random", "ties") else ROWS[1::3]
    assert _check(kind, dtype, 300, rows, seed=7) >= len(rows) // 2


@pytest.mark.parametrize("kind", ["ties", "constant"])
def test_kernel_carries_ties_across_chunks(kind, monkeypatch):
    """A row longer than the kernel's chunk: ties at the cut span several chunks."""
    monkeypatch.setenv(ENV_VAR, "force")
    vocab = 2 * MAX_BLOCK + 500
    rows = [(1.0, 3000, 1.0), (1.0, None, 0.7), (0.8, 2500, 0.9)]
    assert _check(kind, torch.float32, vocab, rows, seed=8) >= 2


def test_ties_at_the_cut_go_to_the_lowest_indices():
    # probabilities ~ e^2 (x3), e^1 (x2), e^0: ties at the top-k cut, inside and at top-p cuts
    logits = torch.tensor([[0.0, 2.0, 1.0, 2.0, 2.0, 1.0]]).expand(4, -1)
    rows = [(1.0, 2, 1.0), (1.0, None, 0.25), (1.0, None, 0.6), (1.0, 4, 1.0)]
    kept = (sampling_probs(logits, _params(rows, 6)) > 0).int().tolist()
    assert kept == [[0, 1, 0, 1, 0, 0], [0, 1, 0, 0, 0, 0], [0, 1, 0, 1, 1, 0], [0, 1, 1, 1, 1, 0]]


def test_out_is_filled_and_checked():
    logits = torch.randn(4, 50, generator=torch.Generator().manual_seed(3))
    params = _params(ROWS[:4], 50)
    out = torch.full((4, 50), float("nan"))
    assert sampling_probs(logits, params, out=out) is out
    torch.testing.assert_close(out, sampling_probs(logits, params))
    with pytest.raises(ValueError, match=r"float32 \(4, 50\).*\(4, 49\)"):
        sampling_probs(logits, params, out=torch.empty(4, 49))


def test_twin_never_syncs_with_the_host(monkeypatch):
    """Nothing reads a device value on the host (graph capture would fail on such a read);
    the kernel is one launch, captured on the H200 (test_top_k_top_p_cuda.py)."""
    monkeypatch.setenv(ENV_VAR, "off")
    logits = torch.randn(6, 64, generator=torch.Generator().manual_seed(4))
    params = _params(ROWS[:6], 64)
    expected = sampling_probs(logits, params)

    def refuse(*_args, **_kwargs):
        raise AssertionError("host sync")

    for name in ("item", "tolist", "nonzero", "__bool__", "__int__", "__float__", "cpu"):
        monkeypatch.setattr(torch.Tensor, name, refuse)
    monkeypatch.setattr(torch, "nonzero", refuse)
    got = sampling_probs(logits, params)
    monkeypatch.undo()
    torch.testing.assert_close(got, expected)


if __name__ == "__main__":
    sys.exit(pytest.main([__file__, "-q"]))
