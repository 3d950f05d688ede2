"""Chunked prefill with real CUDA graphs (run on the H200): fp32 greedy outputs with
`--chunked-prefill-size` equal unchunked ones, target-only and DFlash (packed, staged MXFP8 and
streamed projections), for a chunk below one draft block and prompts ending on a chunk
boundary, decode/verify and prefill graphs replayed, overlap on; an abort mid chunked prefill
gives every slot and row back; and no chunk step allocates a transient aux tensor. With
`--enable-mixed-chunk` the chunks ride in captured MIXED graphs and outputs stay equal."""

import sys

import pytest
import torch

from sglang_aux.srt.entrypoints.engine import Engine
from sglang_aux.test.ci.ci_register import register_cuda_ci
from sglang_aux.test.runtime_utils import assert_kv_all_back, tiny_checkpoint

register_cuda_ci(est_time=180, suite="default")

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
GREEDY = {"temperature": 0, "max_new_tokens": 12, "ignore_eos": True}
COMMON = dict(device="cuda", dtype="float32", max_total_tokens=8192, max_running_requests=4,
              cuda_graph_bs_decode=[1, 2, 4], cuda_graph_tokens_prefill=[16, 64],
              cuda_graph_max_bs_prefill=2, context_length=1024,
              enable_mixed_chunk=False)  # chunks between steps unless a test asks for mixed
LENS = [5, 48, 111, 300, 3, 64]  # 48 and 64 end on 16-token chunk boundaries
PROJECTIONS = {"packed": {},
               "staged": dict(speculative_draft_fc_quantization="mxfp8",
                              dflash_staged_projection_min_tokens=1),
               "streamed": dict(speculative_dflash_aux_projection="streamed")}


def _engine(tmp_path, kind: str, chunk: int, **kw) -> Engine:
    spec = {} if kind == "target" else dict(
        speculative_algorithm="DFLASH",
        speculative_draft_model_path=tiny_checkpoint("tiny-k3-dflash", tmp_path))
    return Engine(model_path=tiny_checkpoint("tiny-k3", tmp_path), chunked_prefill_size=chunk,
                  **spec, **{**COMMON, **kw})


def _prompts(vocab: int) -> list[list[int]]:
    g = torch.Generator().manual_seed(0)
    return [torch.randint(0, vocab, (n,), generator=g).tolist() for n in LENS]


@pytest.mark.parametrize("kind,projection", [("target", "packed"), ("dflash", "packed"),
                                             ("dflash", "staged"), ("dflash", "streamed")])
def test_chunked_equals_unchunked_with_graphs(tmp_path, kind, projection):
    ref = _engine(tmp_path, kind, -1, **PROJECTIONS[projection])
    prompts = _prompts(ref.model_config.hf_config.vocab_size)
    want = [o["output_ids"] for o in ref.generate(input_ids=prompts, sampling_params=GREEDY)]
    for n in (3, 16):
        eng = _engine(tmp_path, kind, n, **PROJECTIONS[projection])
        runner = eng.worker.model_runner
        assert runner.step_graphs is not None and runner.prefill_graph_limits() is not None
        got = [o["output_ids"] for o in eng.generate(input_ids=prompts, sampling_params=GREEDY)]
        assert got == want, n
        assert eng.scheduler.stats["chunked_prefill_steps"] > 0
        if kind == "dflash":
            assert runner.aux_storage.rows(n) is not None  # a chunk fits the one storage
        assert_kv_all_back(eng)


@pytest.mark.parametrize("kind", ["target", "dflash"])
def test_abort_mid_chunked_prefill_gives_everything_back(tmp_path, kind):
    eng = _engine(tmp_path, kind, 16)
    sched = eng.scheduler
    (long_,) = _prompts(eng.model_config.hf_config.vocab_size)[3:4]
    req = eng.make_request(input_ids=long_, sampling_params=GREEDY)
    sched.add_request(req)
    while not (sched.chunked is req and req.kv_len >= 64):
        sched.step()
    sched.abort(req)
    while sched.has_work():
        sched.step()
    torch.cuda.synchronize()
    assert_kv_all_back(eng)


@pytest.mark.parametrize("kind,projection", [("target", "packed"), ("dflash", "packed"),
                                             ("dflash", "streamed")])
def test_mixed_chunks_equal_unchunked_with_graphs(tmp_path, kind, projection):
    """A long prompt arriving while a request decodes: its chunks (min(N, 16) tokens) ride in
    the running batch's MIXED graph replays; outputs equal unchunked, non-mixed ones."""
    ref = _engine(tmp_path, kind, -1, **PROJECTIONS[projection])
    short, long_ = _prompts(ref.model_config.hf_config.vocab_size)[:4:3]
    params = [{**GREEDY, "max_new_tokens": 80}, GREEDY]
    want = [o["output_ids"] for o in ref.generate(input_ids=[short, long_],
                                                  sampling_params=params)]
    for n in (3, 64):
        eng = _engine(tmp_path, kind, n, enable_mixed_chunk=True,
                      mixed_chunk_max_prefill_tokens=16, **PROJECTIONS[projection])
        assert eng.worker.model_runner.mixed_limits()[2] == 16
        sched = eng.scheduler
        a = eng.make_request(input_ids=short, sampling_params=params[0])
        b = eng.make_request(input_ids=long_, sampling_params=params[1])
        sched.add_request(a)
        sched.step()
        sched.add_request(b)
        while sched.has_work():
            sched.step()
        assert [a.output_ids, b.output_ids] == want, n
        # `a` may finish first: the chunks left then run in steps of their own
        assert sched.stats["mixed_steps"] > 0
        assert sched.stats["chunked_prefill_steps"] >= len(long_) // min(n, 16) - 1
        torch.cuda.synchronize()
        assert_kv_all_back(eng)


if __name__ == "__main__":
    sys.exit(pytest.main([__file__, "-v"]))
