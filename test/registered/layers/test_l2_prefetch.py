"""The L2 prefetch's plan (`triton_ops/l2_prefetch.py`): which lines of o_proj and gate | up a
budget buys, how the lines spread over the qkv kernel's programs, what it refuses, and when a
layer asks for none (no budget, more than one row, no compiled CUDA). The prefetch itself is
PTX, which the interpreter cannot run: `test_l2_prefetch_cuda.py` checks that it changes no
value, and `sm90_builds` builds it offline."""

import sys

import pytest
import torch

from sglang_aux.srt.layers.decode_gemv import l2_prefetch_plan
from sglang_aux.srt.layers.triton_ops import l2_prefetch
from sglang_aux.srt.layers.triton_ops.dispatch import (
    L2_PREFETCH_BULK_ENV_VAR,
    L2_PREFETCH_ENV_VAR,
    check_kernel_switches,
)
from sglang_aux.srt.layers.triton_ops.l2_prefetch import (
    BULK_BYTES,
    LINE_BYTES,
    L2Prefetch,
    L2Region,
    budget_bytes,
    plan_l2_prefetch,
)
from sglang_aux.test.ci.ci_register import register_cpu_ci

register_cpu_ci(est_time=5, suite="default")

HIDDEN, INTER = 1536, 8960  # Qwen2.5-1.5B: o_proj [H, H] and gate | up [2 I, H] in bf16
ROW = HIDDEN * 2


def _weights(dtype=torch.bfloat16):
    return torch.empty(HIDDEN, HIDDEN, dtype=dtype), torch.empty(2 * INTER, HIDDEN, dtype=dtype)


def test_a_budget_buys_o_proj_then_both_halves_of_gate_up():
    o, gu = _weights()
    plan = plan_l2_prefetch(16 << 20, o, gu)
    first, gate, up = plan.regions
    assert first.start is o and first.nbytes == o.nbytes  # all of o_proj
    pair_rows = ((16 << 20) - o.nbytes) // (2 * ROW)
    assert gate.nbytes == up.nbytes == pair_rows * ROW
    assert gate.start.data_ptr() == gu.data_ptr()
    assert up.start.data_ptr() == gu.data_ptr() + INTER * ROW
    assert plan.nbytes <= 16 << 20 < plan.nbytes + 2 * ROW
    assert plan.unit == LINE_BYTES and plan.requests == plan.nbytes // LINE_BYTES


def test_a_small_budget_buys_o_projs_first_rows_and_a_large_one_stops_at_the_weights():
    o, gu = _weights()
    (only,) = plan_l2_prefetch(1 << 20, o, gu).regions
    assert only.start is o and only.nbytes == (1 << 20) // ROW * ROW
    whole = plan_l2_prefetch(1 << 30, o, gu, BULK_BYTES)
    assert [r.nbytes for r in whole.regions] == [o.nbytes, gu.nbytes // 2, gu.nbytes // 2]
    # 16 KiB requests: o_proj's 4.5 MiB in 288, each gate | up half's 27.5 MB in 1,680
    assert whole.requests == 288 + 2 * 1680


def test_what_gets_no_plan():
    o, gu = _weights()
    assert plan_l2_prefetch(0, o, gu) is None
    assert plan_l2_prefetch(ROW - 1, o, gu) is None  # under one row of either
    assert plan_l2_prefetch(16 << 20, o.t(), gu) is None  # not contiguous
    assert plan_l2_prefetch(16 << 20, o, gu[1:]) is None  # odd rows: no halves
    assert plan_l2_prefetch(16 << 20, o, gu.float()) is None  # two dtypes
    odd = torch.empty(4, 9, dtype=torch.bfloat16)  # 18-byte rows: a bulk request needs 16 | n
    assert plan_l2_prefetch(1 << 20, odd, torch.empty(4, 9, dtype=torch.bfloat16)) is None


def test_requests_spread_over_the_programs_one_lane_each():
    o, gu = _weights()
    plan = plan_l2_prefetch(16 << 20, o, gu)
    args, share, tile = plan.launch_args(256, 256)
    assert share * 256 >= plan.requests > (share - 1) * 256 and tile == 512
    assert args[1::2] == [r.nbytes for r in plan.regions]
    bulk = plan_l2_prefetch(16 << 20, o, gu, BULK_BYTES)
    _, share, tile = bulk.launch_args(256, 256)
    assert share == 4 and tile == 256, "a lane per thread: none repeats another's request"
    odd = L2Prefetch((L2Region(o, BULK_BYTES + 16),), BULK_BYTES)
    assert odd.requests == 2, "the last request of a region takes what is left"
    short = L2Prefetch((L2Region(o, 4096),))
    args, share, tile = short.launch_args(256, 128)
    assert args == [o, 4096, o, 0, o, 0] and (share, tile) == (1, 128)


def test_regions_are_refused_when_they_cannot_launch():
    o, gu = _weights()
    with pytest.raises(ValueError, match="takes 1 to 3 regions, got 0"):
        L2Prefetch(())
    with pytest.raises(ValueError, match="takes 1 to 3 regions, got 4"):
        L2Prefetch((L2Region(o, 16),) * 4)
    with pytest.raises(ValueError,
                       match=r"share a dtype, got \['torch.bfloat16', 'torch.float32'\]"):
        L2Prefetch((L2Region(o, 16), L2Region(gu.float(), 16)))
    with pytest.raises(ValueError, match=r"positive multiples of 16 bytes, got \[16, 24\]"):
        L2Prefetch((L2Region(o, 16), L2Region(gu, 24)))
    with pytest.raises(ValueError, match="unit is 128 or 16384 bytes, got 4096"):
        L2Prefetch((L2Region(o, 16),), 4096)


def test_a_layer_asks_only_with_a_budget_one_row_and_compiled_cuda(monkeypatch):
    o, gu = torch.nn.Linear(HIDDEN, HIDDEN), torch.nn.Linear(HIDDEN, 2 * INTER)
    row = torch.empty(1, HIDDEN)
    monkeypatch.delenv(L2_PREFETCH_ENV_VAR, raising=False)
    assert budget_bytes() == 0 and l2_prefetch_plan(o, gu, row) is None  # off by default
    monkeypatch.setenv(L2_PREFETCH_ENV_VAR, "8")
    assert budget_bytes() == 8 << 20
    assert l2_prefetch_plan(o, gu, row) is None, "a CPU tensor: no PTX"
    monkeypatch.setattr(l2_prefetch, "can_prefetch", lambda x: True)
    plan = l2_prefetch_plan(o, gu, row)
    assert plan.regions[0].start is o.weight and plan.nbytes <= 8 << 20
    assert plan.unit == LINE_BYTES
    monkeypatch.setenv(L2_PREFETCH_BULK_ENV_VAR, "1")
    assert l2_prefetch_plan(o, gu, row).unit == BULK_BYTES
    assert l2_prefetch_plan(o, gu, torch.empty(2, HIDDEN)) is None, "two rows: cuBLAS's step"
    monkeypatch.setenv(L2_PREFETCH_ENV_VAR, "5")
    with pytest.raises(ValueError, match=rf"^{L2_PREFETCH_ENV_VAR}='5'; choose from 0, 4, 8, "):
        check_kernel_switches()


if __name__ == "__main__":
    sys.exit(pytest.main([__file__, "-q"]))
