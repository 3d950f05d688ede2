"""Concurrent prefill with real CUDA graphs on two streams (run on the H200): with
`--enable-concurrent-prefill` an arrivals' prefill runs on a side stream beside the running
batch's decode step and gives the tokens, finish reasons and accept counts of prefilling in a
step of its own (greedy and seeded sampling, overlap on and off); neither launch syncs, each
queues one readback, the prefill graphs keep their own aux storage, and every slot and row
comes back."""

import sys

import pytest
import torch
from test_step_loop_cuda import KINDS, _engine

from sglang_aux.srt.forward_state.forward_batch_info import ForwardMode
from sglang_aux.test.ci.ci_register import register_cuda_ci
from sglang_aux.test.runtime_utils import assert_kv_all_back, assert_same_outputs
from sglang_aux.test.sync_checks import strict_sync

register_cuda_ci(est_time=150, suite="default")

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
# three times the running rows: most prompts arrive while others decode
PROMPTS = ["Hi", "The quick brown fox jumps over", "12 + 30 =", "Natalia sold clips to 48 of",
           "x", "What is the capital of France?", "def f(x):", "Once upon a time",
           "1, 2, 3,", "Paris is", "SELECT * FROM", "The answer is"]
ROWS = dict(max_running_requests=4, cuda_graph_bs_decode=[1, 2, 4])


def _params():
    return [{"max_new_tokens": 7 + 9 * i, "ignore_eos": True,
             **({"temperature": 0} if i % 2 == 0 else
                {"temperature": 0.8, "top_p": 0.9, "top_k": 20, "seed": i})}
            for i in range(len(PROMPTS))]


@pytest.mark.parametrize("overlap", [True, False])
@pytest.mark.parametrize("kind", KINDS)
def test_prefill_beside_decode_equals_prefill_alone_on_graphs(tmp_path, kind, overlap):
    beside = _engine(tmp_path, kind, disable_overlap_schedule=not overlap,
                     enable_concurrent_prefill=True, **ROWS)
    assert beside.scheduler.side_stream is not None
    alone = _engine(tmp_path, kind, disable_overlap_schedule=not overlap, **ROWS)
    assert alone.scheduler.side_stream is None, "concurrent prefill is off by default"
    runner = beside.worker.model_runner
    if kind == "dflash":
        storage = runner.aux_storage  # prefills write rows past every step's
        assert storage.beside_start > 0
        assert all(fb.aux_hidden_states_buffer.data_ptr() == storage.buffer[
            storage.beside_start:].data_ptr()
            for fb in runner.graph_runners[ForwardMode.EXTEND].static)
    beside.generate(PROMPTS, _params())  # warm-up: lazy kernels
    with strict_sync(beside.worker, "prefill") as prefills, \
            strict_sync(beside.worker, "decode") as decodes:
        got = beside.generate(PROMPTS, _params())
    want = alone.generate(PROMPTS, _params())
    assert all(c == 1 for c in prefills + decodes), (prefills, decodes)
    assert beside.scheduler.stats["prefills_beside_decode"] > 0
    assert_same_outputs(want, got)
    assert_kv_all_back(beside)


if __name__ == "__main__":
    sys.exit(pytest.main([__file__, "-q"]))
