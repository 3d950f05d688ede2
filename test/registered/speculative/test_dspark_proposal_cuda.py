"""DSpark's sequential proposal and `compact` verify lengths on the H200: no host sync (CUDA
sync debug mode raises on one), captured in a CUDA graph whose replays equal eager calls bit
for bit on fresh inputs, and the same proposals, confidences and lengths as on the CPU."""

import sys
from types import SimpleNamespace

import pytest
import torch

from sglang_aux.srt.configs.presets import PRESETS, TINY_VOCAB
from sglang_aux.srt.models.dspark import DSparkDraftModel
from sglang_aux.srt.models.weight_utils import init_random_weights
from sglang_aux.srt.sampling.sampler import SamplingTensors
from sglang_aux.srt.speculative.dspark_proposal import propose_block
from sglang_aux.srt.speculative.verify_plan import compact_verify_lens
from sglang_aux.test.ci.ci_register import register_cuda_ci
from sglang_aux.test.kernel_checks import REAL_TRITON_ON_CUDA

register_cuda_ci(est_time=30, suite="default")

pytestmark = REAL_TRITON_ON_CUDA
BS = 8
HIDDEN = PRESETS["tiny-llama-dspark"]["hidden_size"]
BUCKETS = [8, 16, 24, 32]


def draft_on(device) -> DSparkDraftModel:
    draft = DSparkDraftModel(SimpleNamespace(**PRESETS["tiny-llama-dspark"]))
    init_random_weights(draft, seed=0)
    return draft.to(device).eval()


def inputs(gamma, seed, device):
    g = torch.Generator().manual_seed(seed)
    base = 3.0 * torch.randn(BS, gamma, TINY_VOCAB, generator=g)
    hidden = torch.randn(BS, gamma, HIDDEN, generator=g)
    anchors = torch.randint(0, TINY_VOCAB, (BS,), generator=g)
    positions = torch.randint(10, 500, (BS, 1), generator=g) + torch.arange(gamma)
    temperature = torch.tensor([0.0, 0.7, 1.0, 1.3] * (BS // 4))
    top_k = torch.tensor([TINY_VOCAB, 20, TINY_VOCAB, 50] * (BS // 4))
    params = SamplingTensors(temperature=temperature, top_k=top_k,
                             top_p=torch.tensor([1.0, 1.0, 0.8, 0.9] * (BS // 4)),
                             seed=torch.arange(BS, dtype=torch.int64) * 7 + seed,
                             is_greedy=(temperature < 1e-6) | (top_k == 1))
    moved = SamplingTensors(*(t.to(device) for t in (params.temperature, params.top_k,
                                                      params.top_p, params.seed,
                                                      params.is_greedy)))
    return [t.to(device) for t in (base, hidden, anchors, positions)], moved


def step(draft, tensors, params, all_greedy):
    base, hidden, anchors, positions = tensors
    out = propose_block(draft, base, anchors, positions, params, all_greedy=all_greedy,
                        hidden=hidden)
    lens = compact_verify_lens(out.confidence, budget=BS, buckets=BUCKETS)
    return out.tokens, out.confidence, lens.verify_lens


@pytest.mark.parametrize("all_greedy", [True, False])
def test_same_as_on_the_cpu(all_greedy):
    cpu, gpu = draft_on("cpu"), draft_on("cuda")
    with torch.no_grad():
        ref = step(cpu, *inputs(cpu.num_proposals, 0, "cpu"), all_greedy)
        got = step(gpu, *inputs(gpu.num_proposals, 0, "cuda"), all_greedy)
    assert torch.equal(got[0].cpu(), ref[0])
    torch.testing.assert_close(got[1].cpu(), ref[1])
    assert torch.equal(got[2].cpu(), ref[2])


@pytest.mark.parametrize("all_greedy", [True, False])
def test_captured_in_a_graph_without_host_sync(all_greedy):
    draft = draft_on("cuda")
    tensors, params = inputs(draft.num_proposals, 1, "cuda")
    with torch.no_grad():
        step(draft, tensors, params, all_greedy)  # compiles the kernels
        torch.cuda.synchronize()
        torch.cuda.set_sync_debug_mode("error")
        try:
            side = torch.cuda.Stream()
            side.wait_stream(torch.cuda.current_stream())
            with torch.cuda.stream(side):
                step(draft, tensors, params, all_greedy)
        finally:
            torch.cuda.set_sync_debug_mode(0)
        torch.cuda.current_stream().wait_stream(side)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            captured = step(draft, tensors, params, all_greedy)
        fresh, fresh_params = inputs(draft.num_proposals, 2, "cuda")
        for t, f in zip(tensors, fresh, strict=True):
            t.copy_(f)
        params.seed.copy_(fresh_params.seed)
        graph.replay()
        eager = step(draft, tensors, params, all_greedy)
        torch.cuda.synchronize()
    for a, b in zip(captured, eager, strict=True):
        assert torch.equal(a, b)


if __name__ == "__main__":
    sys.exit(pytest.main([__file__, "-q"]))
