"""The decode step loop on CPU: whole reservations at admission, one readback per step, slots
past kv_len never read, everything given back at finish and abort, seeded sampling that does
not depend on the batch, and `--dtype auto` on CPU."""

import json
import sys
from pathlib import Path

import pytest
import torch

from sglang_aux.srt.entrypoints.engine import Engine
from sglang_aux.test.ci.ci_register import register_cpu_ci
from sglang_aux.test.runtime_utils import assert_kv_all_back, tiny_checkpoint

register_cpu_ci(est_time=120, suite="default")

PROMPTS = ["Hi", "The quick brown fox jumps over", "12 + 30 =", "Natalia sold clips to 48 of"]
GREEDY = {"temperature": 0, "max_new_tokens": 12, "ignore_eos": True}
COMMON = dict(device="cpu", max_total_tokens=4096, cuda_graph_bs_decode=[1, 2, 4],
              max_running_requests=4)
KINDS = ["target", "dflash"]


@pytest.fixture(scope="module")
def ckpts(tmp_path_factory):
    root = tmp_path_factory.mktemp("ckpt")
    return {p: tiny_checkpoint(p, root) for p in ("tiny-k3", "tiny-k3-dflash")}


def _engine(ckpts, kind, **kw):
    spec = {} if kind == "target" else dict(
        speculative_algorithm="DFLASH", speculative_draft_model_path=ckpts["tiny-k3-dflash"])
    return Engine(model_path=ckpts["tiny-k3"], **spec, **{**COMMON, **kw})


@pytest.mark.parametrize("kind", KINDS)
def test_one_allocation_per_request_and_one_readback_per_step(ckpts, kind):
    engine = _engine(ckpts, kind)
    alloc = engine.worker.model_runner.token_to_kv_pool_allocator
    calls = []
    alloc_fn = alloc.alloc
    alloc.alloc = lambda n: calls.append(n) or alloc_fn(n)
    readback = engine.worker.readback
    copies = []
    step = engine.scheduler.step

    def counted_step():
        before = readback.num_copies
        step()
        copies.append(readback.num_copies - before)

    engine.scheduler.step = counted_step
    engine.generate(PROMPTS, GREEDY)
    assert len(calls) == len(PROMPTS), f"allocations {calls}: one per admitted request"
    assert copies and all(c == 1 for c in copies), copies
    assert_kv_all_back(engine)


@pytest.mark.parametrize("kind", KINDS)
def test_slots_past_kv_len_are_never_read(ckpts, kind):
    """Poison every reserved position past each request's kv_len after every decode step (in
    the target's and, for DFlash, the draft's KV): outputs do not move."""
    ref = _engine(ckpts, kind).generate(PROMPTS, GREEDY)
    engine = _engine(ckpts, kind)
    worker = engine.worker
    pools = [worker.model_runner.token_to_kv_pool]
    if kind == "dflash":
        pools.append(worker.draft_runner.token_to_kv_pool)
    req_to_token = worker.model_runner.req_to_token_pool.req_to_token
    decode = worker.decode
    poisoned = []

    def decode_then_poison(reqs):
        new = decode(reqs)
        new.tokens()  # the host's kv_len now counts the step
        for r in reqs:
            # the scheduler appends the new tokens next; the last of them is not in the KV yet
            slots = req_to_token[r.req_pool_idx, r.kv_len : r.kv_reserved].long()
            poisoned.append(slots.numel())
            for pool in pools:
                for buf in (*pool.k_buffer, *pool.v_buffer):
                    buf[slots] = 1e4  # finite: masked keys still multiply out to zero
        return new

    worker.decode = decode_then_poison
    outs = engine.generate(PROMPTS, GREEDY)
    assert sum(poisoned) > 0
    for a, b in zip(ref, outs, strict=True):
        assert a["output_ids"] == b["output_ids"]


@pytest.mark.parametrize("kind", KINDS)
def test_finish_and_abort_give_back_every_slot_and_row(ckpts, kind):
    engine = _engine(ckpts, kind, max_running_requests=3, cuda_graph_bs_decode=[1, 2, 3])
    sched = engine.scheduler
    lengths = [3, 17, 9, 25, 5, 11]
    reqs = [engine.make_request(text=PROMPTS[i % len(PROMPTS)], sampling_params={
        "max_new_tokens": n, "ignore_eos": True, "temperature": 0 if i % 2 else 0.8})
        for i, n in enumerate(lengths)]
    for r in reqs:
        sched.add_request(r)
    for _ in range(3):
        sched.step()
    running, waiting = sched.running[0], sched.waiting[-1]
    sched.abort(running)
    sched.abort(waiting)
    while sched.has_work():
        sched.step()
    assert running.finished_reason == {"type": "abort"}
    assert waiting.finished_reason == {"type": "abort"}
    for r, n in zip(reqs, lengths, strict=True):
        if r not in (running, waiting):
            assert len(r.output_ids) == n and r.finished_reason["type"] == "length"
    assert_kv_all_back(engine)


@pytest.mark.parametrize("kind", KINDS)
def test_seeded_sampling_does_not_depend_on_the_batch(ckpts, kind):
    engine = _engine(ckpts, kind)
    params = {"temperature": 0.9, "top_p": 0.9, "max_new_tokens": 10, "seed": 11,
              "ignore_eos": True}
    alone = engine.generate(PROMPTS[1], params)["output_ids"]
    others = [dict(params, seed=100 + i) for i in range(3)]
    batch = engine.generate(PROMPTS[:4], [others[0], params, others[1], others[2]])
    assert batch[1]["output_ids"] == alone
    assert len({tuple(o["output_ids"]) for o in batch}) > 1


def test_eager_dflash_steps_equal_graph_steps(ckpts):
    """--disable-decode-cuda-graph runs the same epilogues (commit, acceptance) eagerly."""
    graphs = _engine(ckpts, "dflash").generate(PROMPTS, GREEDY)
    eager = _engine(ckpts, "dflash", disable_decode_cuda_graph=True)
    assert eager.worker.target_runner.step_graphs is None
    for a, b in zip(graphs, eager.generate(PROMPTS, GREEDY), strict=True):
        assert a["output_ids"] == b["output_ids"]
        assert a["meta_info"]["spec_accept_length"] == b["meta_info"]["spec_accept_length"]


def test_dtype_auto_is_float32_on_cpu(tmp_path):
    path = tiny_checkpoint("tiny-llama", tmp_path)
    cfg = json.loads((Path(path) / "config.json").read_text())
    cfg["torch_dtype"] = "bfloat16"
    (Path(path) / "config.json").write_text(json.dumps(cfg))
    auto = Engine(model_path=path, device="cpu", max_total_tokens=512, cuda_graph_bs_decode=[1])
    assert auto.model_config.dtype == torch.float32
    explicit = Engine(model_path=path, device="cpu", dtype="bfloat16", max_total_tokens=512,
                      cuda_graph_bs_decode=[1])
    assert explicit.model_config.dtype == torch.bfloat16


if __name__ == "__main__":
    sys.exit(pytest.main([__file__, "-q"]))
