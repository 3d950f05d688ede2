"""The decode graph runner with real CUDA graphs and Triton attention (run on the H200)."""

import gc
import sys

import pytest
import torch

from sglang_aux.srt.forward_state.forward_batch_info import ForwardMode
from sglang_aux.srt.model_executor.runner.forward_parts import ForwardParts
from sglang_aux.srt.model_executor.runner.step_prologue import StepPrologue
from sglang_aux.test.ci.ci_register import register_cuda_ci
from sglang_aux.test.runtime_utils import (
    eager_forward,
    full_collections,
    make_runner,
    prefill_random,
    release,
    step_batch,
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


def _steps(runner, mode=ForwardMode.TARGET_VERIFY, width=BLOCK):
    """Register `mode` steps whose block tokens are random (fixed per row), capturing them."""
    drafts = torch.randint(0, runner.model_config.hf_config.vocab_size, (16, max(width - 1, 0)),
                           generator=torch.Generator().manual_seed(width)).cuda()
    runner.init_forwards(ForwardParts(mode, width, StepPrologue(
        block_tokens=lambda bs: drafts[:bs])))


@pytest.mark.parametrize("preset,aux", [("tiny-k3", [1, 3, 5]), ("tiny-llama", [0, 2, 3])])
@pytest.mark.parametrize("mode,width", [(ForwardMode.TARGET_VERIFY, BLOCK),
                                        (ForwardMode.DECODE, 1)])
def test_cuda_graph_replay_equals_eager(tmp_path, preset, aux, mode, width):
    runner = _runner(tmp_path, preset, aux)
    _steps(runner, mode, width)
    gr = runner.step_graphs
    assert type(gr.backend).__name__ == "CudaGraphBackend"
    for bs in [*CAPTURE, 3, 11]:  # 3 and 11 replay padded graphs
        reqs = prefill_random(runner, [5 + 7 * i for i in range(bs)], seed=bs)
        fb = step_batch(runner, reqs, mode, width)
        assert fb.prepared_graph is not None
        out = runner.forward(fb)
        logits, aux_out = out.next_token_logits.clone(), out.aux_hidden_states.clone()
        eager = eager_forward(runner, fb)
        assert torch.isfinite(logits).all()
        torch.testing.assert_close(logits, eager.next_token_logits, rtol=1e-4, atol=1e-4)
        torch.testing.assert_close(aux_out, eager.aux_hidden_states, rtol=1e-4, atol=1e-4)
        release(runner, reqs)


def test_cuda_graph_aux_outputs_are_row_slices_of_one_buffer(tmp_path):
    runner = _runner(tmp_path, "tiny-k3", [1, 3, 5])
    _steps(runner)
    gr = runner.step_graphs
    buf = runner.aux_storage.buffer
    for x, out in zip(gr.layouts, gr.outputs, strict=True):
        assert out.aux_hidden_states.data_ptr() == buf.data_ptr()
        assert out.aux_hidden_states.shape[0] == x.step_bs * BLOCK
    stats = gr.capture_stats
    assert [x.step_bs for x in gr.layouts] == CAPTURE and stats["seconds"] > 0
    baseline = _runner(tmp_path, "tiny-k3", [1, 3, 5], disable_shared_aux_buffer=True)
    _steps(baseline)
    ptrs = {o.aux_hidden_states.data_ptr() for o in baseline.step_graphs.outputs}
    assert len(ptrs) == len(CAPTURE)
    assert stats["allocated_delta_bytes"] < baseline.step_graphs.capture_stats[
        "allocated_delta_bytes"]


def test_runner_rebuilt_in_process_captures_again(tmp_path):
    """The graph pool outlives no runner: a second runner after the first is gone (as the
    draft-training tool does between generation and evaluation) captures cleanly."""
    runner = _runner(tmp_path, "tiny-k3", [1, 3, 5])
    _steps(runner)
    del runner
    gc.collect()
    torch.cuda.empty_cache()
    again = _runner(tmp_path, "tiny-k3", [1, 3, 5])
    _steps(again)
    assert len(again.step_graphs.graphs) == len(CAPTURE)


def test_capture_collects_the_heap_once(tmp_path):
    """A run of captures pays one full collection (`frozen_gc`), not one per graph: a
    server's heap takes ~0.1 s to collect, and a DFlash server captures hundreds of graphs."""
    gc.unfreeze()  # a process may start with objects frozen (the H100's pytest: ~375), and
    # a block entered so leaves the heap frozen (`frozen_gc`): start from none
    runner = _runner(tmp_path, "tiny-k3", [1, 3, 5])
    with full_collections() as starts:
        _steps(runner)
    assert len(runner.step_graphs.graphs) == len(CAPTURE)
    assert len(starts) == 1
    assert gc.isenabled() and gc.get_freeze_count() == 0


if __name__ == "__main__":
    sys.exit(pytest.main([__file__, "-q"]))
