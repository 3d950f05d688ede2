"""Admission (`managers/scheduler/admission.py`): how arrivals are grouped into prefill steps: with
prefill graphs, one step takes at most what one graph holds (the rest wait a step instead of
running eagerly); the prefill delayer holds arrivals (at most the set number of steps) until a
graph's worth can share one step. Outputs equal the ungrouped schedule's."""

import sys

import pytest

from sglang_aux.srt.entrypoints.engine import Engine
from sglang_aux.srt.forward_state.forward_batch_info import ForwardMode
from sglang_aux.srt.managers.scheduler.prefill_delayer import PrefillDelayer
from sglang_aux.test.ci.ci_register import register_cpu_ci
from sglang_aux.test.runtime_utils import assert_kv_all_back, tiny_checkpoint

register_cpu_ci(est_time=90, suite="default")

PROMPTS = ["Hi", "The quick brown fox jumps over", "12 + 30 =", "Natalia sold clips to 48 of",
           "x", "What is the capital of France?", "abc", "Once upon a time"]
# prefill steps of their own: mixed steps (the default) would carry these arrivals instead
APART = dict(enable_mixed_chunk=False)


def test_delayer_rules():
    d = PrefillDelayer(batch=4, max_delay_passes=3)
    assert d.allow(num_waiting=1, num_running=0, max_running=8)  # nothing to decode meanwhile
    assert not d.allow(1, 5, 8) and not d.allow(2, 5, 8) and d.delayed == 2
    assert d.allow(3, 5, 8)  # three free rows: three waiting fill them
    assert d.delayed == 0
    assert [d.allow(1, 2, 8) for _ in range(5)] == [False, False, False, True, False]
    assert d.allow(4, 2, 8)
    with pytest.raises(ValueError, match="batch >= 1"):
        PrefillDelayer(batch=0, max_delay_passes=3)


@pytest.fixture(scope="module")
def ckpts(tmp_path_factory):
    root = tmp_path_factory.mktemp("ckpt")
    return {p: tiny_checkpoint(p, root) for p in ("tiny-llama", "tiny-llama-dflash")}


def _arrivals(engine: Engine, max_delay_passes: int) -> tuple[list[list[int]], list[int]]:
    """Two requests start; the others arrive one per step. Returns each request's output ids
    and, per arrival, how many steps it waited before its prefill launched."""
    sched = engine.scheduler
    params = [{"max_new_tokens": 12 + 3 * i, "ignore_eos": True} | (
        {"temperature": 0} if i % 2 else {"temperature": 0.8, "top_k": 20, "seed": i})
        for i in range(len(PROMPTS))]
    reqs = [engine.make_request(text=t, sampling_params=p)
            for t, p in zip(PROMPTS, params, strict=True)]
    for r in reqs[:2]:
        sched.add_request(r)
    waited, arrived = [], {}
    prefill = engine.worker.prefill

    def launch(batch):
        waited.extend(steps - arrived[r.rid] for r in batch if r.rid in arrived)
        return prefill(batch)

    engine.worker.prefill = launch
    steps, later = 0, list(reqs[2:])
    while sched.has_work() or later:
        if later and steps >= 1:
            r = later.pop(0)
            arrived[r.rid] = steps
            sched.add_request(r)
        sched.step()
        steps += 1
    engine.worker.prefill = prefill
    assert all(w <= max_delay_passes for w in waited), waited
    return [r.output_ids for r in reqs], waited


@pytest.mark.parametrize("kind", ["target", "dflash"])
def test_delayed_arrivals_share_prefills(ckpts, kind):
    spec = {} if kind == "target" else dict(
        speculative_algorithm="DFLASH", speculative_draft_model_path=ckpts["tiny-llama-dflash"])
    common = dict(model_path=ckpts["tiny-llama"], device="cpu", dtype="float32", **APART,
                  max_total_tokens=4096, max_running_requests=8, cuda_graph_bs_decode=[1, 2, 4, 8],
                  **spec)
    plain = Engine(**common)
    delayed = Engine(**common, enable_prefill_delayer=True, prefill_delayer_max_delay_passes=5)
    want, _ = _arrivals(plain, 0)
    got, waited = _arrivals(delayed, 5)
    assert got == want
    a, b = plain.scheduler.stats, delayed.scheduler.stats
    assert a["prefill_requests"] == b["prefill_requests"] == len(PROMPTS)
    # six arrivals one step apart: four share one prefill, the last two wait out the delay
    assert b["prefill_steps"] < a["prefill_steps"], (a, b)
    assert b["prefill_delayed_passes"] > 0 and max(waited) > 0
    assert_kv_all_back(delayed)


@pytest.mark.parametrize("kind", ["target", "dflash"])
def test_a_prefill_step_takes_what_one_graph_holds(ckpts, kind):
    """Prompts of 8-35 tokens, graphs of <= 2 requests and <= 48 tokens: each prefill step
    replays a graph (none runs eagerly), and the outputs equal an engine without graphs."""
    spec = {} if kind == "target" else dict(
        speculative_algorithm="DFLASH", speculative_draft_model_path=ckpts["tiny-llama-dflash"])
    common = dict(model_path=ckpts["tiny-llama"], device="cpu", dtype="float32", **APART,
                  max_total_tokens=4096, max_running_requests=8, cuda_graph_bs_decode=[1, 2, 4, 8],
                  disable_radix_cache=True, **spec)
    graphs = Engine(**common, cuda_graph_tokens_prefill=[16, 48], cuda_graph_max_bs_prefill=2)
    eager = Engine(**common)
    assert graphs.worker.model_runner.prefill_graph_limits() == (2, 48)
    assert eager.worker.model_runner.prefill_graph_limits() is None
    runner = graphs.worker.model_runner.graph_runners.get(ForwardMode.EXTEND)
    batches, replay = [], runner.replay
    runner.replay = lambda fb: batches.append(fb.extend_seq_lens_cpu) or replay(fb)
    prompts = [list(range(3, 3 + n)) for n in (8, 30, 35, 9, 10, 12, 20)]
    params = {"temperature": 0, "max_new_tokens": 6, "ignore_eos": True}
    got = [o["output_ids"] for o in graphs.generate(input_ids=prompts, sampling_params=params)]
    want = [o["output_ids"] for o in eager.generate(input_ids=prompts, sampling_params=params)]
    assert got == want
    # in order, two at most and 48 tokens at most per step: [8, 30], [35, 9], [10, 12], [20]
    assert batches == [[8, 30], [35, 9], [10, 12], [20]], batches
    assert graphs.scheduler.stats["prefill_steps"] == 4
    assert eager.scheduler.stats["prefill_steps"] == 1
    assert_kv_all_back(graphs)


def test_graph_sized_steps_after_a_cached_prefix(ckpts):
    """With the prefix cache, the token budget counts uncached tokens: three arrivals after a
    cached 40-token prefix add 30 each, so a 48-token graph takes one at a time; a request held
    back releases the cached prefix it had locked (nothing leaks) and prefills next step."""
    common = dict(model_path=ckpts["tiny-llama"], device="cpu", dtype="float32", **APART,
                  max_total_tokens=4096, max_running_requests=8, cuda_graph_bs_decode=[1, 2, 4, 8])
    graphs = Engine(**common, cuda_graph_tokens_prefill=[16, 48], cuda_graph_max_bs_prefill=2)
    plain = Engine(**common, disable_radix_cache=True)
    prefix = list(range(3, 43))
    params = {"temperature": 0, "max_new_tokens": 5, "ignore_eos": True}
    graphs.generate(input_ids=prefix, sampling_params=params)  # the prefix enters the cache
    runner = graphs.worker.model_runner.graph_runners.get(ForwardMode.EXTEND)
    batches, replay = [], runner.replay
    runner.replay = lambda fb: batches.append(fb.extend_seq_lens_cpu) or replay(fb)
    prompts = [prefix + [50 + i] * 30 for i in range(3)]
    got = graphs.generate(input_ids=prompts, sampling_params=params)
    want = plain.generate(input_ids=prompts, sampling_params=params)
    assert [o["output_ids"] for o in got] == [o["output_ids"] for o in want]
    assert [o["meta_info"]["cached_tokens"] for o in got] == [40, 40, 40]
    assert batches == [[30], [30], [30]], batches
    assert_kv_all_back(graphs)


if __name__ == "__main__":
    sys.exit(pytest.main([__file__, "-q"]))
