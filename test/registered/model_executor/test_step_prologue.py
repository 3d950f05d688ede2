"""Step prologues (CPU eager-replay backend): a graph that derives its inputs from (row, kv_len,
last token) per request gives the eager step's inputs and logits at every captured size and
at padded ones; batches the runner did not prepare run eagerly; block tokens come from the
prologue's storage."""

import sys

import pytest
import torch

from sglang_aux.srt.forward_state.forward_batch_info import ForwardMode
from sglang_aux.srt.managers.schedule_batch import reserve_kv, step_inputs
from sglang_aux.srt.model_executor.runner.forward_parts import ForwardParts
from sglang_aux.srt.model_executor.runner.step_prologue import StepPrologue
from sglang_aux.test.ci.ci_register import register_cpu_ci
from sglang_aux.test.runtime_utils import (
    fixed_batch,
    make_runner,
    prefill_random,
    publish_rows,
    release,
    tiny_checkpoint,
)

register_cpu_ci(est_time=30, suite="default")

SIZES = [1, 2, 4, 8]
COMMON = dict(max_running_requests=8, max_total_tokens=4096, context_length=256,
              cuda_graph_bs_decode=SIZES)
FIELDS = ("input_ids", "positions", "out_cache_loc", "seq_lens", "req_pool_indices")


@pytest.fixture(scope="module")
def path(tmp_path_factory):
    return tiny_checkpoint("tiny-llama", tmp_path_factory.mktemp("ckpt"))


def _pair(path, mode, width, prologue):
    graphs = make_runner(path, **COMMON)
    graphs.init_forwards(ForwardParts(mode, width, prologue))
    eager = make_runner(path, disable_decode_cuda_graph=True, **COMMON)
    eager.init_forwards(ForwardParts(mode, width, prologue))
    return graphs, eager


@pytest.mark.parametrize("mode,width,fill", [(ForwardMode.DECODE, 1, 0),
                                             (ForwardMode.DRAFT_BLOCK, 4, 7)])
def test_prepared_steps_equal_eager_steps(path, mode, width, fill):
    graphs, eager = _pair(path, mode, width, StepPrologue(fill_token_id=fill))
    for bs in [1, 2, 3, 4, 5, 8]:  # 3 and 5 pad to 4 and 8
        lens = [6 + 5 * i for i in range(bs)]
        a, b = prefill_random(graphs, lens, seed=bs), prefill_random(eager, lens, seed=bs)
        for r, runner in [*((r, graphs) for r in a), *((r, eager) for r in b)]:
            r.output_ids.append(11 + r.kv_len)  # the token this step feeds
            reserve_kv(runner, r, r.kv_len + width)
        publish_rows(graphs, a)
        publish_rows(eager, b)
        fa = graphs.prepare(step_inputs(a, mode, width))
        fb = eager.prepare(step_inputs(b, mode, width))
        padded = graphs.step_graphs.layouts[fa.prepared_graph].step_bs
        assert padded == min(x for x in SIZES if x >= bs)
        assert fb.prepared_graph is None and fb.batch_size == fa.batch_size == bs
        la = graphs.forward(fa).next_token_logits.clone()
        lb = eager.forward(fb).next_token_logits
        for name in FIELDS:  # the prologue filled the graph's views at replay
            assert torch.equal(getattr(fa, name), getattr(fb, name)), name
        torch.testing.assert_close(la, lb, rtol=1e-4, atol=1e-4)
        release(graphs, a)
        release(eager, b)


def test_block_tokens_come_from_the_prologues_storage(path):
    drafts = torch.arange(8 * 3).view(8, 3) + 5
    prologue = StepPrologue(block_tokens=lambda bs: drafts[:bs])
    graphs, eager = _pair(path, ForwardMode.TARGET_VERIFY, 4, prologue)
    a, b = prefill_random(graphs, [9, 14, 3]), prefill_random(eager, [9, 14, 3])
    for r, runner in [*((r, graphs) for r in a), *((r, eager) for r in b)]:
        reserve_kv(runner, r, r.kv_len + 4)
    publish_rows(graphs, a)
    publish_rows(eager, b)
    fa = graphs.prepare(step_inputs(a, ForwardMode.TARGET_VERIFY, 4))
    fb = eager.prepare(step_inputs(b, ForwardMode.TARGET_VERIFY, 4))
    graphs.forward(fa)
    assert fa.input_ids.view(3, 4)[:, 1:].tolist() == drafts[:3].tolist()
    assert torch.equal(fa.input_ids, fb.input_ids)
    drafts += 1  # the prologue reads the storage at replay, eagerly at prepare
    graphs.forward(fa)
    assert fa.input_ids.view(3, 4)[:, 1:].tolist() == drafts[:3].tolist()


def test_batches_it_did_not_prepare_run_eagerly(path):
    graphs, _ = _pair(path, ForwardMode.DECODE, 1, StepPrologue())
    reqs = prefill_random(graphs, [5, 7])
    fb = fixed_batch(graphs, reqs, ForwardMode.DECODE, 1)  # random ids, not (last, fill)
    assert fb.prepared_graph is None
    before = list(fb.input_ids.tolist())
    graphs.forward(fb)
    assert fb.input_ids.tolist() == before


if __name__ == "__main__":
    sys.exit(pytest.main([__file__, "-q"]))
