"""Two-batch overlap split (SPEC 3.2): children never see the parent's aux buffer, and a parent
field the split does not know raises instead of leaking into a child."""

import dataclasses
import sys

import pytest
import torch

from sglang_aux.srt.batch_overlap.two_batch_overlap import filter_batch, split_batch
from sglang_aux.srt.forward_state.forward_batch_info import ForwardBatch, ForwardMode
from sglang_aux.test.ci.ci_register import register_cpu_ci

register_cpu_ci(est_time=5, suite="default")


def _batch(mode: ForwardMode, per_req: list[int], **extra) -> ForwardBatch:
    n, bs = sum(per_req), len(per_req)
    return ForwardBatch(
        forward_mode=mode, batch_size=bs, input_ids=torch.arange(n),
        req_pool_indices=torch.arange(1, bs + 1), seq_lens=torch.tensor(per_req) + 10,
        seq_lens_cpu=torch.tensor(per_req) + 10, out_cache_loc=torch.arange(100, 100 + n),
        positions=torch.arange(n), req_to_token_pool=object(), token_to_kv_pool=object(),
        attn_backend=object(),
        extend_prefix_lens_cpu=[10] * bs if mode.is_extend() else None,
        extend_seq_lens_cpu=list(per_req) if mode.is_extend() else None, **extra)


def test_children_get_no_aux_buffer_and_the_right_rows():
    parent = _batch(ForwardMode.TARGET_VERIFY, [4, 4, 4],
                    aux_hidden_states_buffer=torch.zeros(12, 32),
                    next_token_logits_buffer=torch.zeros(12, 50))
    a, b = split_batch(parent)
    assert a.aux_hidden_states_buffer is None and b.aux_hidden_states_buffer is None
    assert a.next_token_logits_buffer is None and b.next_token_logits_buffer is None
    assert (a.batch_size, b.batch_size) == (1, 2)
    assert torch.equal(torch.cat([a.input_ids, b.input_ids]), parent.input_ids)
    assert torch.equal(b.req_pool_indices, parent.req_pool_indices[1:])
    assert b.out_cache_loc[0].item() == 104
    assert a.req_to_token_pool is parent.req_to_token_pool


def test_extend_split_follows_request_lengths():
    parent = _batch(ForwardMode.EXTEND, [3, 5, 2, 6], extend_seq_lens=torch.tensor([3, 5, 2, 6]),
                    extend_prefix_lens=torch.full((4,), 10),
                    extend_start_loc=torch.tensor([0, 3, 8, 10]))
    a, b = split_batch(parent)
    assert a.num_tokens == 8 and b.num_tokens == 8
    assert a.extend_seq_lens_cpu == [3, 5] and b.extend_seq_lens_cpu == [2, 6]
    assert b.extend_seq_lens.tolist() == [2, 6] and b.extend_prefix_lens.tolist() == [10, 10]
    # each child's start rows index its own tokens
    assert a.extend_start_loc.tolist() == [0, 3] and b.extend_start_loc.tolist() == [0, 2]


def test_unhandled_parent_field_raises():
    # logits rows are laid out for the parent's one LM head: no cut for them is taught
    parent = _batch(ForwardMode.DECODE, [1, 1], logits_rows=torch.arange(2))
    with pytest.raises(ValueError, match="ForwardBatch.logits_rows"):
        split_batch(parent)


def test_mixed_batch_is_not_split():
    # its step rows lead and its logits rows are laid out for the one forward
    parent = _batch(ForwardMode.MIXED, [2, 2, 5], mixed_step_bs=2, mixed_step_width=2,
                    logits_rows=torch.arange(5))
    with pytest.raises(ValueError, match="does not split MIXED"):
        split_batch(parent)


def test_every_forward_batch_field_is_classified():
    # A new ForwardBatch field must be taught to filter_batch: setting any field to a
    # non-None sentinel either splits cleanly or raises naming it, never passes silently.
    parent = _batch(ForwardMode.DECODE, [1, 1])
    child = filter_batch(parent, start_req=0, end_req=1, start_token=0, end_token=1)
    assert {f.name for f in dataclasses.fields(child)} == {
        f.name for f in dataclasses.fields(parent)}
    with pytest.raises(ValueError, match="at least 2"):
        split_batch(_batch(ForwardMode.DECODE, [1]))


if __name__ == "__main__":
    sys.exit(pytest.main([__file__, "-q"]))
