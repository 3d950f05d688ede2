"""DFlash with real CUDA graphs on the H200: greedy output equals target-only greedy."""

import sys

import pytest
import torch

from sglang_aux.srt.entrypoints.engine import Engine
from sglang_aux.test.ci.ci_register import register_cuda_ci
from sglang_aux.test.runtime_utils import tiny_checkpoint

register_cuda_ci(est_time=120, suite="default")

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
PROMPTS = ["Hi", "The quick brown fox jumps over", "12 + 30 =", "Natalia sold clips to 48 of",
           "x", "What is the capital of France?"]
GREEDY = {"temperature": 0, "max_new_tokens": 24, "ignore_eos": True}


@pytest.mark.parametrize("target", ["tiny-k3", "tiny-llama"])
@pytest.mark.parametrize("shared", [True, False])
def test_dflash_greedy_equals_target_only_with_cuda_graphs(tmp_path, target, shared):
    common = dict(device="cuda", max_total_tokens=8192, max_running_requests=8,
                  cuda_graph_bs_decode=[1, 2, 4, 8])
    ref = Engine(model_path=tiny_checkpoint(target, tmp_path), **common).generate(PROMPTS, GREEDY)
    engine = Engine(model_path=tiny_checkpoint(target, tmp_path), speculative_algorithm="DFLASH",
                    speculative_draft_model_path=tiny_checkpoint(f"{target}-dflash", tmp_path),
                    disable_shared_aux_buffer=not shared, **common)
    assert type(engine.worker.target_runner.graph_runner.backend).__name__ == "CudaGraphBackend"
    outs = engine.generate(PROMPTS, GREEDY)
    for r, o in zip(ref, outs, strict=True):
        assert o["output_ids"] == r["output_ids"]
        assert o["meta_info"]["spec_verify_ct"] > 0


if __name__ == "__main__":
    sys.exit(pytest.main([__file__, "-q"]))
