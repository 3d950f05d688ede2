"""Penalties, min_new_tokens and min_p with real CUDA graphs: greedy DFlash (verify graphs,
then the processed acceptance) equals target-only, rows without the parameters are unchanged,
and sampled requests with them replay the same tokens with and without graphs."""

import sys

import pytest
import torch

from sglang_aux.srt.entrypoints.engine import Engine
from sglang_aux.test.ci.ci_register import register_cuda_ci
from sglang_aux.test.runtime_utils import assert_kv_all_back, tiny_checkpoint

register_cuda_ci(est_time=120, suite="default")

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
PROMPTS = ["Hi", "The quick brown fox jumps over", "12 + 30 =", "Natalia sold clips to 48 of",
           "x", "What is the capital of France?"]
GREEDY = {"temperature": 0, "max_new_tokens": 24, "ignore_eos": True}
PROCESSED = [{}, {"repetition_penalty": 2.0}, {"frequency_penalty": 1.5},
             {"presence_penalty": 2.0, "min_p": 0.2}, {"min_new_tokens": 10, "ignore_eos": False},
             {}]


def test_processed_dflash_with_graphs(tmp_path):
    common = dict(device="cuda", dtype="float32", max_total_tokens=8192, max_running_requests=8,
                  cuda_graph_bs_decode=[1, 2, 4, 8],
                  model_path=tiny_checkpoint("tiny-llama", tmp_path))
    spec = dict(speculative_algorithm="DFLASH",
                speculative_draft_model_path=tiny_checkpoint("tiny-llama-dflash", tmp_path))
    plain = Engine(**common)
    graphs, eager = Engine(**common, **spec), Engine(**common, **spec,
                                                     disable_decode_cuda_graph=True)
    params = [{**GREEDY, **p} for p in PROCESSED]
    ref = plain.generate(PROMPTS, params)
    base = plain.generate(PROMPTS, GREEDY)
    for i in (0, 5):
        assert ref[i]["output_ids"] == base[i]["output_ids"]
    for r, o in zip(ref, graphs.generate(PROMPTS, params), strict=True):
        assert o["output_ids"] == r["output_ids"]
    sampled = [{**p, "temperature": 0.9, "top_k": 20, "seed": i}
               for i, p in enumerate(params)]
    for g, e in zip(graphs.generate(PROMPTS, sampled), eager.generate(PROMPTS, sampled),
                    strict=True):
        assert g["output_ids"] == e["output_ids"]
    assert_kv_all_back(graphs)


if __name__ == "__main__":
    sys.exit(pytest.main([__file__, "-q"]))
