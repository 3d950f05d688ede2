"""Aux capture contracts (SPEC 3.1): the packer equals the list path, in the caller's storage."""

import sys

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from sglang_aux.srt.layers.aux_hidden_states import (
    AuxHiddenStateList,
    AuxHiddenStatePacker,
    SupportsSharedAuxHiddenStates,
    pack_aux_hidden_states,
)
from sglang_aux.test.ci.ci_register import register_cpu_ci

register_cpu_ci(est_time=10, suite="default")


def _captures(k: int, tokens: int, hidden: int, seed: int = 0) -> list[torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    return [torch.randn(tokens, hidden, generator=g) for _ in range(k)]


@settings(max_examples=25, deadline=None)
@given(k=st.integers(1, 6), tokens=st.integers(1, 9), hidden=st.integers(1, 24),
       seed=st.integers(0, 1000))
def test_packer_out_path_equals_list_concat_in_caller_storage(k, tokens, hidden, seed):
    caps = _captures(k, tokens, hidden, seed)
    big = torch.full((tokens + 5, k * hidden), float("nan"))
    out = big[:tokens]
    packer = AuxHiddenStatePacker(k, out=out)
    packer.extend(caps)
    packed = packer.finalize()
    assert packed.data_ptr() == big.data_ptr()
    assert torch.equal(packed, pack_aux_hidden_states(caps))
    assert torch.isnan(big[tokens:]).all(), "rows outside the slice were written"


def test_packer_without_out_allocates_and_matches_list_path():
    caps = _captures(3, 4, 8)
    lst = AuxHiddenStateList()
    packer = AuxHiddenStatePacker(3)
    for c in caps:
        lst.capture(c)
        packer.capture(c)
    assert len(packer) == 3
    assert torch.equal(packer.finalize(), pack_aux_hidden_states(lst))


def test_list_capture_clones_unless_owned():
    x = torch.ones(2, 4)
    lst = AuxHiddenStateList()
    lst.capture(x)
    lst.capture(x, owned=True)
    x.add_(1)
    assert torch.equal(lst[0], torch.ones(2, 4))
    assert lst[1] is x


def test_packer_capture_is_not_aliased_to_later_inplace_updates():
    x = torch.ones(2, 4)
    packer = AuxHiddenStatePacker(1)
    packer.capture(x, owned=False)
    x.mul_(5)
    assert torch.equal(packer.finalize(), torch.ones(2, 4))


@pytest.mark.parametrize("bad", [torch.zeros(3, 16), torch.zeros(4, 12),
                                 torch.zeros(4, 16, dtype=torch.float64)])
def test_buffer_that_does_not_fit_raises_naming_both_shapes(bad):
    packer = AuxHiddenStatePacker(2, out=bad)
    with pytest.raises(ValueError) as e:
        packer.slot(torch.zeros(4, 8))
    assert str(tuple(bad.shape)) in str(e.value) and "(4, 16)" in str(e.value)


def test_capture_past_k_raises_without_writing():
    out = torch.zeros(2, 8)
    packer = AuxHiddenStatePacker(2, out=out)
    packer.extend([torch.ones(2, 4), torch.ones(2, 4)])
    with pytest.raises(RuntimeError, match="exceeds"):
        packer.append(torch.full((2, 4), 7.0))
    assert not (out == 7).any()


def test_mismatched_later_capture_raises():
    packer = AuxHiddenStatePacker(2)
    packer.append(torch.zeros(2, 4))
    with pytest.raises(ValueError, match="does not match"):
        packer.append(torch.zeros(3, 4))


def test_finalize_with_too_few_captures_raises():
    packer = AuxHiddenStatePacker(3)
    packer.append(torch.zeros(1, 4))
    with pytest.raises(RuntimeError, match="got 1 aux captures, expected 3"):
        packer.finalize()


def test_pack_aux_hidden_states_forms():
    t = torch.randn(2, 6)
    assert pack_aux_hidden_states(t) is t
    assert pack_aux_hidden_states([t]) is t
    assert torch.equal(pack_aux_hidden_states([t, t]), torch.cat([t, t], -1))


def test_protocol_is_structural():
    class OptsIn:
        def get_packed_aux_hidden_size(self) -> int:
            return 12

        def get_aux_hidden_states_width(self) -> int:
            return 12

    assert isinstance(OptsIn(), SupportsSharedAuxHiddenStates)
    assert not isinstance(object(), SupportsSharedAuxHiddenStates)


if __name__ == "__main__":
    sys.exit(pytest.main([__file__, "-q"]))
