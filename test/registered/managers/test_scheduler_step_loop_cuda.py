"""The device step loop with real CUDA graphs (run on the H200): a decode step's only host
sync is its one readback, graphs (with their epilogues and sampling tails) give the eager
path's greedy and seeded sampled tokens, and a long run holds allocated device memory flat."""

import gc
import sys

import pytest
import torch

from sglang_aux.srt.entrypoints.engine import Engine
from sglang_aux.test.ci.ci_register import register_cuda_ci
from sglang_aux.test.runtime_utils import tiny_checkpoint
from sglang_aux.test.sync_checks import strict_sync

register_cuda_ci(est_time=180, suite="default")

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
PROMPTS = ["Hi", "The quick brown fox jumps over", "12 + 30 =", "Natalia sold clips to 48 of",
           "x", "What is the capital of France?"]
GREEDY = {"temperature": 0, "max_new_tokens": 24, "ignore_eos": True}
SAMPLED = {"temperature": 0.8, "top_p": 0.9, "top_k": 20, "max_new_tokens": 24,
           "ignore_eos": True}
COMMON = dict(device="cuda", dtype="float32", max_total_tokens=16384, max_running_requests=8,
              cuda_graph_bs_decode=[1, 2, 4, 8])
KINDS = ["target", "dflash"]


def _engine(tmp_path, kind, **kw):
    spec = {} if kind == "target" else dict(
        speculative_algorithm="DFLASH",
        speculative_draft_model_path=tiny_checkpoint("tiny-llama-dflash", tmp_path))
    return Engine(model_path=tiny_checkpoint("tiny-llama", tmp_path), **spec, **{**COMMON, **kw})


def _mixed():
    return [GREEDY if i % 2 == 0 else dict(SAMPLED, seed=i) for i in range(len(PROMPTS))]


@pytest.mark.parametrize("kind", KINDS)
def test_decode_step_syncs_only_in_its_readback(tmp_path, kind):
    engine = _engine(tmp_path, kind)
    engine.generate(PROMPTS, _mixed())  # warm-up: lazy kernels and allocator growth
    with strict_sync(engine.worker, "decode") as copies:
        outs = engine.generate(PROMPTS, _mixed())
    assert copies and all(c == 1 for c in copies), copies
    assert all(len(o["output_ids"]) == GREEDY["max_new_tokens"] for o in outs)


@pytest.mark.parametrize("kind", KINDS)
def test_graph_steps_equal_eager_steps(tmp_path, kind):
    graphs = _engine(tmp_path, kind)
    assert type(graphs.worker.model_runner.step_graphs.backend).__name__ == "CudaGraphBackend"
    eager = _engine(tmp_path, kind, disable_decode_cuda_graph=True)
    a, b = graphs.generate(PROMPTS, GREEDY), eager.generate(PROMPTS, GREEDY)
    for x, y in zip(a, b, strict=True):
        assert x["output_ids"] == y["output_ids"]
        assert x["meta_info"]["spec_accept_length"] == y["meta_info"]["spec_accept_length"]
    sampled, eager_sampled = graphs.generate(PROMPTS, _mixed()), eager.generate(PROMPTS, _mixed())
    for x, y in zip(sampled, eager_sampled, strict=True):  # seeded: the same draws
        assert len(x["output_ids"]) == GREEDY["max_new_tokens"]
        assert x["output_ids"] == y["output_ids"]


@pytest.mark.parametrize("kind", KINDS)
def test_long_run_holds_allocated_memory_flat(tmp_path, kind):
    engine = _engine(tmp_path, kind)
    params = [dict(p, max_new_tokens=600) for p in _mixed()]
    engine.generate(PROMPTS, params)  # warm-up
    torch.cuda.synchronize()
    gc.collect()  # garbage a cycle holds would be freed at a collector's whim, not leaked
    idle_before = torch.cuda.memory_allocated()
    worker, decode = engine.worker, engine.worker.decode
    full_batch = []

    def sampled_decode(reqs):
        if len(reqs) == len(PROMPTS):
            full_batch.append(torch.cuda.memory_allocated())
        return decode(reqs)

    worker.decode = sampled_decode
    engine.generate(PROMPTS, params)
    torch.cuda.synchronize()
    gc.collect()
    assert torch.cuda.memory_allocated() == idle_before
    steady = full_batch[3:]
    assert len(steady) > 50 and max(steady) == min(steady), (min(steady), max(steady))


if __name__ == "__main__":
    sys.exit(pytest.main([__file__, "-q"]))
