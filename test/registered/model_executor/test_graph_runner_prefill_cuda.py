"""Prefill graphs with real CUDA graphs and the Triton backend (run on the H200): replay equals
eager at every captured token count and at padded ones, a prefill's only host sync is its
readback, and DFlash engines with and without prefill graphs generate the same tokens."""

import sys

import pytest
import torch

from sglang_aux.srt.entrypoints.engine import Engine
from sglang_aux.srt.forward_state.forward_batch_info import ForwardMode
from sglang_aux.srt.managers.schedule_batch import extend_inputs
from sglang_aux.srt.model_executor.runner.forward_parts import ForwardParts
from sglang_aux.test.ci.ci_register import register_cuda_ci
from sglang_aux.test.runtime_utils import make_runner, new_requests, release, tiny_checkpoint
from sglang_aux.test.sync_checks import strict_sync

register_cuda_ci(est_time=120, suite="default")

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
TOKENS = [16, 32, 64, 128]
COMMON = dict(device="cuda", dtype="float32", max_running_requests=4, max_total_tokens=8192,
              context_length=512, cuda_graph_tokens_prefill=TOKENS, cuda_graph_max_bs_prefill=2,
              enable_mixed_chunk=False)  # prefills in EXTEND graphs of their own
BATCHES = [[16], [20, 12], [64], [128], [10], [40, 7], [100, 3], [5]]


@pytest.mark.parametrize("preset", ["tiny-llama", "tiny-qwen3", "tiny-k3"])
def test_cuda_prefill_graph_replay_equals_eager(tmp_path, preset):
    path = tiny_checkpoint(preset, tmp_path)
    graphs = make_runner(path, **COMMON)
    graphs.init_forwards(ForwardParts(ForwardMode.EXTEND))
    assert type(graphs.graph_runners[ForwardMode.EXTEND].backend).__name__ == "CudaGraphBackend"
    eager = make_runner(path, **{**COMMON, "disable_prefill_cuda_graph": True})
    eager.init_forwards(ForwardParts(ForwardMode.EXTEND))
    for seed, lens in enumerate(BATCHES):
        a, b = new_requests(graphs, lens, seed), new_requests(eager, lens, seed)
        fa = graphs.prepare(extend_inputs(graphs, a))
        fb = eager.prepare(extend_inputs(eager, b))
        assert fa.prepared_graph is not None and fb.prepared_graph is None
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
    with strict_sync(engine.worker, "prefill") as copies:
        for p in PROMPTS[:3]:
            engine.generate(input_ids=p, sampling_params=GREEDY)
    assert copies == [1, 1, 1]
    assert torch.cuda.get_sync_debug_mode() == 0


if __name__ == "__main__":
    sys.exit(pytest.main([__file__, "-q"]))
