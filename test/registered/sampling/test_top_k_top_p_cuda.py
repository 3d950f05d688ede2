"""Sort-free top-k / top-p on the H200: the Triton kernel and the torch twin against the sorted
reference at SmolLM2's vocabulary (bf16 included), and both as DFlash's tails use them: no
host sync, captured in a CUDA graph (replays equal eager calls bit for bit), with the graph
memory the kernel promises (nothing but its `[rows]` parameters) and the twin's one mask."""

import sys

import pytest
import torch

from sglang_aux.srt.layers.triton_ops.dispatch import ENV_VAR
from sglang_aux.srt.sampling.sampler import sampling_probs
from sglang_aux.test.ci.ci_register import register_cuda_ci
from sglang_aux.test.kernel_checks import REAL_TRITON_ON_CUDA, fresh_seed
from sglang_aux.test.top_k_top_p_reference import KINDS, ROWS, check_rows, logits_of, params_of

register_cuda_ci(est_time=60, suite="default")

pytestmark = REAL_TRITON_ON_CUDA
VOCAB = 49152
TAIL_ROWS = 32 * 8  # the verify tail at bs 32, block 8
PATHS = {"kernel": "auto", "twin": "off"}


@pytest.mark.parametrize("path", PATHS)
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
@pytest.mark.parametrize("kind", KINDS)
def test_matches_the_sorted_reference(kind, dtype, path, monkeypatch):
    monkeypatch.setenv(ENV_VAR, PATHS[path])
    seed = fresh_seed()
    exact = check_rows(kind, dtype, VOCAB, ROWS, seed, device="cuda")
    assert exact >= len(ROWS) // 2, f"seed {seed}: only {exact} rows checked exactly"


def _tail_inputs(seed: int) -> tuple[torch.Tensor, object]:
    g = torch.Generator().manual_seed(seed)
    logits = logits_of("random", TAIL_ROWS, VOCAB, g).to("cuda", torch.bfloat16)
    rows = [ROWS[i % len(ROWS)] for i in range(TAIL_ROWS)]
    return logits, params_of(rows, VOCAB, device="cuda")


@pytest.mark.parametrize("path", PATHS)
def test_captured_in_a_graph_without_host_sync(path, monkeypatch):
    monkeypatch.setenv(ENV_VAR, PATHS[path])
    logits, params = _tail_inputs(seed=0)
    out = torch.full(logits.shape, float("nan"), device="cuda")
    sampling_probs(logits, params, out=out)  # compiles the kernel
    torch.cuda.set_sync_debug_mode("error")  # any synchronizing op raises
    try:
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            sampling_probs(logits, params, out=out)
    finally:
        torch.cuda.set_sync_debug_mode(0)
    torch.cuda.current_stream().wait_stream(side)
    torch.cuda.synchronize()
    before = torch.cuda.memory_reserved()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        sampling_probs(logits, params, out=out)
    pool = torch.cuda.memory_reserved() - before
    fresh, _ = _tail_inputs(seed=1)
    logits.copy_(fresh)
    out.fill_(float("nan"))
    graph.replay()
    torch.testing.assert_close(out, sampling_probs(logits, params), rtol=0, atol=0)
    row_bytes = TAIL_ROWS * VOCAB * 4
    limit = 4 * 2**20 if path == "kernel" else 2 * row_bytes  # the sort path held ~4 x row_bytes
    print(f"{path}: graph pool {pool / 2**20:.1f} MiB for [{TAIL_ROWS}, {VOCAB}]")
    assert pool <= limit, f"{path}: graph pool {pool} B > {limit} B"


def test_kernel_and_twin_agree_on_a_tail():
    logits, params = _tail_inputs(seed=2)
    kernel = sampling_probs(logits, params)
    with pytest.MonkeyPatch.context() as m:
        m.setenv(ENV_VAR, "off")
        twin = sampling_probs(logits, params)
    same = ((kernel > 0) == (twin > 0)).all(-1)
    # exp and division round differently in Triton: a cut may move on a float32 edge
    assert same.float().mean() >= 0.95, f"{int((~same).sum())} of {TAIL_ROWS} rows differ"
    torch.testing.assert_close(kernel[same], twin[same], rtol=1e-4, atol=1e-7)


if __name__ == "__main__":
    sys.exit(pytest.main([__file__, "-q", "-s"]))
