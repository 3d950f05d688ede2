"""Aux rows kept as MXFP8 (`--mxfp8-rows`, `dflash_training/mxfp8_rows.py`): a row decodes to its
exact MXFP8 round trip with the raw columns (DSpark's kept logsumexp) bit for bit, a batch of
encoded rows is the batch of their round trips padding included, and a training run with the
flag writes the draft a run over round-tripped rows writes, bit for bit, for DFlash and for
DSpark with its kept logsumexp. Bad shapes are named."""

import sys

import pytest
import torch
from safetensors.torch import load_file

from sglang_aux.srt.layers.quantization.mxfp8 import quantize_mxfp8
from sglang_aux.srt.layers.quantization.mxfp8_format import dequantize_mxfp8
from sglang_aux.test.ci.ci_register import register_cpu_ci
from sglang_aux.test.gsm8k_data import local_path_or_skip
from sglang_aux.test.runtime_utils import tiny_checkpoint
from sglang_aux.tools import train_dflash
from sglang_aux.tools.dflash_training import features
from sglang_aux.tools.dflash_training.data import Sample
from sglang_aux.tools.dflash_training.mxfp8_rows import MXFP8Rows
from sglang_aux.tools.dflash_training.sequence_set import SequenceSet
from sglang_aux.tools.dflash_training.target_head import (
    logsumexp_columns,
    logsumexp_columns_count,
    read_logsumexp,
)

register_cpu_ci(est_time=40, suite="default")

CPU = torch.device("cpu")


def _hidden(t: int, cols: int, dtype: torch.dtype, seed: int = 0) -> torch.Tensor:
    """Hidden-state-like rows: mostly small, a few large channels (as a target's early layers
    have), one all-zero 32-column block."""
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(t, cols, generator=g)
    x[:, 5] *= 300.0
    x[:, 32:64] = 0.0
    return x.to(dtype)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
def test_a_row_decodes_to_its_mxfp8_round_trip_and_its_raw_bytes(dtype):
    lse = torch.tensor([3.25, -1.5e3, 7.0e-3, 42.0])
    raw = logsumexp_columns(lse, dtype)
    rows = torch.cat([_hidden(4, 192, dtype), raw], dim=-1)
    codec = MXFP8Rows(192, logsumexp_columns_count(dtype), dtype)
    encoded = codec.encode(rows)
    assert encoded.dtype == torch.uint8 and encoded.shape == (4, 192 + 6 + raw.shape[-1]
                                                              * dtype.itemsize)
    decoded = codec.decode(encoded)
    values, scales = quantize_mxfp8(rows[:, :192].contiguous())
    assert decoded.dtype == dtype
    assert torch.equal(decoded[:, :192], dequantize_mxfp8(values, scales, dtype))
    assert torch.equal(decoded[:, 192:], raw)
    assert torch.equal(read_logsumexp(decoded[:, 192:]), lse)
    assert not decoded[:, 32:64].any() and not torch.equal(decoded[:, :192], rows[:, :192])
    # zero bytes (a batch's padding) decode to zero rows; any leading dims decode
    assert not codec.decode(torch.zeros(2, 3, codec.width, dtype=torch.uint8)).any()
    assert torch.equal(codec.decode(encoded.view(2, 2, -1)), decoded.view(2, 2, -1))


def test_the_real_pairs_rows_take_33_bytes_for_64_of_bf16():
    """Qwen2.5-1.5B's five aux states (5 x 1,536 bf16 columns): 7,920 bytes a token instead of
    15,360; DSpark's rows with the final state and the kept logsumexp likewise."""
    assert MXFP8Rows(5 * 1536, 0, torch.bfloat16).width == 7920
    assert MXFP8Rows(6 * 1536, 2, torch.bfloat16).width == 6 * 1536 * 33 // 32 + 4


def test_bad_rows_are_named():
    codec = MXFP8Rows(64, 0, torch.bfloat16)
    with pytest.raises(ValueError, match=r"expected \[T, 64\] torch.bfloat16 rows .* got "
                                         r"\[3, 96\] torch.bfloat16"):
        codec.encode(torch.zeros(3, 96, dtype=torch.bfloat16))
    with pytest.raises(ValueError, match=r"got \[3, 64\] torch.float32"):
        codec.encode(torch.zeros(3, 64))
    with pytest.raises(ValueError, match=r"expected \[\.\.\., 66\] uint8 encoded rows, got "
                                         r"\[3, 64\] torch.uint8"):
        codec.decode(torch.zeros(3, 64, dtype=torch.uint8))
    with pytest.raises(ValueError, match="positive multiple of 32 hidden-state columns, got 48"):
        MXFP8Rows(48, 0, torch.bfloat16)


def test_a_batch_of_encoded_rows_is_the_batch_of_their_round_trips():
    """Two sources' prefixes kept once, a sequence drawn twice, bucket padding: the batch a set
    of encoded rows builds is, bit for bit, the batch of a set holding the rows' round trips."""
    codec = MXFP8Rows(128, 0, torch.bfloat16)
    lens, prompt = [40, 57, 23], 12
    prefixes = [_hidden(10, 128, torch.bfloat16, seed=1), _hidden(6, 128, torch.bfloat16, 2)]
    of = [0, 1, 0]
    own = [_hidden(n - len(prefixes[of[i]]), 128, torch.bfloat16, seed=10 + i)
           for i, n in enumerate(lens)]
    samples = [Sample(list(range(prompt)), list(range(n - prompt))) for n in lens]

    def round_trip(x):
        return codec.decode(codec.encode(x))

    plain = SequenceSet(samples, [round_trip(a) for a in own], CPU,
                        prefix_aux=[round_trip(p) for p in prefixes], prefix_of=of)
    packed = SequenceSet(samples, [codec.encode(a) for a in own], CPU,
                         prefix_aux=[codec.encode(p) for p in prefixes], prefix_of=of,
                         codec=codec)
    assert all(a.dtype == torch.uint8 for a in packed.aux)
    for index, bucket in (([1, 0, 2], 0), ([2, 0, 2], 16)):
        a, b = plain.batch(index, bucket), packed.batch(index, bucket)
        assert b.aux.dtype == torch.bfloat16 and torch.equal(a.aux, b.aux)
        assert torch.equal(a.ids, b.ids) and torch.equal(a.rows, b.rows)


@pytest.fixture(scope="module")
def target(tmp_path_factory):
    return tiny_checkpoint("tiny-llama", tmp_path_factory.mktemp("ckpt"))


@pytest.mark.parametrize("algorithm", ["dflash", "dspark_lse"])
def test_training_on_mxfp8_rows_is_training_on_their_round_trips(target, tmp_path,
                                                                  monkeypatch, algorithm):
    """`--mxfp8-rows` keeps the features encoded and decodes each batch: the draft it writes
    equals, bit for bit, the draft of a run whose features were the rows' round trips (the
    DSpark run's kept logsumexp columns pass as bytes)."""
    local_path_or_skip("train")
    common = ["--smoke", "--target", target, "--num-samples", "4", "--steps", "3", "--seed", "3"]
    if algorithm == "dspark_lse":
        common += ["--algorithm", "dspark", "--block-size", "3", "--token-map-size", "64",
                   "--train-over-token-map", "--target-logsumexp"]
    encoded_widths = []
    real_encode = MXFP8Rows.encode

    def spy(self, rows):
        out = real_encode(self, rows)
        encoded_widths.append((rows.shape[-1], out.shape[-1], out.dtype))
        return out

    monkeypatch.setattr(MXFP8Rows, "encode", spy)
    train_dflash.main([*common, "--mxfp8-rows", "--out", str(tmp_path / "mxfp8")])
    assert encoded_widths and all(d == torch.uint8 for _, _, d in encoded_widths)
    columns, width = encoded_widths[0][:2]
    raw = columns % 32
    assert raw == (1 if algorithm == "dspark_lse" else 0)  # the tiny target's rows are fp32
    assert width == (columns - raw) * 33 // 32 + 4 * raw

    real_rows = features._rows

    def round_tripped(out, final_hidden, logsumexp_head=None, codec=None):
        assert codec is None
        rows = real_rows(out, final_hidden, logsumexp_head)
        c = MXFP8Rows(rows.shape[-1] - raw, raw, rows.dtype)
        return c.decode(real_encode(c, rows))

    monkeypatch.setattr(features, "_rows", round_tripped)
    train_dflash.main([*common, "--out", str(tmp_path / "plain")])
    a = load_file(tmp_path / "mxfp8/model.safetensors")
    b = load_file(tmp_path / "plain/model.safetensors")
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


if __name__ == "__main__":
    sys.exit(pytest.main([__file__, "-q"]))
