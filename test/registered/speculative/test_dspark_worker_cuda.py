"""DSpark, and DFlash under compact verify, with real CUDA graphs on the H200: greedy output
equals target-only greedy under static and compact verify (the Markov loop or DFlash's
confidences captured in the draft graph, the verify graphs per batch size or per token
bucket), a compact decode step launches without a host sync and queues one readback, and
sampled batches equal the eager path's at every captured size and at padded ones (also over a
draft vocabulary).
Self-contained (tiny presets, fp32), well under a minute."""

import sys

import pytest
import torch

from sglang_aux.srt.entrypoints.engine import Engine
from sglang_aux.test.ci.ci_register import register_cuda_ci
from sglang_aux.test.runtime_utils import (
    assert_graphs_equal_eager,
    engine_in_verify_mode,
    tiny_checkpoint,
)
from sglang_aux.test.sync_checks import strict_sync

register_cuda_ci(est_time=60, suite="default")

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
PROMPTS = ["Hi", "The quick brown fox jumps over", "12 + 30 =", "Natalia sold clips to 48 of",
           "x", "What is the capital of France?"]
GREEDY = {"temperature": 0, "max_new_tokens": 24, "ignore_eos": True}
COMMON = dict(device="cuda", dtype="float32", max_total_tokens=8192, max_running_requests=8,
              cuda_graph_bs_decode=[1, 2, 4, 8], disable_overlap_schedule=True)
SAMPLED = [{"temperature": 0.8, "top_p": 0.9, "top_k": 20}, {"temperature": 1.3},
           {"temperature": 0.6, "top_k": 5}, {"temperature": 1.0, "top_p": 0.7}]


def _dspark(tmp_path, target: str, mode: str, algorithm: str = "DSPARK", **kw) -> Engine:
    return engine_in_verify_mode(
        mode, model_path=tiny_checkpoint(target, tmp_path), speculative_algorithm=algorithm,
        speculative_draft_model_path=tiny_checkpoint(f"{target}-{algorithm.lower()}", tmp_path),
        **{**COMMON, **kw})


@pytest.mark.parametrize("target,mode,algorithm", [
    ("tiny-llama", "static", "DSPARK"), ("tiny-llama", "compact", "DSPARK"),
    ("tiny-k3", "compact", "DSPARK"), ("tiny-llama", "compact", "DFLASH"),
    ("tiny-k3", "compact", "DFLASH")])
def test_greedy_equals_target_only_with_cuda_graphs(tmp_path, target, mode, algorithm):
    ref = Engine(model_path=tiny_checkpoint(target, tmp_path), **COMMON).generate(
        PROMPTS, GREEDY)
    engine = _dspark(tmp_path, target, mode, algorithm)
    worker = engine.worker
    for runner in (worker.draft_runner, worker.target_runner):
        assert type(runner.step_graphs.backend).__name__ == "CudaGraphBackend"
    with strict_sync(worker, "decode") as readbacks:
        outs = engine.generate(PROMPTS, GREEDY)
    assert readbacks and all(n == 1 for n in readbacks)
    for r, o in zip(ref, outs, strict=True):
        assert o["output_ids"] == r["output_ids"]
        m = o["meta_info"]
        assert m["spec_verify_ct"] > 0
        if mode == "static":
            assert m["spec_verify_tokens"] == worker.verify_width * m["spec_verify_ct"]
        else:
            assert m["spec_verify_tokens"] < worker.verify_width * m["spec_verify_ct"]


@pytest.mark.parametrize("mode,algorithm", [("static", "DSPARK"), ("compact", "DSPARK"),
                                            ("compact", "DFLASH")])
def test_sampled_graphs_equal_eager_at_every_size(tmp_path, mode, algorithm):
    graphs = _dspark(tmp_path, "tiny-llama", mode, algorithm)
    eager = _dspark(tmp_path, "tiny-llama", mode, algorithm, disable_decode_cuda_graph=True)
    assert len(graphs.worker.draft_runner.step_graphs.sampling_graphs) == 4
    assert_graphs_equal_eager(graphs, eager, PROMPTS,
                              lambda i: dict(GREEDY, **SAMPLED[i % 4], seed=i))


def test_a_draft_vocabulary_graphs_equal_eager_and_stay_lossless(tmp_path):
    """`--speculative-token-map` (200 of 320 ids): the Markov kernel over the map's columns in
    the draft graph; sampled and greedy requests equal the eager path's at every size, greedy
    output stays the target's."""
    ids = torch.randperm(320, generator=torch.Generator().manual_seed(1))[:200]
    torch.save(ids, tmp_path / "map.pt")
    kw = {"speculative_token_map": str(tmp_path / "map.pt")}
    graphs = _dspark(tmp_path, "tiny-llama", "static", **kw)
    eager = _dspark(tmp_path, "tiny-llama", "static", disable_decode_cuda_graph=True, **kw)
    assert graphs.worker.draft_runner.step_graphs.buffers.next_token_logits_buffer.shape[1] \
        == 200
    assert_graphs_equal_eager(graphs, eager, PROMPTS, lambda i: dict(GREEDY) if i % 2
                              else dict(GREEDY, **SAMPLED[i % 4], seed=i))
    ref = Engine(model_path=tiny_checkpoint("tiny-llama", tmp_path), **COMMON).generate(
        PROMPTS, GREEDY)
    for r, o in zip(ref, graphs.generate(PROMPTS, GREEDY), strict=True):
        assert o["output_ids"] == r["output_ids"]


if __name__ == "__main__":
    sys.exit(pytest.main([__file__, "-q"]))
