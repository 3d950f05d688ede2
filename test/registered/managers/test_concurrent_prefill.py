"""Concurrent prefill on CPU: a step that admits requests launches their prefill and, beside
it, the running batch's decode step. Every output, finish reason and slot equals the schedule
that prefills in a step of its own, greedy and seeded sampling alike, with and without the
overlap scheduler; and the prefill graphs then own their aux storage (a decode graph never
reads what a prefill beside it writes). The CUDA twin runs the two on two streams."""

import sys

import pytest

from sglang_aux.srt.entrypoints.engine import Engine
from sglang_aux.srt.forward_state.forward_batch_info import ForwardMode
from sglang_aux.test.ci.ci_register import register_cpu_ci
from sglang_aux.test.runtime_utils import assert_kv_all_back, tiny_checkpoint

register_cpu_ci(est_time=30, suite="default")

# more prompts than running rows: the later ones arrive while earlier ones decode
PROMPTS = ["Hi", "The quick brown fox jumps over", "12 + 30 =", "Natalia sold clips to 48 of",
           "x", "What is the capital of France?", "Once upon a time", "1, 2, 3,"]
COMMON = dict(device="cpu", dtype="float32", max_total_tokens=4096, max_running_requests=3,
              cuda_graph_bs_decode=[1, 2, 3], cuda_graph_tokens_prefill=[16, 32, 64],
              cuda_graph_max_bs_prefill=2)


@pytest.fixture(scope="module")
def ckpts(tmp_path_factory):
    root = tmp_path_factory.mktemp("ckpt")
    return {p: tiny_checkpoint(p, root) for p in ("tiny-llama", "tiny-llama-dflash")}


def _engine(ckpts, kind: str, concurrent: bool, overlap: bool) -> Engine:
    spec = {} if kind == "target" else dict(
        speculative_algorithm="DFLASH", speculative_draft_model_path=ckpts["tiny-llama-dflash"])
    return Engine(model_path=ckpts["tiny-llama"], enable_concurrent_prefill=concurrent,
                  disable_overlap_schedule=not overlap, **spec, **COMMON)


def _params() -> list[dict]:
    out = []
    for i in range(len(PROMPTS)):
        p = {"max_new_tokens": 4 + 3 * i, "ignore_eos": True}
        p.update({"temperature": 0} if i % 2 == 0 else
                 {"temperature": 0.8, "top_p": 0.9, "top_k": 20, "seed": 10 + i})
        if i == 3:
            p.update(stop=["e"])
        out.append(p)
    return out


@pytest.mark.parametrize("overlap", [False, True])
@pytest.mark.parametrize("kind", ["target", "dflash"])
def test_prefill_beside_decode_equals_prefill_alone(ckpts, kind, overlap):
    alone = _engine(ckpts, kind, concurrent=False, overlap=overlap)
    beside = _engine(ckpts, kind, concurrent=True, overlap=overlap)
    assert beside.scheduler.side_stream is not None and alone.scheduler.side_stream is None
    for _ in range(2):  # the second round reuses rows and slots, and hits the prefix cache
        want = alone.generate(PROMPTS, _params())
        got = beside.generate(PROMPTS, _params())
        for a, b in zip(want, got, strict=True):
            assert b["output_ids"] == a["output_ids"]
            assert b["meta_info"]["finish_reason"] == a["meta_info"]["finish_reason"]
    stats = beside.scheduler.stats
    assert stats["prefills_beside_decode"] > 0
    assert alone.scheduler.stats["prefills_beside_decode"] == 0
    assert_kv_all_back(beside)


def test_prefill_graphs_own_their_aux_rows_when_beside_decode(ckpts):
    """One aux storage either way; beside decode, the prefill graphs write rows of their own
    after every row a step can write."""
    for concurrent in (False, True):
        runner = _engine(ckpts, "dflash", concurrent, overlap=False).worker.model_runner
        buf = runner.aux_storage.buffer
        row = buf.stride(0) * buf.element_size()
        step = [fb.aux_hidden_states_buffer for fb in runner.step_graphs.static]
        prefills = runner.graph_runners[ForwardMode.EXTEND]
        own = [fb.aux_hidden_states_buffer for fb in prefills.static]
        assert all(t.untyped_storage().data_ptr() == buf.untyped_storage().data_ptr()
                   for t in step + own)
        first = (own[0].data_ptr() - buf.data_ptr()) // row
        assert first == (runner.aux_storage.beside_start if concurrent else 0)
        assert max(t.shape[0] for t in step) <= first or not concurrent
        assert max(t.shape[0] for t in own) == 64


if __name__ == "__main__":
    sys.exit(pytest.main([__file__, "-q"]))
