"""The scheduler's aux figures (served at /get_server_info): what one aux output per captured
graph would retain, the shared buffer's size, and the difference it saves, on a real
DFlash-target graph runner."""

import sys

import pytest

from sglang_aux.srt.forward_state.forward_batch_info import ForwardMode
from sglang_aux.srt.managers.scheduler.scheduler_info import GRAPH_KEYS, graph_memory
from sglang_aux.srt.model_executor.runner.forward_parts import ForwardParts
from sglang_aux.srt.model_executor.runner.step_prologue import StepPrologue
from sglang_aux.test.ci.ci_register import register_cpu_ci
from sglang_aux.test.runtime_utils import make_runner, tiny_checkpoint

register_cpu_ci(est_time=15, suite="default")

CAPTURE_BS = [1, 2, 4]
BLOCK = 4  # tokens per request in a TARGET_VERIFY graph
AUX_LAYERS = [0, 2, 4]
ROW_BYTES = len(AUX_LAYERS) * 64 * 4  # K captures of tiny-k3's hidden 64, float32


def test_no_graph_runner_reports_nulls(tmp_path):
    runner = make_runner(tiny_checkpoint("tiny-k3", tmp_path), max_total_tokens=512)
    assert graph_memory(runner) == dict.fromkeys(GRAPH_KEYS)


@pytest.mark.parametrize("shared", [True, False])
def test_graph_memory_counts_what_the_shared_aux_buffer_saves(tmp_path, shared):
    runner = make_runner(tiny_checkpoint("tiny-k3", tmp_path), aux_layer_ids=AUX_LAYERS,
                         speculative_algorithm="DFLASH", cuda_graph_bs_decode=CAPTURE_BS,
                         max_total_tokens=512, disable_shared_aux_buffer=not shared,
                         max_running_requests=max(CAPTURE_BS))
    runner.init_forwards(ForwardParts(ForwardMode.TARGET_VERIFY, BLOCK, StepPrologue()))
    info = graph_memory(runner)
    assert info["forward_mode"] == "TARGET_VERIFY" and info["capture_bs"] == CAPTURE_BS
    per_graph = sum(CAPTURE_BS) * BLOCK * ROW_BYTES
    shared_bytes = max(CAPTURE_BS) * BLOCK * ROW_BYTES if shared else 0
    assert info["aux_per_graph_bytes"] == per_graph
    assert info["aux_buffer_bytes"] == shared_bytes
    assert info["aux_bytes_saved"] == (per_graph - shared_bytes if shared else 0)



def test_narrower_step_graphs_are_counted_once_per_size(tmp_path):
    """A static verify's narrower graphs (`capture_step_widths`): each size once in
    `capture_bs`, its widths in `capture_widths`, their aux rows in the per-graph figure."""
    runner = make_runner(tiny_checkpoint("tiny-k3", tmp_path), aux_layer_ids=AUX_LAYERS,
                         speculative_algorithm="DFLASH", cuda_graph_bs_decode=CAPTURE_BS,
                         max_total_tokens=512, max_running_requests=max(CAPTURE_BS))
    runner.init_forwards(ForwardParts(ForwardMode.TARGET_VERIFY, BLOCK, StepPrologue()))
    runner.capture_step_widths(lambda bs: 2 if bs >= 3 else BLOCK)
    info = graph_memory(runner)
    assert info["capture_bs"] == CAPTURE_BS
    assert info["capture_widths"] == {"1": [BLOCK], "2": [BLOCK], "4": [2, BLOCK]}
    assert info["aux_per_graph_bytes"] == (sum(CAPTURE_BS) * BLOCK + 4 * 2) * ROW_BYTES
    assert info["aux_buffer_bytes"] == max(CAPTURE_BS) * BLOCK * ROW_BYTES
    assert info["graph_memory_bytes"] == 0  # free device memory does not move on the CPU

if __name__ == "__main__":
    sys.exit(pytest.main([__file__, "-q"]))
