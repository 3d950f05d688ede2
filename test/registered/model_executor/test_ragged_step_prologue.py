"""Ragged verify steps through runners on the CPU (eager-replay graphs), with the torch-native
attention and with the Triton one under the interpreter (which reads each request's keys once
through `ForwardBatch.ragged`): at every captured token bucket and at padded totals, a graph's
step equals the eager step, and every verified token's logits equal the static layout's row
for it; the prologue's request layout is what the host asked for."""

import os

# NOTE: must precede any @triton.jit definition, i.e. any import of the Triton backend.
os.environ["TRITON_INTERPRET"] = "1"

import sys  # noqa: E402

import pytest  # noqa: E402
import torch  # noqa: E402

from sglang_aux.srt.layers.attention.triton_backend import TritonAttnBackend  # noqa: E402
from sglang_aux.srt.model_executor.runner.ragged_step_prologue import (  # noqa: E402
    RaggedStepPrologue,
)
from sglang_aux.test.ci.ci_register import register_cpu_ci  # noqa: E402
from sglang_aux.test.ragged_steps import RaggedTrio, spread  # noqa: E402
from sglang_aux.test.runtime_utils import tiny_checkpoint  # noqa: E402

register_cpu_ci(est_time=90, suite="default")

WIDTH = 4
PROMPT_LENS = [9, 30, 3, 17]
COMMON = dict(max_running_requests=4, max_total_tokens=1024, context_length=128,
              cuda_graph_bs_decode=[1, 2, 4])
TOL = dict(rtol=1e-4, atol=1e-4)  # fp32; the layouts differ in summation order only


@pytest.fixture(scope="module")
def path(tmp_path_factory):
    return tiny_checkpoint("tiny-llama", tmp_path_factory.mktemp("ckpt"))


@pytest.mark.parametrize("backend", ["torch_native", "triton"])
def test_ragged_steps_equal_eager_and_static_at_every_bucket(path, backend):
    trio = RaggedTrio.create(path, WIDTH, PROMPT_LENS, attention_backend=backend, **COMMON)
    buckets = trio.buckets()
    assert buckets == [*range(1, 9), 10, 12, 14, 16]
    padded = [9, 11, 13]  # replay the 10, 12 and 14 buckets with padding tokens
    replayed = set()
    for total in sorted({*buckets, *padded}):
        lens = spread(total, min(len(PROMPT_LENS), total), WIDTH)
        fa, got = trio.step("graphs", lens)
        fb, want = trio.step("eager", lens)
        assert fa.prepared_graph is not None and fb.prepared_graph is None
        replayed.add(trio.runners["graphs"].step_graphs.layouts[fa.prepared_graph].step_bs)
        torch.testing.assert_close(got, want, **TOL, msg=f"graph != eager at {lens}")
        torch.testing.assert_close(got, trio.static_rows(lens), **TOL,
                                   msg=f"ragged != static at {lens}")
        bs, rag = len(lens), fb.ragged
        reqs = trio.reqs["eager"][:bs]
        assert rag.lens.tolist() == lens + [0] * (total - bs) and rag.width == WIDTH
        assert rag.request_rows[:bs].tolist() == [r.req_pool_idx for r in reqs]
        assert rag.prefix_lens[:bs].tolist() == [r.kv_len for r in reqs]
        assert rag.q_start[:bs].tolist() == [sum(lens[:i]) for i in range(bs)]
    assert replayed == set(buckets)


def test_the_triton_backend_reads_the_request_layout(path, monkeypatch):
    """Every TARGET_VERIFY call of a ragged runner (its captures and eager steps) hands the
    Triton backend a batch whose `ragged` layout is set; the static runner's never do."""
    seen, forward = [], TritonAttnBackend.forward

    def recording(self, q, k, v, layer, fb, save_kv_cache=True):
        if fb.forward_mode.name == "TARGET_VERIFY":
            seen.append((self, fb.ragged is not None))
        return forward(self, q, k, v, layer, fb, save_kv_cache)

    monkeypatch.setattr(TritonAttnBackend, "forward", recording)
    trio = RaggedTrio.create(path, WIDTH, PROMPT_LENS[:2], attention_backend="triton",
                             **dict(COMMON, cuda_graph_bs_decode=[2]))
    trio.step("eager", [WIDTH, 1])
    trio.static_rows([WIDTH, 1])
    by_runner = {name: {ragged for backend, ragged in seen if backend is runner.attn_backend}
                 for name, runner in trio.runners.items()}
    assert by_runner == {"graphs": {True}, "eager": {True}, "static": {False}}


def test_ragged_prologue_rejects_a_bad_width():
    with pytest.raises(ValueError, match="a ragged step's width must be >= 1, got 0"):
        RaggedStepPrologue(lens=lambda n: None, request_rows=lambda n: None, width=0)
    with pytest.raises(ValueError, match="a ragged step's most requests must be >= 0"):
        RaggedStepPrologue(lens=lambda n: None, request_rows=lambda n: None, width=2,
                           max_requests=-1)


if __name__ == "__main__":
    sys.exit(pytest.main([__file__, "-q"]))
