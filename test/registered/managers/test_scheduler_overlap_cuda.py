"""The overlap scheduler with real CUDA graphs (run on the H200): on by default there, it
gives the serial schedule's greedy and seeded sampled tokens, finish reasons and accept
counts, and leaves every slot and row free; each launch queues its readback without a sync."""

import sys

import pytest
import torch
from test_scheduler_step_loop_cuda import KINDS, _engine

from sglang_aux.test.ci.ci_register import register_cuda_ci
from sglang_aux.test.runtime_utils import assert_kv_all_back, assert_same_outputs
from sglang_aux.test.sync_checks import strict_sync

register_cuda_ci(est_time=120, suite="default")

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
PROMPTS = ["Hi", "The quick brown fox jumps over", "12 + 30 =", "Natalia sold clips to 48 of",
           "x", "What is the capital of France?", "def f(x):", "Once upon a time"]


def _params():
    return [{"max_new_tokens": 9 + 11 * i, "ignore_eos": True,
             **({"temperature": 0} if i % 2 == 0 else
                {"temperature": 0.8, "top_p": 0.9, "top_k": 20, "seed": i}),
             **({"stop_token_ids": [81, 52]} if i % 3 == 1 else {})}
            for i in range(len(PROMPTS))]


@pytest.mark.parametrize("kind", KINDS)
def test_overlap_equals_the_serial_schedule_on_graphs(tmp_path, kind):
    engine = _engine(tmp_path, kind)
    assert engine.scheduler.overlap, "overlap is the CUDA default"
    serial = _engine(tmp_path, kind, disable_overlap_schedule=True)
    engine.generate(PROMPTS, _params())  # warm-up: lazy kernels
    with strict_sync(engine.worker, "decode") as copies:
        got = engine.generate(PROMPTS, _params())
    want = serial.generate(PROMPTS, _params())
    assert copies and all(c == 1 for c in copies), copies
    assert_same_outputs(want, got)
    assert_kv_all_back(engine)


if __name__ == "__main__":
    sys.exit(pytest.main([__file__, "-q"]))
