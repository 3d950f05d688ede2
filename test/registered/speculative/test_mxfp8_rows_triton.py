"""`--mxfp8-rows-decode triton` (`MXFP8Rows(decoder="triton")`): a batch of encoded rows decodes
to the torch decoder's bytes, hidden states and raw columns, padding included, under Triton's
interpreter here in fp32 (bf16 on the GPU: `test_train_dflash_cuda.py`); an unknown decoder is
named."""

import os
import sys

import torch

if not torch.cuda.is_available():
    # Must precede the first @triton.jit definition: the decoder runs the Triton kernel.
    os.environ.setdefault("TRITON_INTERPRET", "1")

import pytest  # noqa: E402

from sglang_aux.srt.layers.quantization import dequant_gemm  # noqa: E402
from sglang_aux.test.ci.ci_register import register_cpu_ci  # noqa: E402
from sglang_aux.tools.dflash_training.mxfp8_rows import MXFP8Rows  # noqa: E402
from sglang_aux.tools.dflash_training.target_head import (  # noqa: E402
    logsumexp_columns,
    logsumexp_columns_count,
)

register_cpu_ci(est_time=20, suite="default")

# Triton's interpreter computes through numpy, which has no bf16: bf16 rows on the GPU only
DTYPES = [torch.bfloat16, torch.float32] if torch.cuda.is_available() else [torch.float32]


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("with_raw", [False, True])
def test_the_triton_decoder_gives_the_torch_decoders_bytes(dtype, with_raw, monkeypatch):
    calls = []
    real = dequant_gemm.dequantize_rows
    monkeypatch.setattr(dequant_gemm, "dequantize_rows",
                        lambda *a: calls.append(len(a[0])) or real(*a))
    g = torch.Generator().manual_seed(1)
    t, cols = 70, 6 * 32
    hidden = torch.randn(t, cols, generator=g) * torch.logspace(-4, 4, cols)
    hidden[:, 64:96] = 0.0
    raw = logsumexp_columns(torch.randn(t, generator=g) * 30, dtype) if with_raw else None
    rows = hidden.to(dtype) if raw is None else torch.cat([hidden.to(dtype), raw], -1)
    n_raw = logsumexp_columns_count(dtype) if with_raw else 0
    torch_codec = MXFP8Rows(cols, n_raw, dtype)
    triton_codec = MXFP8Rows(cols, n_raw, dtype, decoder="triton")
    encoded = torch_codec.encode(rows)
    # a batch's layout: [N, T, width], the last rows zero padding
    batch = torch.cat([encoded, torch.zeros_like(encoded[:20])]).view(3, 30, -1)
    a, b = torch_codec.decode(batch), triton_codec.decode(batch)
    assert a.shape == b.shape == (3, 30, cols + n_raw) and b.dtype == dtype
    assert torch.equal(a.view(torch.uint8), b.view(torch.uint8))
    assert not b.view(-1, cols + n_raw)[t:].any()  # the padding decodes to zeros
    assert torch.equal(triton_codec.decode(encoded).view(torch.uint8),
                       torch_codec.decode(encoded).view(torch.uint8))
    assert calls == [90, t]  # one kernel a batch, over all its rows; torch's decode none


def test_an_unknown_decoder_is_named():
    with pytest.raises(ValueError, match=r"decoder must be one of \('torch', 'triton'\), got "
                                         r"'cuda'"):
        MXFP8Rows(32, 0, torch.bfloat16, decoder="cuda")


if __name__ == "__main__":
    sys.exit(pytest.main([__file__, "-q"]))
