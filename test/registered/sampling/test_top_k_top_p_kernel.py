"""The split top-k / top-p kernel in Triton's CPU interpreter, chunks shrunk to 32 so a row
spans several programs (the interpreter costs ~10 ms a program: rows and vocabularies stay
small): the sorted reference at vocabularies that are and are not multiples of the chunk;
parameters as a decode step reads them (strided views: the H200's memory-flat failure);
a seeded request sampling alike in any batch layout (the old kernel fails this); a
row's result bitwise independent of its batch (1, 4, 8 rows); the same call twice bitwise
equal, for the kernel, the torch twin and `sample`; the kernel beside the twin."""

import os

# NOTE: must precede any @triton.jit definition, i.e. any import of the kernel.
os.environ["TRITON_INTERPRET"] = "1"

import functools  # noqa: E402
import sys  # noqa: E402

import pytest  # noqa: E402
import torch  # noqa: E402

from sglang_aux.srt.layers.triton_ops.dispatch import ENV_VAR  # noqa: E402
from sglang_aux.srt.sampling import top_k_top_p_kernel as kernel_module  # noqa: E402
from sglang_aux.srt.sampling.sampler import SamplingTensors, sample, sampling_probs  # noqa: E402
from sglang_aux.srt.sampling.sampling_params import SamplingParams  # noqa: E402
from sglang_aux.srt.sampling.sampling_rows import SamplingRows  # noqa: E402
from sglang_aux.srt.sampling.top_k_top_p_kernel import top_k_top_p_kernel  # noqa: E402
from sglang_aux.test.ci.ci_register import register_cpu_ci  # noqa: E402
from sglang_aux.test.top_k_top_p_reference import (  # noqa: E402
    ROWS,
    check_rows,
    gathered_params,
    logits_of,
    params_of,
)

register_cpu_ci(est_time=60, suite="default")

SMALL_CHUNK = 32


@pytest.fixture
def kernel(monkeypatch):
    """The engine's CUDA path, with rows of a few hundred tokens over several programs."""
    monkeypatch.setenv(ENV_VAR, "force")
    monkeypatch.setattr(kernel_module, "top_k_top_p_kernel",
                        functools.partial(top_k_top_p_kernel, chunk=SMALL_CHUNK))


def _batch(rows: int, vocab: int, seed: int) -> tuple[torch.Tensor, SamplingTensors]:
    logits = logits_of("random", rows, vocab, torch.Generator().manual_seed(seed))
    return logits, params_of([ROWS[i % len(ROWS)] for i in range(rows)], vocab)


def _rows(params: SamplingTensors, index: slice) -> SamplingTensors:
    return SamplingTensors(*(t[index] for t in (params.temperature, params.top_k, params.top_p,
                                                params.seed, params.is_greedy)))


# vocabularies of 3 chunks + 1 token and of 2 whole chunks
@pytest.mark.parametrize("kind, vocab", [("random", 97), ("ties", 97), ("constant", 97),
                                         ("ties", 64)])  # peaked, flat: test_top_k_top_p.py
def test_chunks_match_the_sorted_reference(kind, vocab, kernel):
    rows = ROWS[::2]
    exact = check_rows(kind, torch.float32, vocab, rows, seed=11)
    assert exact >= len(rows) // 2, f"only {exact} rows checked exactly"


def test_parameters_read_through_their_strides(kernel):
    """`SamplingRows.gather` gives `[rows]` views of `[rows, 2]` and `[rows, 3]` tables; reading
    them as contiguous took one row's seed for another's top_k and a temperature for a top_p,
    so sampled tokens depended on the batch layout."""
    params = gathered_params(ROWS, 40)
    assert params.top_k.stride() == (2,) and params.top_p.stride() == (3,)
    check_rows("ties", torch.float32, 40, ROWS, seed=12, params_fn=gathered_params)
    params = _rows(params, slice(0, 6))
    logits, _ = _batch(6, 40, seed=13)
    contiguous = SamplingTensors(*(t.contiguous() for t in (
        params.temperature, params.top_k, params.top_p, params.seed, params.is_greedy)))
    assert torch.equal(sampling_probs(logits, params), sampling_probs(logits, contiguous))


def test_a_seeded_request_samples_alike_in_any_batch_layout(kernel):
    """test_scheduler_step_loop_cuda.py's mix (greedy with random seeds, seeded T 0.8 / top-p 0.9 /
    top-k 20) in three layouts, through `SamplingRows` as a step samples: each request's
    token depends on its own logits, parameters and position only."""
    vocab = 40
    table = SamplingRows(6, vocab, "cpu")
    greedy, sampled = SamplingParams(temperature=0), SamplingParams(0, 0.8, 0.9, 20)
    for i in range(6):
        table.stage(i + 1, greedy if i % 2 == 0 else sampled, 2**61 + 7 * i if i % 2 == 0 else i)
    table.write(list(range(1, 7)))
    logits = logits_of("flat", 6, vocab, torch.Generator().manual_seed(18)) * 100
    positions = torch.full((6,), 9)
    tokens = {}
    for layout in ([0, 1, 2, 3, 4, 5], [3, 4, 5], [5, 1, 3]):
        index = torch.tensor(layout)
        got = table.sample(logits[index], index + 1, positions[index], all_greedy=False)
        tokens.update({(r, tuple(layout)): t for r, t in zip(layout, got.tolist(), strict=True)})
    for r in (1, 3, 5):
        assert len({t for (row, _), t in tokens.items() if row == r}) == 1, tokens


def test_a_row_does_not_depend_on_its_batch(kernel):
    logits, params = _batch(8, 33, seed=14)
    full = sampling_probs(logits, params)
    for size in (1, 4):
        for start in range(0, 8, 4):
            index = slice(start, start + size)
            alone = sampling_probs(logits[index], _rows(params, index))
            assert torch.equal(alone, full[index]), f"rows {start}..{start + size - 1}"


@pytest.mark.parametrize("path", ["kernel", "twin"])
def test_the_same_call_twice_is_bitwise_equal(path, kernel, monkeypatch):
    if path == "twin":
        monkeypatch.setenv(ENV_VAR, "off")
    logits, params = _batch(4, 40, seed=15)
    first = sampling_probs(logits, params)
    assert torch.equal(first, sampling_probs(logits, params))
    positions = torch.arange(4) * 37
    tokens = sample(logits, params, positions, all_greedy=False)
    assert torch.equal(tokens, sample(logits.clone(), params, positions, all_greedy=False))
    assert (first.gather(1, tokens[:, None]) > 0).all()  # drawn inside the kept sets


@pytest.mark.parametrize("rows", [1, 8])
def test_kernel_beside_the_twin(rows, kernel, monkeypatch):
    """Same rule, different float32 sums (chunked vs torch's): kept sets agree but on a mass
    edge, probabilities within rounding."""
    logits, params = _batch(rows, 97, seed=16 + rows)
    got = sampling_probs(logits, params)
    monkeypatch.setenv(ENV_VAR, "off")
    twin = sampling_probs(logits, params)
    same = ((got > 0) == (twin > 0)).all(-1)
    assert same.float().mean() >= 0.9, f"{int((~same).sum())} of {rows} rows differ"
    torch.testing.assert_close(got[same], twin[same], rtol=1e-5, atol=1e-7)


def test_per_row_parameters_are_checked():
    logits, params = _batch(4, 64, seed=17)
    out = torch.empty_like(logits)
    with pytest.raises(ValueError, match=r"top_k must have one entry per row \(4,\), got \(3,\)"):
        top_k_top_p_kernel(logits, params.temperature, params.top_k[:3], params.top_p, out)


if __name__ == "__main__":
    sys.exit(pytest.main([__file__, "-q"]))
