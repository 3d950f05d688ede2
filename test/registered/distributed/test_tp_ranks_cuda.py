"""Tensor parallelism on two GPUs (NCCL) with real CUDA graphs: `--tp-size 2` greedy output
equals `--tp-size 1` token for token (fp32), target-only and DFlash, each rank capturing its
own graphs with the collectives inside them. Skips below two GPUs (the x2 machine runs it;
scripts/device/tp2_figures.sh)."""

import sys

import pytest
import torch

from sglang_aux.srt.entrypoints.engine import Engine
from sglang_aux.test.ci.ci_register import register_cuda_ci
from sglang_aux.test.runtime_utils import tiny_checkpoint

register_cuda_ci(est_time=180, suite="default")

pytestmark = pytest.mark.skipif(torch.cuda.device_count() < 2, reason="needs two GPUs")
PROMPTS = ["Hi", "The quick brown fox jumps over", "12 + 30 =", "Natalia sold clips to 48 of",
           "x", "What is the capital of France?"]
GREEDY = {"temperature": 0, "max_new_tokens": 24, "ignore_eos": True}
COMMON = {"device": "cuda", "dtype": "float32", "max_total_tokens": 8192,
          "max_running_requests": 8, "cuda_graph_bs_decode": [1, 2, 4, 8]}


def _generate(**kwargs) -> tuple[list[list[int]], Engine]:
    engine = Engine(**COMMON, **kwargs)
    try:
        runner = engine.worker.model_runner
        assert type(runner.step_graphs.backend).__name__ == "CudaGraphBackend"
        outs = engine.generate(PROMPTS, GREEDY)
    finally:
        engine.shutdown()
    return [o["output_ids"] for o in outs], engine


@pytest.mark.parametrize("target", ["tiny-k3", "tiny-qwen3"])
def test_tp2_equals_tp1_with_cuda_graphs(tmp_path, target):
    path = tiny_checkpoint(target, tmp_path)
    ref, _ = _generate(model_path=path)
    tp2, _ = _generate(model_path=path, tp_size=2)
    assert tp2 == ref
    dflash, engine = _generate(model_path=path, tp_size=2, speculative_algorithm="DFLASH",
                               speculative_draft_model_path=tiny_checkpoint(f"{target}-dflash",
                                                                            tmp_path))
    assert dflash == ref
    assert engine.worker.target_runner.aux_storage is not None


if __name__ == "__main__":
    sys.exit(pytest.main([__file__, "-v"]))
