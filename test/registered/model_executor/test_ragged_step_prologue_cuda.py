"""Ragged verify steps with real CUDA graphs and the Triton attention on the H200 (compact
verify's layout, each request's keys read once through `ForwardBatch.ragged`): at every
captured token bucket and at padded totals the graph's step equals the eager step, and every
verified token's logits equal the static layout's row for it (a request of 300 cached
tokens among them, so the key split and its merge run). Self-contained (tiny presets, fp32),
well under a minute."""

import sys

import pytest
import torch

from sglang_aux.test.ci.ci_register import register_cuda_ci
from sglang_aux.test.ragged_steps import RaggedTrio, spread
from sglang_aux.test.runtime_utils import tiny_checkpoint

register_cuda_ci(est_time=60, suite="default")

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")

WIDTH = 8
PROMPT_LENS = [9, 300, 3, 40, 77, 120, 1, 18]
SIZES = [1, 2, 4, 8]
COMMON = dict(device="cuda", dtype="float32", max_running_requests=8, max_total_tokens=4096,
              context_length=512, cuda_graph_bs_decode=SIZES, attention_backend="triton")
# fp32 (IEEE dots); the layouts differ in summation order only (GEMMs of other row counts):
# seen up to 1.3e-4 on logits of magnitude ~8 (tiny-k3 on the CPU)
TOL = dict(rtol=1e-4, atol=1e-3)


@pytest.mark.parametrize("preset", ["tiny-llama", "tiny-k3"])
def test_ragged_graphs_equal_eager_and_static_at_every_bucket(tmp_path, preset):
    trio = RaggedTrio.create(tiny_checkpoint(preset, tmp_path), WIDTH, PROMPT_LENS, **COMMON)
    assert type(trio.runners["graphs"].step_graphs.backend).__name__ == "CudaGraphBackend"
    buckets = trio.buckets()
    assert buckets[-1] == SIZES[-1] * WIDTH
    # between buckets: a padded replay of the next one
    padded = [n + 1 for n, m in zip(buckets, buckets[1:], strict=False) if m > n + 1]
    assert padded
    replayed = set()
    for total in sorted({*buckets, *padded}):
        lens = spread(total, min(len(PROMPT_LENS), total), WIDTH)
        fa, got = trio.step("graphs", lens)
        _, want = trio.step("eager", lens)
        replayed.add(trio.runners["graphs"].step_graphs.layouts[fa.prepared_graph].step_bs)
        torch.testing.assert_close(got, want, **TOL, msg=f"graph != eager at {lens}")
        torch.testing.assert_close(got, trio.static_rows(lens), **TOL,
                                   msg=f"ragged != static at {lens}")
    assert replayed == set(buckets)


if __name__ == "__main__":
    sys.exit(pytest.main([__file__, "-q"]))
