"""The key split a fixed-layout launch picks and the merge that combines it, off the GPU:
one-token launches fill the SMs up to at least PROGRAMS_PER_SM programs each, multi-token
launches (verify, draft block) at most that many (measured on the H200, docs/kernels.md); the
merge gives the same bits whatever number of heads a program combines (each head's sum runs
over the splits in one order), 0 for rows no split saw a key for, and refuses a width that is
not a power of two. Kernels via Triton's CPU interpreter."""

import os

# NOTE: must precede any @triton.jit definition, i.e. any import of the kernels.
os.environ["TRITON_INTERPRET"] = "1"

import sys  # noqa: E402

import pytest  # noqa: E402
import torch  # noqa: E402

from sglang_aux.srt.layers.attention.triton_backend import TritonAttnBackend  # noqa: E402
from sglang_aux.srt.layers.attention.triton_ops import tiling  # noqa: E402
from sglang_aux.srt.layers.attention.triton_ops.decode_attention import (  # noqa: E402
    grid_kv_splits,
)
from sglang_aux.srt.layers.attention.triton_ops.merge_attn_states import (  # noqa: E402
    merge_attn_states,
)
from sglang_aux.srt.layers.attention.triton_ops.tiling import (  # noqa: E402
    NO_KEYS,
    pick_num_kv_splits,
)
from sglang_aux.test.ci.ci_register import register_cpu_ci  # noqa: E402
from sglang_aux.test.kernel_checks import fresh_seed  # noqa: E402

register_cpu_ci(est_time=10, suite="default")

H200_SMS = 132
CUDA = torch.device("cuda", 0)


@pytest.fixture
def h200(monkeypatch):
    monkeypatch.setattr(tiling, "sm_count", lambda index: H200_SMS)


@pytest.mark.parametrize("programs,one_token,multi_token", [
    (4, 16, 16),  # bs 1 (q_len 16: 2 kv heads x 2 row tiles): the cap either way
    (32, 9, 8),  # bs 8 verify: 264 / 32
    (64, 5, 4),  # bs 32 decode / bs 16 verify
    (128, 3, 2),  # bs 32 verify: 2 splits took 31.3 us a call where 3 took 36.1
    (300, 1, 1),  # never below one
])
def test_split_fills_the_sms_at_least_or_at_most(h200, programs, one_token, multi_token):
    assert pick_num_kv_splits(programs, CUDA) == one_token
    assert pick_num_kv_splits(programs, CUDA, at_most=True) == multi_token
    assert grid_kv_splits(programs, 4096, CUDA, "launch", 256) == one_token
    assert grid_kv_splits(programs, 4096, CUDA, "launch", 256, q_len=16) == multi_token


def test_split_off_cuda_and_in_kernel_bound(h200):
    assert pick_num_kv_splits(4, torch.device("cpu")) == 1
    # the in-kernel merge never splits past the pool's context bound
    assert grid_kv_splits(4, 512, CUDA, "in_kernel", 256) == 2


def _partials(tokens, heads, splits, head_dim, empty_rows=()):
    fresh_seed()
    out = torch.randn(tokens, heads, splits, head_dim)
    lse = torch.randn(tokens, heads, splits) * 4
    lse[:, :, -1] = NO_KEYS.value  # a split that saw no key weighs 0
    for t in empty_rows:  # a padding row: no split saw a key, its outputs never written
        lse[t] = NO_KEYS.value
        out[t] = float("nan")
    return out, lse


@pytest.mark.parametrize("heads", [12, 3])
def test_merge_is_bitwise_equal_for_every_heads_per_program(heads):
    out, lse = _partials(5, heads, 3, 16, empty_rows=[4])
    w = torch.softmax(lse[:4] * torch.log(torch.tensor(2.0)), dim=-1)
    expected = (w[..., None] * out[:4]).sum(2)
    results = []
    for per_program in (1, 2, 4, 16):
        merged = torch.full((5, heads, 16), float("nan"))
        merge_attn_states(out, lse, merged, per_program)
        results.append(merged)
    torch.testing.assert_close(results[0][:4], expected, rtol=1e-5, atol=1e-5)
    for merged in results:
        assert torch.equal(merged, results[0])
        assert torch.equal(merged[4], torch.zeros(heads, 16))


def test_merge_width_must_be_a_power_of_two():
    out, lse = _partials(1, 4, 2, 16)
    with pytest.raises(ValueError, match="heads_per_program must be a power of two, got 3"):
        merge_attn_states(out, lse, torch.empty(1, 4, 16), 3)
    with pytest.raises(ValueError, match="merge_heads must be a power of two, got 6"):
        TritonAttnBackend(merge_heads=6)


if __name__ == "__main__":
    sys.exit(pytest.main([__file__, "-q"]))
