"""Prefill (EXTEND) graphs on the CPU eager-replay backend: replay equals eager at every
captured token count and at padded ones, padding writes only the padding slot, DFlash commits
the prompt's draft context inside the prefill forward, and engines with and without prefill
graphs generate the same tokens."""

import sys

import pytest
import torch

from sglang_aux.srt.entrypoints.engine import Engine
from sglang_aux.srt.forward_state.forward_batch_info import ForwardMode
from sglang_aux.srt.managers.schedule_batch import extend_inputs
from sglang_aux.srt.mem_cache.memory_pool import PADDING_SLOT
from sglang_aux.srt.model_executor.runner.forward_parts import ForwardParts
from sglang_aux.srt.model_executor.runner_utils.capture_sizes import prefill_graph_plan
from sglang_aux.srt.server_args import ServerArgs
from sglang_aux.test.ci.ci_register import register_cpu_ci
from sglang_aux.test.runtime_utils import make_runner, new_requests, release, tiny_checkpoint

register_cpu_ci(est_time=90, suite="default")

TOKENS = [16, 32, 64]
GRAPHS = dict(cuda_graph_tokens_prefill=TOKENS, cuda_graph_max_bs_prefill=2)
COMMON = dict(max_running_requests=4, max_total_tokens=4096, context_length=256)
# (prompt lengths per batch): exact counts, then padded tokens and a padded request
BATCHES = [[16], [20, 12], [64], [10], [40, 7], [5]]
# A graph's GEMMs run at its padded shape: fp32 rounding differs from eager's, ~1e-6 relative.
CLOSE = dict(rtol=1e-5, atol=1e-4)


@pytest.fixture(scope="module")
def ckpts(tmp_path_factory):
    root = tmp_path_factory.mktemp("ckpt")
    return {p: tiny_checkpoint(p, root) for p in ("tiny-llama", "tiny-qwen3", "tiny-k3",
                                                   "tiny-llama-dflash")}


def _prefills(runner):
    runner.init_forwards(ForwardParts(ForwardMode.EXTEND))
    return runner.graph_runners.get(ForwardMode.EXTEND)


def _batch(runner, reqs):
    return runner.prepare(extend_inputs(runner, reqs))


def _kv(runner, reqs):
    pool = runner.req_to_token_pool.req_to_token
    slots = torch.cat([pool[r.req_pool_idx, : r.kv_len] for r in reqs])
    kv = runner.token_to_kv_pool
    return [torch.stack([kv.k_buffer[i][slots], kv.v_buffer[i][slots]])
            for i in range(len(kv.k_buffer))]


def test_plan_defaults_and_overrides():
    cpu = ServerArgs(model_path="x", device="cpu")
    assert prefill_graph_plan(cpu, on_cuda=False, hidden_size=576) == ([], 0)
    tokens, bs = prefill_graph_plan(cpu, on_cuda=True, hidden_size=576)
    assert tokens[0] == 16 and tokens[-1] == 2048 and bs == 4
    assert max(b / a for a, b in zip(tokens, tokens[1:], strict=False)) <= 2
    # a wide model's prefill is GPU-bound: no graphs unless asked for
    assert prefill_graph_plan(cpu, on_cuda=True, hidden_size=7168) == ([], 0)
    few = ServerArgs(model_path="x", max_running_requests=2, cuda_graph_max_tokens_prefill=300)
    assert prefill_graph_plan(few, True, 7168) == ([16, 32, 64, 128, 192, 256, 300], 2)
    assert prefill_graph_plan(ServerArgs(model_path="x", **GRAPHS), False, 64) == (TOKENS, 2)
    off = ServerArgs(model_path="x", disable_prefill_cuda_graph=True, **GRAPHS)
    assert prefill_graph_plan(off, True, 64) == ([], 0)
    with pytest.raises(ValueError, match="needs at least one size"):
        ServerArgs(model_path="x", cuda_graph_tokens_prefill=[])


@pytest.mark.parametrize("model", ["tiny-llama", "tiny-qwen3", "tiny-k3"])
def test_replay_equals_eager_at_every_size_and_padded(ckpts, model):
    graphs = make_runner(ckpts[model], **GRAPHS, **COMMON)
    g = _prefills(graphs)
    eager = make_runner(ckpts[model], **COMMON)
    assert [x.arrival_tokens for x in g.layouts] == TOKENS
    assert _prefills(eager) is None
    for seed, lens in enumerate(BATCHES):
        a, b = new_requests(graphs, lens, seed), new_requests(eager, lens, seed)
        fa, fb = _batch(graphs, a), _batch(eager, b)
        assert fa.prepared_graph is not None and fb.prepared_graph is None
        la, lb = graphs.forward(fa).next_token_logits, eager.forward(fb).next_token_logits
        assert la.shape == lb.shape == (len(lens), graphs.model_config.hf_config.vocab_size)
        torch.testing.assert_close(la, lb, **CLOSE)
        for x, y in zip(_kv(graphs, a), _kv(eager, b), strict=True):
            torch.testing.assert_close(x, y, **CLOSE)
        release(graphs, a)
        release(eager, b)


def test_prefill_after_a_cached_prefix(ckpts):
    graphs = make_runner(ckpts["tiny-llama"], **GRAPHS, **COMMON)
    _prefills(graphs)
    eager = make_runner(ckpts["tiny-llama"], **COMMON)
    a, b = new_requests(graphs, [30], 7), new_requests(eager, [30], 7)
    graphs.forward(_batch(graphs, a))
    eager.forward(_batch(eager, b))
    for r in (*a, *b):
        r.output_ids += [3, 1, 4, 1, 5]
    fa, fb = _batch(graphs, a), _batch(eager, b)
    assert fa.extend_prefix_lens_cpu == [30] and fa.num_tokens == 5
    torch.testing.assert_close(graphs.forward(fa).next_token_logits,
                               eager.forward(fb).next_token_logits, **CLOSE)


def test_padding_writes_only_the_padding_slot(ckpts):
    runner = make_runner(ckpts["tiny-llama"], **GRAPHS, **COMMON)
    _prefills(runner)
    reqs = new_requests(runner, [9, 4], 1)  # 13 tokens in the 16-token graph, 2 requests
    kv = runner.token_to_kv_pool
    before = [t.clone() for t in kv.k_buffer]
    runner.forward(_batch(runner, reqs))
    pool = runner.req_to_token_pool.req_to_token
    live = {int(s) for r in reqs for s in pool[r.req_pool_idx, : r.kv_len]}
    for old, new in zip(before, kv.k_buffer, strict=True):
        changed = set((old != new).any(-1).any(-1).nonzero().flatten().tolist())
        assert changed - live <= {PADDING_SLOT}, changed - live
        assert live <= changed


def test_what_runs_eagerly(ckpts):
    runner = make_runner(ckpts["tiny-llama"], **GRAPHS, **COMMON)
    _prefills(runner)
    for lens, fits in (([65], False), ([3, 3, 3], False), ([3, 3], True)):
        reqs = new_requests(runner, lens, 0)
        assert (_batch(runner, reqs).prepared_graph is not None) == fits, lens
        release(runner, reqs)


def _engine(ckpts, dflash=True, **kw):
    spec = dict(speculative_algorithm="DFLASH",
                speculative_draft_model_path=ckpts["tiny-llama-dflash"]) if dflash else {}
    return Engine(model_path=ckpts["tiny-llama"], device="cpu", dtype="float32",
                  cuda_graph_bs_decode=[1, 2, 4], chunked_prefill_size=-1, **spec, **COMMON,
                  **kw)  # the storage's rows: the graphs' (chunked prefill tests: a chunk's)


PROMPTS = [list(range(3, 3 + n)) for n in (5, 17, 40, 90)]  # 90 > 64: an eager prefill
GREEDY = {"temperature": 0, "max_new_tokens": 12, "ignore_eos": True}


@pytest.mark.parametrize("projection", ["packed", "streamed"])
def test_dflash_engines_with_prefill_graphs_generate_the_same(ckpts, projection):
    # no prefix cache: the singles below repeat the batch's prompts and must prefill them
    # whole (test_radix_cache_engine.py runs prefill graphs after cached prefixes)
    graphs = _engine(ckpts, speculative_dflash_aux_projection=projection, **GRAPHS,
                     disable_radix_cache=True)
    runner = graphs.worker.model_runner
    prefills = runner.graph_runners[ForwardMode.EXTEND]
    # the prefill graphs write rows of the verify graphs' one aux storage (64 rows: the
    # largest prefill graph, more than 4 running requests' 4-token verify steps)
    storage = runner.aux_storage
    assert storage.buffer.shape[0] == TOKENS[-1] and storage.streamed == (projection != "packed")
    for fb in prefills.static:
        rows = fb.aux_hidden_states_buffer if projection == "packed" \
            else fb.aux_projection.acc
        assert rows.data_ptr() == storage.buffer.data_ptr()
    replays = []
    replay = prefills.backend.replay
    prefills.backend.replay = lambda h: (replays.append(1), replay(h))
    eager = _engine(ckpts, speculative_dflash_aux_projection=projection,
                    disable_prefill_cuda_graph=True)
    target = _engine(ckpts, dflash=False, **GRAPHS)
    outs = [e.generate(input_ids=PROMPTS, sampling_params=GREEDY) for e in (graphs, eager, target)]
    # A prefill step takes what one graph holds (2 requests, 64 tokens): [5, 17] and [40]
    # replay, the 90-token prompt (past every graph) prefills eagerly alone; then one at a time.
    assert replays == [1, 1]
    singles = [graphs.generate(input_ids=p, sampling_params=GREEDY) for p in PROMPTS]
    assert len(replays) == 5
    for x, y, z, s in zip(*outs, singles, strict=True):
        assert x["output_ids"] == y["output_ids"] == z["output_ids"] == s["output_ids"]
        assert x["meta_info"]["spec_accept_length"] == y["meta_info"]["spec_accept_length"]


if __name__ == "__main__":
    sys.exit(pytest.main([__file__, "-q"]))
