"""DFlash with real CUDA graphs on the H200: greedy output equals target-only greedy (at the
draft's block and at narrower verify widths), and sampled or mixed batches (sampling tails
inside the graphs) equal the eager path's at every captured size and at padded sizes; so with
a draft vocabulary."""

import sys

import pytest
import torch

from sglang_aux.srt.entrypoints.engine import Engine
from sglang_aux.test.ci.ci_register import register_cuda_ci
from sglang_aux.test.runtime_utils import assert_graphs_equal_eager, tiny_checkpoint

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
    assert type(engine.worker.target_runner.step_graphs.backend).__name__ == "CudaGraphBackend"
    outs = engine.generate(PROMPTS, GREEDY)
    for r, o in zip(ref, outs, strict=True):
        assert o["output_ids"] == r["output_ids"]
        assert o["meta_info"]["spec_verify_ct"] > 0


@pytest.mark.parametrize("width", [2, 3])
def test_narrower_verify_widths_equal_target_only_with_cuda_graphs(tmp_path, width):
    """`--speculative-verify-width` below the block of 4: graphs of that width, still
    lossless (what `bench_dflash_step.py --widths` times)."""
    common = dict(device="cuda", max_total_tokens=8192, max_running_requests=8,
                  cuda_graph_bs_decode=[1, 2, 4, 8])
    path = tiny_checkpoint("tiny-llama", tmp_path)
    ref = Engine(model_path=path, **common).generate(PROMPTS, GREEDY)
    engine = Engine(model_path=path, speculative_algorithm="DFLASH",
                    speculative_draft_model_path=tiny_checkpoint("tiny-llama-dflash", tmp_path),
                    speculative_verify_width=width, **common)
    graphs = engine.worker.target_runner.step_graphs
    assert type(graphs.backend).__name__ == "CudaGraphBackend"
    assert {x.tokens_per_req for x in graphs.layouts} == {width}
    for r, o in zip(ref, engine.generate(PROMPTS, GREEDY), strict=True):
        assert o["output_ids"] == r["output_ids"]
        assert o["meta_info"]["spec_verify_ct"] > 0


SAMPLED = [{"temperature": 0.8, "top_p": 0.9, "top_k": 20}, {"temperature": 1.3},
           {"temperature": 0.6, "top_k": 5}, {"temperature": 1.0, "top_p": 0.7}]


@pytest.mark.parametrize("mixed", [False, True])
def test_sampled_graphs_equal_eager_at_every_size(tmp_path, mixed):
    common = dict(device="cuda", dtype="float32", max_total_tokens=8192, max_running_requests=8,
                  cuda_graph_bs_decode=[1, 2, 4, 8], model_path=tiny_checkpoint("tiny-llama",
                  tmp_path), speculative_algorithm="DFLASH",
                  speculative_draft_model_path=tiny_checkpoint("tiny-llama-dflash", tmp_path))
    graphs, eager = Engine(**common), Engine(**common, disable_decode_cuda_graph=True)
    for runner in (graphs.worker.draft_runner, graphs.worker.target_runner):
        gr = runner.step_graphs
        assert type(gr.backend).__name__ == "CudaGraphBackend"
        assert [x.step_bs for x in gr.layouts] == [1, 2, 4, 8] and len(gr.sampling_graphs) == 4
        tail = gr.capture_stats["sampling_tail"]
        print(f"{gr.mode.name}: main graphs {gr.capture_stats['free_memory_drop_bytes']}"
              f" B, sampling tails {tail['free_memory_drop_bytes']} B in {tail['seconds']} s")
    assert_graphs_equal_eager(graphs, eager, PROMPTS, lambda i: dict(GREEDY) if mixed and i % 2
                              else dict(GREEDY, **SAMPLED[i % 4], seed=i))


def test_draft_vocabulary_graphs_equal_eager_and_stay_lossless(tmp_path):
    """`--speculative-token-map` with real CUDA graphs: the draft's graphs take 200-column
    logits; sampled and greedy requests equal the eager path's at every captured size and the
    padded ones, and greedy output stays the target's."""
    ids = torch.randperm(320, generator=torch.Generator().manual_seed(1))[:200]
    torch.save(ids, tmp_path / "map.pt")
    common = dict(device="cuda", dtype="float32", max_total_tokens=8192, max_running_requests=8,
                  cuda_graph_bs_decode=[1, 2, 4, 8], model_path=tiny_checkpoint("tiny-llama",
                  tmp_path), speculative_algorithm="DFLASH",
                  speculative_draft_model_path=tiny_checkpoint("tiny-llama-dflash", tmp_path),
                  speculative_token_map=str(tmp_path / "map.pt"))
    graphs, eager = Engine(**common), Engine(**common, disable_decode_cuda_graph=True)
    draft = graphs.worker.draft_runner.step_graphs
    assert type(draft.backend).__name__ == "CudaGraphBackend"
    assert draft.buffers.next_token_logits_buffer.shape[1] == 200
    assert_graphs_equal_eager(graphs, eager, PROMPTS, lambda i: dict(GREEDY) if i % 2
                              else dict(GREEDY, **SAMPLED[i % 4], seed=i))
    target_only = {k: v for k, v in common.items() if not k.startswith("speculative")}
    ref = Engine(**target_only).generate(PROMPTS, GREEDY)
    for r, o in zip(ref, graphs.generate(PROMPTS, GREEDY), strict=True):
        assert o["output_ids"] == r["output_ids"]


if __name__ == "__main__":
    sys.exit(pytest.main([__file__, "-q"]))
