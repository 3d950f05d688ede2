"""The prefix cache through the Engine on tiny models (fp32 greedy): shared-prefix requests hit
it and generate what the cache-off run does, target-only and DFlash (whose cached positions
carry the draft context too, checked against a recomputation); cached K/V is never written
again; eviction under a small pool; aborts; and nothing leaks (every slot back after flush)."""

import argparse
import sys

import pytest
import torch

from sglang_aux.srt.entrypoints.engine import Engine
from sglang_aux.srt.forward_state.forward_batch_info import ForwardMode
from sglang_aux.srt.server_args import ServerArgs
from sglang_aux.test.ci.ci_register import register_cpu_ci
from sglang_aux.test.runtime_utils import (
    assert_kv_all_back,
    cached_kv_error,
    committed_tokens,
    tiny_checkpoint,
)

register_cpu_ci(est_time=120, suite="default")

SHARED = ("Question: Natalia sold clips to 48 of her friends in April, and then she sold half "
          "as many clips in May. How many clips did Natalia sell altogether?\nAnswer: 72\n\n")
QUESTIONS = ["Question: 12 + 30 =", "Question: what is 7 times 8?", "Q: hi",
             "Question: Weng earns $12 an hour.", "Question: 12 + 31 ="]
PROMPTS = [SHARED + q for q in QUESTIONS]
GREEDY = {"temperature": 0, "max_new_tokens": 12, "ignore_eos": True}
COMMON = dict(device="cpu", max_total_tokens=4096, cuda_graph_bs_decode=[1, 2, 4],
              max_running_requests=4)
KINDS = ["target", "dflash", "dflash_prefill_graphs", "target_overlap", "dflash_overlap"]
CLOSE = 1e-4  # fp32: the same K/V computed in batches of other shapes


@pytest.fixture(scope="module")
def ckpts(tmp_path_factory):
    root = tmp_path_factory.mktemp("ckpt")
    return {p: tiny_checkpoint(p, root) for p in ("tiny-k3", "tiny-k3-dflash")}


def _engine(ckpts, kind, **kw):
    spec = {} if kind.startswith("target") else dict(
        speculative_algorithm="DFLASH", speculative_draft_model_path=ckpts["tiny-k3-dflash"])
    if kind == "dflash_prefill_graphs":  # hits prefill ~20 tokens, misses ~150
        spec.update(cuda_graph_tokens_prefill=[16, 32, 64, 256], cuda_graph_max_bs_prefill=2)
    if kind.endswith("_overlap"):  # a step still in flight when its requests finish
        spec.update(disable_overlap_schedule=False)
    return Engine(model_path=ckpts["tiny-k3"], **spec, **{**COMMON, **kw})


def _run(engine, prompts=PROMPTS) -> list[dict]:
    """The first prompt alone (it fills the cache), then the rest batched, then the first
    again and a follow-up turn extending the first prompt and its output."""
    first = engine.generate(prompts[0], GREEDY)
    rest = engine.generate(prompts[1:], GREEDY)
    again = engine.generate(prompts[0], GREEDY)
    ids = engine.tokenizer.encode(prompts[0]) + first["output_ids"]
    turn = engine.generate(input_ids=ids + engine.tokenizer.encode(" Next?"),
                           sampling_params=GREEDY)
    return [first, *rest, again, turn]


@pytest.fixture(scope="module")
def reference(ckpts):
    return _run(_engine(ckpts, "target", disable_radix_cache=True))


@pytest.mark.parametrize("kind", KINDS)
def test_shared_prefix_hits_and_outputs_equal_the_cache_off_run(ckpts, reference, kind):
    engine = _engine(ckpts, kind)
    finished, graph_prefixes = [], []
    engine.scheduler.on_update = lambda r: r.finished and finished.append(r)
    graphs = engine.worker.model_runner.graph_runners.get(ForwardMode.EXTEND)
    if graphs is not None:
        replay = graphs.replay
        graphs.replay = lambda b: graph_prefixes.extend(b.extend_prefix_lens_cpu) or replay(b)
    outs = _run(engine)
    assert (graphs is None) == (kind != "dflash_prefill_graphs")
    assert engine.scheduler.overlap == kind.endswith("_overlap")
    assert graphs is None or max(graph_prefixes) > 0, "no graph replayed after a cached prefix"
    assert [o["output_ids"] for o in outs] == [o["output_ids"] for o in reference]
    cached = [o["meta_info"]["cached_tokens"] for o in outs]
    shared = len(engine.tokenizer.encode(SHARED))
    assert cached[0] == 0 and all(c >= shared - 1 for c in cached[1:]), cached
    assert cached[-2] == outs[-2]["meta_info"]["prompt_tokens"] - 1  # all but the last token
    assert cached[-1] >= outs[0]["meta_info"]["prompt_tokens"] + 1  # the first turn's output
    assert engine.scheduler.admission.cache_hit_tokens == sum(cached)
    assert engine.scheduler.admission.admitted_prompt_tokens == sum(
        o["meta_info"]["prompt_tokens"] for o in outs)
    for req in finished:  # every cached position holds its token's final K/V
        assert cached_kv_error(engine, committed_tokens(req)) < CLOSE, req.rid
    assert_kv_all_back(engine)


def test_kv_check_catches_a_corrupted_draft_context(ckpts):
    """Control for the check above: one cached slot's draft context off, and it fails."""
    engine = _engine(ckpts, "dflash")
    ids = engine.tokenizer.encode(PROMPTS[0])
    engine.generate(PROMPTS[0], GREEDY)
    slot = engine.scheduler.tree_cache.match_prefix(ids).slots[5]
    engine.worker.draft_runner.token_to_kv_pool.k_buffer[0][slot] += 0.5
    assert not cached_kv_error(engine, ids) < CLOSE


def test_requests_never_write_cached_slots(ckpts):
    """The cache's K/V (target and draft) is bitwise unchanged by requests that read it."""
    engine = _engine(ckpts, "dflash")
    engine.generate(PROMPTS[0], GREEDY)
    slots = engine.scheduler.tree_cache.match_prefix(engine.tokenizer.encode(PROMPTS[0])).slots
    pools = [engine.worker.target_runner.token_to_kv_pool,
             engine.worker.draft_runner.token_to_kv_pool]
    before = [buf[slots].clone() for p in pools for buf in (*p.k_buffer, *p.v_buffer)]
    outs = engine.generate(PROMPTS, GREEDY)
    assert all(o["meta_info"]["cached_tokens"] > 0 for o in outs)
    after = [buf[slots] for p in pools for buf in (*p.k_buffer, *p.v_buffer)]
    assert all(torch.equal(a, b) for a, b in zip(before, after, strict=True))


@pytest.mark.parametrize("kind", ["target", "dflash"])
def test_eviction_under_a_small_pool(ckpts, kind):
    """Three prefixes cycled through a pool that holds about three requests: the cache evicts
    as it admits, still hits, and generates what the cache-off run does."""
    prefixes = [SHARED, SHARED.upper(), SHARED[::-1]]
    prompts = [prefixes[i % 3] + q for i, q in enumerate(QUESTIONS * 2)]
    ref = _engine(ckpts, kind, disable_radix_cache=True).generate(prompts, GREEDY)
    engine = _engine(ckpts, kind, max_total_tokens=600, max_running_requests=2,
                     cuda_graph_bs_decode=[1, 2])
    cache = engine.scheduler.tree_cache
    evicted, evict = [], cache.evict
    cache.evict = lambda n: evicted.append(evict(n)) or evicted[-1]
    outs = [engine.generate(p, GREEDY) for p in prompts[:3]] + engine.generate(prompts[3:], GREEDY)
    assert [o["output_ids"] for o in outs] == [o["output_ids"] for o in ref]
    assert sum(evicted) > 0, "the pool never ran short"
    assert any(o["meta_info"]["cached_tokens"] > 0 for o in outs[3:])
    assert_kv_all_back(engine)


@pytest.mark.parametrize("kind", ["dflash", "dflash_overlap"])
def test_abort_mid_request_leaks_nothing(ckpts, reference, kind):
    engine = _engine(ckpts, kind, max_running_requests=2, cuda_graph_bs_decode=[1, 2])
    sched = engine.scheduler
    engine.generate(PROMPTS[0], GREEDY)
    reqs = [engine.make_request(text=p, sampling_params=dict(GREEDY)) for p in PROMPTS[1:]]
    for r in reqs:
        sched.add_request(r)
    for _ in range(3):
        sched.step()
    running, waiting = sched.running[0], sched.waiting[-1]
    assert running.cached_tokens > 0 and running.output_ids
    sched.abort(running)
    sched.abort(waiting)
    assert running.last_node is None and running.req_pool_idx is None
    while sched.has_work():
        sched.step()
    for r, ref in zip(reqs, reference[1:], strict=False):
        if r not in (running, waiting):
            assert r.output_ids == ref["output_ids"]
    assert cached_kv_error(engine, committed_tokens(running)) < CLOSE  # what the abort cached
    assert_kv_all_back(engine)


def test_disable_radix_cache(ckpts):
    parser = argparse.ArgumentParser()
    ServerArgs.add_cli_args(parser)
    parse = lambda *argv: ServerArgs.from_cli_args(parser.parse_args(argv))
    assert not parse().disable_radix_cache and parse("--disable-radix-cache").disable_radix_cache
    engine = _engine(ckpts, "target", disable_radix_cache=True)
    assert engine.scheduler.tree_cache is None
    outs = [engine.generate(PROMPTS[0], GREEDY) for _ in range(2)]
    assert [o["meta_info"]["cached_tokens"] for o in outs] == [0, 0]
    alloc = engine.worker.model_runner.token_to_kv_pool_allocator
    assert alloc.available_size() == alloc.size  # nothing held without the cache, no flush


if __name__ == "__main__":
    sys.exit(pytest.main([__file__, "-q"]))
