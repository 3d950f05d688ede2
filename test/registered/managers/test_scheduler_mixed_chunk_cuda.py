"""Mixed steps with real CUDA graphs (run on the H200): with `--enable-mixed-chunk` arrivals'
prefills ride in the running batch's decode (target-only) or verify (DFlash) graph and give the
tokens, finish reasons and accept counts of prefilling in a step of its own (greedy and seeded
sampling, overlap on and off); a mixed launch never syncs and queues one readback for both
halves, a mixed graph replays what the same batch gives eagerly (its launch one host-to-device
copy besides the replay), and every slot and row comes back."""

import sys

import pytest
import torch
from test_scheduler_step_loop_cuda import KINDS, _engine

from sglang_aux.srt.forward_state.forward_batch_info import ForwardMode
from sglang_aux.srt.managers.schedule_batch import mixed_inputs, reserve_kv
from sglang_aux.srt.model_executor.runner.forward_parts import ForwardParts
from sglang_aux.srt.model_executor.runner.step_prologue import StepPrologue
from sglang_aux.test.ci.ci_register import register_cuda_ci
from sglang_aux.test.launch_ops import launch_ops
from sglang_aux.test.runtime_utils import (
    assert_kv_all_back,
    assert_same_outputs,
    make_runner,
    new_requests,
    prefill_random,
    publish_rows,
    release,
    tiny_checkpoint,
)
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
def test_mixed_steps_equal_prefill_apart_on_graphs(tmp_path, kind, overlap):
    mixed = _engine(tmp_path, kind, disable_overlap_schedule=not overlap,
                    enable_mixed_chunk=True, **ROWS)
    graphs = mixed.worker.model_runner.graph_runners.get(ForwardMode.MIXED)
    assert type(graphs.backend).__name__ == "CudaGraphBackend" and graphs.graphs
    apart = _engine(tmp_path, kind, disable_overlap_schedule=not overlap,
                    enable_mixed_chunk=False, **ROWS)
    assert apart.scheduler.mixed_limits is None
    mixed.generate(PROMPTS, _params())  # warm-up: lazy kernels
    with strict_sync(mixed.worker, "mixed") as launches:
        got = mixed.generate(PROMPTS, _params())
    want = apart.generate(PROMPTS, _params())
    assert launches and all(c == 1 for c in launches), launches
    assert mixed.scheduler.stats["mixed_steps"] > 0
    assert_same_outputs(want, got)
    assert_kv_all_back(mixed)


ARGS = dict(device="cuda", dtype="float32", max_running_requests=6, max_total_tokens=8192,
            context_length=512, cuda_graph_bs_decode=[1, 2, 4], enable_mixed_chunk=True,
            mixed_chunk_max_prefill_tokens=128, cuda_graph_max_bs_prefill=2,
            attention_backend="triton")


def _mixed_runner(ckpt, width: int, graphs: bool):
    runner = make_runner(ckpt, disable_decode_cuda_graph=not graphs, **ARGS)
    prologue = StepPrologue(fill_token_id=5)
    runner.init_forwards(ForwardParts(ForwardMode.DECODE, width, prologue),
                         ForwardParts(ForwardMode.MIXED, width, prologue))
    return runner


def _mixed_cases(runner) -> list[tuple[int, list[int]]]:
    """(step requests, arrival lengths): each captured layout, then a padded one."""
    g = runner.graph_runners[ForwardMode.MIXED]
    return [(x.step_bs, [x.arrival_tokens]) for x in g.layouts] + [(3, [5, 70])]


def _mixed_logits(runner, width: int, step_bs: int, arrival_lens: list[int], seed: int,
                  graphs: bool) -> torch.Tensor:
    running = prefill_random(runner, [40 + 31 * i for i in range(step_bs)], seed)
    publish_rows(runner, running)
    for r in running:
        reserve_kv(runner, r, r.kv_len + width)
    arrivals = new_requests(runner, arrival_lens, seed + 100)
    for r in arrivals:  # as the scheduler admits them
        reserve_kv(runner, r, len(r.origin_input_ids))
    with launch_ops(runner) as ops:
        fb = runner.prepare(mixed_inputs(runner, running, arrivals, width))
        if graphs:
            runner.forward(fb)
    assert graphs == (fb.prepared_graph is not None)
    if graphs:  # the host values' copy, then the replay
        assert ops == ["copy_"], ops
    live = step_bs * width + len(arrivals)
    # (the graph's second replay of the batch derives the same inputs again)
    logits = runner.forward(fb).next_token_logits[:live].clone()
    release(runner, running + arrivals)
    return logits


@pytest.mark.parametrize("width", [1, 8])
def test_mixed_graph_replay_equals_eager_at_every_layout(tmp_path, width):
    """fp32: each captured (step requests, arrival tokens) graph, and padded layouts,
    against the same batch run eagerly (Triton attention both)."""
    ckpt = tiny_checkpoint("tiny-llama", tmp_path)
    runners = {graphs: _mixed_runner(ckpt, width, graphs) for graphs in (True, False)}
    g = runners[True].graph_runners[ForwardMode.MIXED]
    assert {(x.step_bs, x.arrival_tokens) for x in g.layouts} == {
        (bs, n) for bs in (1, 2, 4) for n in (32, 64, 128)}
    for seed, (step_bs, arrival_lens) in enumerate(_mixed_cases(runners[True])):
        out = [_mixed_logits(r, width, step_bs, arrival_lens, seed, graphs)
               for graphs, r in runners.items()]
        torch.testing.assert_close(out[0], out[1], rtol=1e-4, atol=1e-4)


if __name__ == "__main__":
    sys.exit(pytest.main([__file__, "-q"]))
