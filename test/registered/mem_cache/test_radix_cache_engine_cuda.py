"""The prefix cache on the H200 with real CUDA graphs (decode, verify and prefill graphs, whose
prefills start after a cached prefix), fp32 greedy: DFlash with the cache equals target-only
without it, every cached position's target and draft K/V equal an eager recomputation, and
after eviction under a small pool and a flush every slot is back."""

import sys

import pytest
import torch

from sglang_aux.srt.entrypoints.engine import Engine
from sglang_aux.srt.forward_state.forward_batch_info import ForwardMode
from sglang_aux.test.ci.ci_register import register_cuda_ci
from sglang_aux.test.runtime_utils import (
    assert_kv_all_back,
    cached_kv_error,
    committed_tokens,
    tiny_checkpoint,
)

register_cuda_ci(est_time=120, suite="default")

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
SHARED = ("Question: Natalia sold clips to 48 of her friends in April, and then she sold half "
          "as many clips in May. How many clips did Natalia sell altogether?\nAnswer: 72\n\n")
PROMPTS = [SHARED + q for q in ["Question: 12 + 30 =", "Question: what is 7 times 8?", "Q: hi",
                                "Question: Weng earns $12 an hour.", "Question: 12 + 31 =",
                                "Question: x", "Question: a long one " * 4, "Question: 2"]]
GREEDY = {"temperature": 0, "max_new_tokens": 24, "ignore_eos": True}
# prefills in EXTEND graphs of their own (mixed steps, CUDA's default, would carry arrivals)
COMMON = dict(device="cuda", dtype="float32", max_running_requests=8,
              cuda_graph_bs_decode=[1, 2, 4, 8], enable_mixed_chunk=False)


def _run(engine) -> list[dict]:
    """The first prompt alone fills the cache; the rest, batched, hit it; then the first
    again (a whole-prompt hit, less one token)."""
    return [engine.generate(PROMPTS[0], GREEDY), *engine.generate(PROMPTS[1:], GREEDY),
            engine.generate(PROMPTS[0], GREEDY)]


@pytest.mark.parametrize("target", ["tiny-k3", "tiny-llama"])
def test_dflash_with_the_cache_equals_target_only_without(tmp_path, target):
    path = tiny_checkpoint(target, tmp_path)
    ref = _run(Engine(model_path=path, disable_radix_cache=True, max_total_tokens=8192,
                      **COMMON))
    engine = Engine(model_path=path, speculative_algorithm="DFLASH",
                    speculative_draft_model_path=tiny_checkpoint(f"{target}-dflash", tmp_path),
                    max_total_tokens=8192, **COMMON)
    runner = engine.worker.target_runner
    graphs = runner.graph_runners.get(ForwardMode.EXTEND)
    assert graphs is not None and type(graphs.backend).__name__ == "CudaGraphBackend"
    prefixes, replay = [], graphs.replay
    graphs.replay = lambda b: prefixes.extend(b.extend_prefix_lens_cpu) or replay(b)
    finished = []
    engine.scheduler.on_update = lambda r: r.finished and finished.append(r)
    outs = _run(engine)
    assert [o["output_ids"] for o in outs] == [o["output_ids"] for o in ref]
    assert outs[0]["meta_info"]["cached_tokens"] == 0
    assert all(o["meta_info"]["cached_tokens"] > 0 for o in outs[1:])
    assert max(prefixes) > 0, "no prefill graph replayed after a cached prefix"
    for req in finished:
        assert cached_kv_error(engine, committed_tokens(req)) < 1e-3, req.rid
    assert_kv_all_back(engine)


def test_eviction_under_a_small_pool(tmp_path):
    path = tiny_checkpoint("tiny-llama", tmp_path)
    prompts = [[SHARED, SHARED.upper(), SHARED[::-1]][i % 3] + f"Question {i}?"
               for i in range(12)]
    args = dict(speculative_algorithm="DFLASH",
                speculative_draft_model_path=tiny_checkpoint("tiny-llama-dflash", tmp_path),
                **COMMON)
    ref = Engine(model_path=path, disable_radix_cache=True, max_total_tokens=8192,
                 **args).generate(prompts, GREEDY)
    engine = Engine(model_path=path, max_total_tokens=800, **args)
    cache = engine.scheduler.tree_cache
    evicted, evict = [], cache.evict
    cache.evict = lambda n: evicted.append(evict(n)) or evicted[-1]
    outs = [engine.generate(p, GREEDY) for p in prompts[:3]] + engine.generate(prompts[3:],
                                                                                GREEDY)
    assert [o["output_ids"] for o in outs] == [o["output_ids"] for o in ref]
    assert sum(evicted) > 0
    assert any(o["meta_info"]["cached_tokens"] > 0 for o in outs[3:])
    assert_kv_all_back(engine)


if __name__ == "__main__":
    sys.exit(pytest.main([__file__, "-q"]))
