"""Streamed TARGET_VERIFY graphs (issue 14): the verify runner owns one fp32 accumulator
`[max_num_token, H_draft]` instead of the packed `[max_num_token, K*H]` buffer, each forward
projects its aux states into it and commits the draft context from it in the same forward.
fp32 on CPU (the eager-replay backend runs the graph runner's logic); the _cuda twin replays
real CUDA graphs."""

import sys

import pytest
import torch
from test_dflash_worker import _draft_context_error, _run_steps

from sglang_aux.srt.entrypoints.engine import Engine
from sglang_aux.srt.forward_state.forward_batch_info import ForwardMode
from sglang_aux.srt.managers.schedule_batch import reserve_kv, step_inputs
from sglang_aux.srt.managers.scheduler.scheduler_info import graph_memory
from sglang_aux.test.ci.ci_register import register_cpu_ci
from sglang_aux.test.runtime_utils import (
    assert_kv_all_back,
    prefill_random,
    publish_rows,
    release,
    tiny_checkpoint,
)

register_cpu_ci(est_time=90, suite="default")

PROMPTS = ["Hi", "The quick brown fox jumps over", "12 + 30 =", "Natalia sold clips to 48 of"]
GREEDY = {"temperature": 0, "max_new_tokens": 14, "ignore_eos": True}
CAPTURE_BS = [1, 2, 4]
CASES = [("tiny-llama", False), ("tiny-k3", False), ("tiny-k3", True)]  # (target, MXFP8 fc)


@pytest.fixture
def device():
    """The device under test; test_draft_context_streamed_cuda.py overrides it."""
    return "cpu"


@pytest.fixture
def dtype():
    return "float32"


def _common(device: str, dtype: str) -> dict:
    return dict(device=device, dtype=dtype, max_total_tokens=4096,
                cuda_graph_bs_decode=CAPTURE_BS, max_running_requests=4)


def _streamed(tmp_path, device, dtype, target: str, mxfp8: bool, **kw) -> Engine:
    return Engine(model_path=tiny_checkpoint(target, tmp_path), speculative_algorithm="DFLASH",
                  speculative_draft_model_path=tiny_checkpoint(f"{target}-dflash", tmp_path),
                  speculative_draft_fc_quantization="mxfp8" if mxfp8 else None,
                  speculative_dflash_aux_projection="streamed", chunked_prefill_size=-1,
                  **_common(device, dtype), **kw)


def _count_replays(graph_runner) -> list[int]:
    replays, replay = [], graph_runner.backend.replay
    graph_runner.backend.replay = lambda g: replays.append(1) or replay(g)
    return replays


@pytest.mark.parametrize("target,mxfp8", CASES)
def test_greedy_streamed_verify_equals_target_only(tmp_path, device, dtype, target, mxfp8):
    ref = Engine(model_path=tiny_checkpoint(target, tmp_path),
                 **_common(device, dtype)).generate(PROMPTS, GREEDY)
    engine = _streamed(tmp_path, device, dtype, target, mxfp8)
    gr = engine.worker.target_runner.step_graphs
    replays = _count_replays(gr)
    outs = engine.generate(PROMPTS, GREEDY)
    assert replays, "no verify graph replayed"
    for a, b in zip(ref, outs, strict=True):
        if dtype == "float32":
            assert a["output_ids"] == b["output_ids"]
        assert b["meta_info"]["spec_verify_ct"] > 0
    for x, fb in zip(gr.layouts, gr.static, strict=True):  # every graph streamed all K slices
        assert fb.aux_projection.num_accumulated == fb.aux_projection.num_slices, x
    assert_kv_all_back(engine)


def test_verify_runner_holds_only_the_accumulator(tmp_path, device, dtype):
    engine = _streamed(tmp_path, device, dtype, "tiny-k3", mxfp8=False)
    runner = engine.worker.target_runner
    gr, storage = runner.step_graphs, runner.aux_storage
    draft = engine.worker.draft_runner.model
    assert storage.streamed
    assert all(out.aux_hidden_states is None for out in gr.outputs)
    # the prefill graphs (CUDA) write the same accumulator: it has rows for the largest
    rows = max([runner.server_args.max_running_requests * engine.worker.verify_width,
                *runner.prefill_capture_tokens])
    assert storage.buffer.shape == (rows, draft.fc.out_features)
    assert storage.buffer.dtype == torch.float32
    for x, fb in zip(gr.layouts, gr.static, strict=True):  # row prefixes of the one acc
        acc = fb.aux_projection.acc
        assert acc.data_ptr() == storage.buffer.data_ptr()
        assert acc.shape[0] == x.num_tokens
    nbytes = storage.buffer.numel() * 4
    info = graph_memory(runner)
    assert info["aux_path"] == "streamed" and info["aux_buffer_bytes"] == nbytes
    packed = rows * draft.fc.in_features * torch.finfo(torch.float32).bits // 8
    assert nbytes < packed


@pytest.mark.parametrize("target,mxfp8", CASES)
def test_replay_equals_eager_at_every_size_and_padded(tmp_path, device, dtype, target, mxfp8):
    worker = _streamed(tmp_path, device, dtype, target, mxfp8).worker
    runner, pool = worker.target_runner, worker.draft_runner.token_to_kv_pool
    gr, block = runner.step_graphs, worker.verify_width
    # a padded replay runs other matmul shapes than eager: single-threaded CPU BLAS rounds
    # K3's logits up to 1.2e-5 apart (2 threads: under 1e-5)
    tol = 3e-5 if dtype == "float32" else 2e-2
    g = torch.Generator().manual_seed(0)
    vocab = runner.model_config.hf_config.vocab_size
    for bs in [1, 2, 3, 4]:  # 3 pads to 4
        reqs = prefill_random(runner, [5 + 3 * i for i in range(bs)], seed=bs)
        for r in reqs:
            reserve_kv(runner, r, r.kv_len + block)
        publish_rows(runner, reqs)
        # random drafts where the verify graph's prologue reads them
        worker.proposals.tokens[:bs] = torch.randint(0, vocab, (bs, block - 1), generator=g)
        rows = runner.req_to_token_pool.req_to_token
        slots = torch.cat([rows[r.req_pool_idx, r.kv_len : r.kv_len + block] for r in reqs]).long()
        got = []
        for eager in (False, True):
            for k in pool.k_buffer:
                k[slots] = float("nan")
            if eager:  # no verify graphs: ModelRunner's eager path
                del runner.graph_runners[ForwardMode.TARGET_VERIFY]
            fb = runner.prepare(step_inputs(reqs, ForwardMode.TARGET_VERIFY, block))
            assert (fb.prepared_graph is None) == eager
            logits = runner.forward(fb).next_token_logits.clone()
            runner.graph_runners[ForwardMode.TARGET_VERIFY] = gr
            ctx = [k[slots].clone() for k in pool.k_buffer]
            got.append((logits, ctx, worker.acceptance.verdicts[:bs].clone()))
        (logits, ctx, verdict), (e_logits, e_ctx, e_verdict) = got
        assert logits.shape[0] == bs * block
        torch.testing.assert_close(logits, e_logits, rtol=tol, atol=tol)
        for c, e in zip(ctx, e_ctx, strict=True):
            assert not c.isnan().any(), "the graph did not commit the draft context"
            torch.testing.assert_close(c, e, rtol=tol, atol=tol)
        if dtype == "float32":
            assert torch.equal(verdict, e_verdict)
        release(runner, reqs)


def test_poisoned_accumulator_between_steps_changes_nothing(tmp_path, device, dtype):
    engine = _streamed(tmp_path, device, dtype, "tiny-k3", mxfp8=False)
    worker = engine.worker
    acc = worker.target_runner.aux_storage.buffer
    worker.on_aux_consumed = lambda: acc.fill_(float("nan"))
    prompts = [engine.tokenizer.encode(p) for p in PROMPTS[1:3]]
    reqs = _run_steps(worker, prompts)
    assert acc.isnan().all(), "the hook did not run"
    tol = 1e-4 if dtype == "float32" else 5e-2
    for r in reqs:
        assert _draft_context_error(worker, r) < tol
        assert all(t < engine.model_config.hf_config.vocab_size for t in r.output_ids)


if __name__ == "__main__":
    sys.exit(pytest.main([__file__, "-q"]))
