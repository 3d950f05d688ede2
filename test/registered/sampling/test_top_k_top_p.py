"""Sort-free top-k / top-p (`sampling_probs`) == a sorted reference (`top_k_top_p_reference`),
for the torch twin and the Triton kernel (Triton's CPU interpreter): kept sets exactly,
probabilities allclose, on many (T, top_k, top_p) rows over random, tied, constant, peaked and
flat logits in fp32/bf16/fp16, and at SmolLM2's vocabulary."""

import os

# NOTE: must precede any @triton.jit definition, i.e. any import of the sampler.
os.environ["TRITON_INTERPRET"] = "1"

import sys  # noqa: E402

import pytest  # noqa: E402
import torch  # noqa: E402

from sglang_aux.srt.layers.triton_ops.dispatch import ENV_VAR  # noqa: E402
from sglang_aux.srt.sampling.sampler import sampling_probs  # noqa: E402
from sglang_aux.srt.sampling.top_k_top_p_kernel import CHUNK  # noqa: E402
from sglang_aux.test.ci.ci_register import register_cpu_ci  # noqa: E402
from sglang_aux.test.top_k_top_p_reference import (  # noqa: E402
    DTYPES,
    KINDS,
    ROWS,
    check_rows,
    params_of,
)

register_cpu_ci(est_time=60, suite="default")

SMOLLM2_VOCAB = 49152


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("kind", KINDS)
def test_twin_matches_the_sorted_reference(kind, dtype):
    exact = sum(check_rows(kind, dtype, vocab, ROWS, seed) for seed, vocab in ((0, 1000), (1, 97)))
    assert exact >= 3 * len(ROWS) // 2, f"only {exact} rows checked exactly"


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_twin_at_a_real_vocabulary(dtype):
    """Masses over 49,152 tokens: an inaccurate sum (bmm's sequential one is ~1e-4 off) moves
    top-p cuts by many tokens."""
    rows = [(0.8, None, 0.9), (1.0, None, 0.95), (0.7, 50, 0.95), (1.2, None, 0.5)]
    for kind in ("random", "flat"):
        assert check_rows(kind, dtype, SMOLLM2_VOCAB, rows, seed=5) >= 2


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])  # bf16: broken interpreter
@pytest.mark.parametrize("kind", KINDS)
def test_kernel_matches_the_sorted_reference(kind, dtype, monkeypatch):
    monkeypatch.setenv(ENV_VAR, "force")
    rows = ROWS[::2] if kind in ("random", "ties") else ROWS[1::3]
    assert check_rows(kind, dtype, 300, rows, seed=7) >= len(rows) // 2


@pytest.mark.parametrize("kind", ["ties", "constant"])
def test_kernel_carries_ties_across_chunks(kind, monkeypatch):
    """A row longer than the kernel's chunk: ties at the cut span several chunks."""
    monkeypatch.setenv(ENV_VAR, "force")
    vocab = 2 * CHUNK + 500
    rows = [(1.0, 3000, 1.0), (1.0, None, 0.7), (0.8, 2500, 0.9)]
    assert check_rows(kind, torch.float32, vocab, rows, seed=8) >= 2


def test_ties_at_the_cut_go_to_the_lowest_indices():
    # probabilities ~ e^2 (x3), e^1 (x2), e^0: ties at the top-k cut, inside and at top-p cuts
    logits = torch.tensor([[0.0, 2.0, 1.0, 2.0, 2.0, 1.0]]).expand(4, -1)
    rows = [(1.0, 2, 1.0), (1.0, None, 0.25), (1.0, None, 0.6), (1.0, 4, 1.0)]
    kept = (sampling_probs(logits, params_of(rows, 6)) > 0).int().tolist()
    assert kept == [[0, 1, 0, 1, 0, 0], [0, 1, 0, 0, 0, 0], [0, 1, 0, 1, 1, 0], [0, 1, 1, 1, 1, 0]]


def test_out_is_filled_and_checked():
    logits = torch.randn(4, 50, generator=torch.Generator().manual_seed(3))
    params = params_of(ROWS[:4], 50)
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
    params = params_of(ROWS[:6], 64)
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
