"""The heap frozen around graph captures: one collection a run of captures, state restored."""

import gc

import pytest
import torch

from sglang_aux.srt.forward_state.forward_batch_info import ForwardMode
from sglang_aux.srt.model_executor.runner.forward_parts import ForwardParts
from sglang_aux.srt.model_executor.runner.step_prologue import StepPrologue
from sglang_aux.srt.model_executor.runner_utils.frozen_gc import frozen_gc, in_frozen_gc
from sglang_aux.test.ci.ci_register import register_cpu_ci
from sglang_aux.test.runtime_utils import full_collections, make_runner, tiny_checkpoint

register_cpu_ci(est_time=20, suite="default")


@pytest.mark.parametrize("enabled", [True, False])
def test_frozen_gc_freezes_once_and_restores(enabled):
    gc.unfreeze()  # a process may start with objects frozen (the H100 run: 375)
    (gc.enable if enabled else gc.disable)()
    try:
        before = gc.get_freeze_count()
        with full_collections() as starts, frozen_gc():
            assert in_frozen_gc() and not gc.isenabled()
            frozen = gc.get_freeze_count()
            assert frozen > before
            with frozen_gc():  # nested: no second collection, still frozen after it
                assert gc.get_freeze_count() == frozen
            assert in_frozen_gc() and gc.get_freeze_count() == frozen
            assert not gc.isenabled()
        assert len(starts) == 1
        assert not in_frozen_gc() and gc.get_freeze_count() == before
        assert gc.isenabled() == enabled
    finally:
        gc.enable()


def test_frozen_gc_keeps_what_was_frozen_before():
    """Objects the caller froze stay frozen after the block (only whole thaws exist)."""
    gc.freeze()
    try:
        before = gc.get_freeze_count()
        assert before > 0
        with frozen_gc():
            assert gc.get_freeze_count() >= before
        assert gc.get_freeze_count() >= before and gc.isenabled()
    finally:
        gc.unfreeze()


def test_frozen_gc_restores_after_an_error():
    gc.unfreeze()
    with pytest.raises(RuntimeError, match="inside"), frozen_gc():
        raise RuntimeError("inside")
    assert not in_frozen_gc() and gc.isenabled() and gc.get_freeze_count() == 0


def test_eager_capture_collects_nothing(tmp_path):
    """Five layouts captured for eager replay on the CPU: the heap is not collected (the
    CUDA backend's one collection a run: `test_decode_cuda_graph_runner_cuda.py`)."""
    runner = make_runner(tiny_checkpoint("tiny-llama", tmp_path), device="cpu",
                         max_running_requests=8, cuda_graph_bs_decode=[1, 2, 4, 6, 8])
    with full_collections() as starts:
        runner.init_forwards(ForwardParts(ForwardMode.DECODE, 1, StepPrologue(
            block_tokens=lambda bs: torch.zeros(bs, 0, dtype=torch.int64))))
    assert len(runner.step_graphs.layouts) == 5
    assert type(runner.step_graphs.backend).__name__ == "EagerReplayBackend"
    assert starts == []


if __name__ == "__main__":
    import sys

    sys.exit(pytest.main([__file__, "-q"]))
