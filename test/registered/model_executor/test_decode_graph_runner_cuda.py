"""The decode graph runner with real CUDA graphs and Triton attention (run on the H200)."""

import gc
import sys

import pytest
import torch

from sglang_aux.srt.forward_state.forward_batch_info import ForwardMode
from sglang_aux.test.ci.ci_register import register_cuda_ci
from sglang_aux.test.runtime_utils import (
    eager_forward,
    fixed_batch,
    make_runner,
    prefill_random,
    release,
    tiny_checkpoint,
)

register_cuda_ci(est_time=120, suite="default")

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
BLOCK = 4
CAPTURE = [1, 2, 4, 8, 16]


def _runner(tmp_path, preset, aux, **kw):
    return make_runner(tiny_checkpoint(preset, tmp_path), aux_layer_ids=aux, device="cuda",
                       speculative_algorithm="DFLASH", max_running_requests=16,
                       max_total_tokens=8192, context_length=512, cuda_graph_bs_decode=CAPTURE,
                       **kw)


@pytest.mark.parametrize("preset,aux", [("tiny-k3", [1, 3, 5]), ("tiny-llama", [0, 2, 3])])
@pytest.mark.parametrize("mode,width", [(ForwardMode.TARGET_VERIFY, BLOCK),
                                        (ForwardMode.DECODE, 1)])
def test_cuda_graph_replay_equals_eager(tmp_path, preset, aux, mode, width):
    runner = _runner(tmp_path, preset, aux)
    runner.init_decode_graphs(mode, width)
    gr = runner.graph_runner
    assert type(gr.backend).__name__ == "CudaGraphBackend"
    for bs in [*CAPTURE, 3, 11]:  # 3 and 11 replay padded graphs
        reqs = prefill_random(runner, [5 + 7 * i for i in range(bs)], seed=bs)
        fb = fixed_batch(runner, reqs, mode, width, seed=50 + bs)
        assert gr.can_run_graph(fb)
        out = gr.execute(fb)
        logits, aux_out = out.next_token_logits.clone(), out.aux_hidden_states.clone()
        eager = eager_forward(runner, fb)
        assert torch.isfinite(logits).all()
        torch.testing.assert_close(logits, eager.next_token_logits, rtol=1e-4, atol=1e-4)
        torch.testing.assert_close(aux_out, eager.aux_hidden_states, rtol=1e-4, atol=1e-4)
        release(runner, reqs)


def test_cuda_graph_aux_outputs_are_row_slices_of_one_buffer(tmp_path):
    runner = _runner(tmp_path, "tiny-k3", [1, 3, 5])
    runner.init_decode_graphs(ForwardMode.TARGET_VERIFY, BLOCK)
    gr = runner.graph_runner
    buf = gr.buffers.aux_hidden_states
    for bs, out in gr.outputs.items():
        assert out.aux_hidden_states.data_ptr() == buf.data_ptr()
        assert out.aux_hidden_states.shape[0] == bs * BLOCK
    stats = gr.capture_stats
    assert stats["aux_buffer_bytes"] == buf.numel() * buf.element_size()
    assert stats["capture_bs"] == CAPTURE and stats["seconds"] > 0
    baseline = _runner(tmp_path, "tiny-k3", [1, 3, 5], disable_shared_aux_buffer=True)
    baseline.init_decode_graphs(ForwardMode.TARGET_VERIFY, BLOCK)
    ptrs = {o.aux_hidden_states.data_ptr() for o in baseline.graph_runner.outputs.values()}
    assert len(ptrs) == len(CAPTURE)
    assert stats["allocated_delta_bytes"] < baseline.graph_runner.capture_stats[
        "allocated_delta_bytes"]


def test_runner_rebuilt_in_process_captures_again(tmp_path):
    """The graph pool outlives no runner: a second runner after the first is gone (as the
    draft-training tool does between generation and evaluation) captures cleanly."""
    runner = _runner(tmp_path, "tiny-k3", [1, 3, 5])
    runner.init_decode_graphs(ForwardMode.TARGET_VERIFY, BLOCK)
    del runner
    gc.collect()
    torch.cuda.empty_cache()
    again = _runner(tmp_path, "tiny-k3", [1, 3, 5])
    again.init_decode_graphs(ForwardMode.TARGET_VERIFY, BLOCK)
    assert len(again.graph_runner.graphs) == len(CAPTURE)


if __name__ == "__main__":
    sys.exit(pytest.main([__file__, "-q"]))
