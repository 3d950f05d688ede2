"""Structured output with real CUDA graphs on the H200: greedy DFlash with a grammar equals
target-only with the same grammar token for token (fp32; the masks are applied to the logits
the graphs leave, the verify's by `_verify_processed`), every output follows its grammar,
and batches mix grammar and plain requests at captured and padded sizes."""

import sys

import pytest
import torch

from sglang_aux.srt.entrypoints.engine import Engine
from sglang_aux.test.ci.ci_register import register_cuda_ci
from sglang_aux.test.grammar_cases import GRAMMARS, check_output
from sglang_aux.test.runtime_utils import tiny_checkpoint

register_cuda_ci(est_time=50, suite="default")

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
pytest.importorskip("xgrammar", reason="structured output needs xgrammar ([grammar] extra)")

GRAMMARS = [*GRAMMARS, {}]
PROMPTS = ["Hi", "The quick brown fox", "x", "12 + 30 =", "What is", "Natalia sold", "y"]


def test_greedy_grammar_dflash_equals_target_only_with_cuda_graphs(tmp_path):
    common = dict(device="cuda", dtype="float32", max_total_tokens=8192,
                  max_running_requests=8, cuda_graph_bs_decode=[1, 2, 4, 8],
                  constrained_json_disable_any_whitespace=True,  # bounded JSON
                  model_path=tiny_checkpoint("tiny-llama", tmp_path))
    ref = Engine(**common)
    spec = Engine(**common, speculative_algorithm="DFLASH",
                  speculative_draft_model_path=tiny_checkpoint("tiny-llama-dflash", tmp_path))
    assert type(spec.worker.target_runner.step_graphs.backend).__name__ == "CudaGraphBackend"
    for bs in (1, 3, 4, 7):  # 3 and 7 replay padded graphs
        params = [{"temperature": 0, "max_new_tokens": 96, **GRAMMARS[i % 4],
                   **({} if GRAMMARS[i % 4] else {"ignore_eos": True})} for i in range(bs)]
        want = ref.generate(PROMPTS[:bs], params)
        got = spec.generate(PROMPTS[:bs], params)
        for p, w, g in zip(params, want, got, strict=True):
            assert g["output_ids"] == w["output_ids"]
            check_output(p, g["text"])
        assert sum(g["meta_info"]["spec_verify_ct"] for g in got) > 0


if __name__ == "__main__":
    sys.exit(pytest.main([__file__, "-q"]))
