"""Prefill graphs with real CUDA graphs and the Triton backend (run on the H200): replay equals
eager at every captured token count and at padded ones, a prefill's only host sync is its
readback, and DFlash engines with and without prefill graphs generate the same tokens."""

import sys

import pytest
import torch

from sglang_aux.srt.entrypoints.engine import Engine
from sglang_aux.srt.managers.schedule_batch import Req, build_extend_batch
from sglang_aux.srt.sampling.sampling_params import SamplingParams
from sglang_aux.test.ci.ci_register import register_cuda_ci
from sglang_aux.test.runtime_utils import make_runner, release, tiny_checkpoint

register_cuda_ci(est_time=120, suite="default")

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
TOKENS = [16, 32, 64, 128]
COMMON = dict(device="cuda", dtype="float32", max_running_requests=4, max_total_tokens=8192,
              context_length=512, cuda_graph_tokens_prefill=TOKENS, cuda_graph_max_bs_prefill=2)
BATCHES = [[16], [20, 12], [64], [128], [10], [40, 7], [100, 3], [5]]


def _reqs(runner, lens, seed):
    g = torch.Generator().manual_seed(seed)
    vocab = runner.model_config.hf_config.vocab_size
    reqs = [Req(f"r{i}", torch.randint(0, vocab, (n,), generator=g).tolist(), SamplingParams())
            for i, n in enumerate(lens)]
    for r in reqs:
        r.req_pool_idx = runner.req_to_token_pool.alloc()
    return reqs


@pytest.mark.parametrize("preset", ["tiny-llama", "tiny-qwen3", "tiny-k3"])
def test_cuda_prefill_graph_replay_equals_eager(tmp_path, preset):
    path = tiny_checkpoint(preset, tmp_path)
    graphs = make_runner(path, **COMMON)
    graphs.init_prefill_graphs()
    assert type(graphs.prefill_graph_runner.backend).__name__ == "CudaGraphBackend"
    eager = make_runner(path, **{**COMMON, "disable_prefill_cuda_graph": True})
    for seed, lens in enumerate(BATCHES):
        a, b = _reqs(graphs, lens, seed), _reqs(eager, lens, seed)
        fa, fb = build_extend_batch(graphs, a), build_extend_batch(eager, b)
        assert graphs.prefill_graph_runner.can_run_graph(fa)
        la = graphs.forward(fa).next_token_logits.clone()
        lb = eager.forward(fb).next_token_logits
        torch.testing.assert_close(la, lb, rtol=1e-4, atol=1e-4)
        assert torch.equal(la.argmax(-1), lb.argmax(-1))
        release(graphs, a)
        release(eager, b)


def _engine(tmp_path, **kw):
    return Engine(model_path=tiny_checkpoint("tiny-llama", tmp_path),
                  speculative_algorithm="DFLASH",
                  speculative_draft_model_path=tiny_checkpoint("tiny-llama-dflash", tmp_path),
                  cuda_graph_bs_decode=[1, 2, 4], **{**COMMON, **kw})


PROMPTS = [list(range(3, 3 + n)) for n in (5, 17, 40, 90, 127)]
GREEDY = {"temperature": 0, "max_new_tokens": 16, "ignore_eos": True}


@pytest.mark.parametrize("projection", ["packed", "streamed"])
def test_cuda_dflash_with_prefill_graphs_generates_the_same(tmp_path, projection):
    graphs = _engine(tmp_path, speculative_dflash_aux_projection=projection)
    eager = _engine(tmp_path, speculative_dflash_aux_projection=projection,
                    disable_prefill_cuda_graph=True)
    for p in PROMPTS:
        x = graphs.generate(input_ids=p, sampling_params=GREEDY)
        y = eager.generate(input_ids=p, sampling_params=GREEDY)
        assert x["output_ids"] == y["output_ids"]


def test_cuda_prefill_syncs_only_in_its_readback(tmp_path):
    engine = _engine(tmp_path)
    engine.generate(input_ids=PROMPTS[2], sampling_params=GREEDY)  # warm-up
    worker, readback = engine.worker, engine.worker.readback
    fetch, prefill = readback.fetch, worker.prefill
    copies = []

    def allowed_fetch(t):
        mode = torch.cuda.get_sync_debug_mode()  # strict inside a prefill, off in a decode step
        torch.cuda.set_sync_debug_mode(0)
        try:
            return fetch(t)
        finally:
            torch.cuda.set_sync_debug_mode(mode)

    def strict_prefill(reqs):
        before = readback.num_copies
        torch.cuda.set_sync_debug_mode("error")
        try:
            return prefill(reqs)
        finally:
            torch.cuda.set_sync_debug_mode(0)
            copies.append(readback.num_copies - before)

    readback.fetch, worker.prefill = allowed_fetch, strict_prefill
    try:
        for p in PROMPTS[:3]:
            engine.generate(input_ids=p, sampling_params=GREEDY)
    finally:
        torch.cuda.set_sync_debug_mode(0)  # later tests in this process sync freely
    assert copies == [1, 1, 1]
    assert torch.cuda.get_sync_debug_mode() == 0


if __name__ == "__main__":
    sys.exit(pytest.main([__file__, "-q"]))
