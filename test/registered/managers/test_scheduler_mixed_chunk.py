"""Mixed steps on CPU (`--enable-mixed-chunk`): arrivals that fit ride in the running batch's
decode (target-only) or verify (DFlash) forward. Every output, finish reason and slot equals
the schedule that prefills in a step of its own, greedy and seeded sampling alike, with and
without the overlap scheduler, through the mixed graphs (eager replay) and eagerly; and a
replayed mixed graph gives the eager forward's logits at every captured layout."""

import sys

import pytest
import torch

from sglang_aux.srt.entrypoints.engine import Engine
from sglang_aux.srt.forward_state.forward_batch_info import ForwardMode
from sglang_aux.srt.managers.schedule_batch import mixed_inputs, reserve_kv
from sglang_aux.srt.mem_cache.memory_pool import PADDING_REQ_ROW, PADDING_SLOT
from sglang_aux.srt.model_executor.runner.forward_parts import ForwardParts
from sglang_aux.srt.model_executor.runner.step_prologue import StepPrologue
from sglang_aux.srt.server_args import ServerArgs
from sglang_aux.test.ci.ci_register import register_cpu_ci
from sglang_aux.test.launch_ops import launch_ops
from sglang_aux.test.runtime_utils import (
    assert_kv_all_back,
    assert_same_outputs,
    make_runner,
    new_requests,
    prefill_random,
    publish_rows,
    release,
    tiny_checkpoint,
)

register_cpu_ci(est_time=60, suite="default")

PROLOGUE = StepPrologue(fill_token_id=5)
# A graph's GEMMs run at its padded shape: fp32 rounding differs from eager's, ~1e-6 relative.
CLOSE = dict(rtol=1e-5, atol=1e-4)

# more prompts than running rows: the later ones arrive while earlier ones decode
PROMPTS = ["Hi", "The quick brown fox jumps over", "12 + 30 =", "Natalia sold clips to 48 of",
           "x", "What is the capital of France?", "Once upon a time", "1, 2, 3,",
           "A long prompt that is longer than what one mixed forward takes, so it is "
           "prefilled in a step of its own while the others keep going."]
COMMON = dict(device="cpu", dtype="float32", max_total_tokens=4096, max_running_requests=3,
              cuda_graph_bs_decode=[1, 2, 3], cuda_graph_tokens_prefill=[16, 32, 64],
              cuda_graph_max_bs_prefill=2)


@pytest.fixture(scope="module")
def ckpts(tmp_path_factory):
    root = tmp_path_factory.mktemp("ckpt")
    return {p: tiny_checkpoint(p, root) for p in ("tiny-llama", "tiny-llama-dflash")}


def _engine(ckpts, kind: str, mixed: bool, overlap: bool, graphs: bool = True) -> Engine:
    spec = {} if kind == "target" else dict(
        speculative_algorithm="DFLASH", speculative_draft_model_path=ckpts["tiny-llama-dflash"])
    return Engine(model_path=ckpts["tiny-llama"], enable_mixed_chunk=mixed,
                  mixed_chunk_max_prefill_tokens=16, disable_overlap_schedule=not overlap,
                  disable_decode_cuda_graph=not graphs, **spec, **COMMON)


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
def test_mixed_steps_equal_prefill_apart(ckpts, kind, overlap):
    apart = _engine(ckpts, kind, mixed=False, overlap=overlap)
    mixed = _engine(ckpts, kind, mixed=True, overlap=overlap)
    assert apart.scheduler.mixed_limits is None
    assert mixed.worker.model_runner.graph_runners[ForwardMode.MIXED].graphs
    for _ in range(2):  # the second round reuses rows and slots, and hits the prefix cache
        want = apart.generate(PROMPTS, _params())
        got = mixed.generate(PROMPTS, _params())
        assert_same_outputs(want, got)
    stats = mixed.scheduler.stats
    assert stats["mixed_steps"] > 0 and stats["mixed_requests"] >= stats["mixed_steps"]
    assert stats["prefill_steps"] > 0  # the long prompt, and arrivals to an idle batch
    assert apart.scheduler.stats["mixed_steps"] == 0
    assert_kv_all_back(mixed)


@pytest.mark.parametrize("kind", ["target", "dflash"])
def test_eager_mixed_steps_equal_prefill_apart(ckpts, kind):
    apart = _engine(ckpts, kind, mixed=False, overlap=False, graphs=False)
    mixed = _engine(ckpts, kind, mixed=True, overlap=False, graphs=False)
    assert mixed.worker.model_runner.graph_runners.get(ForwardMode.MIXED) is None
    assert_same_outputs(apart.generate(PROMPTS, _params()), mixed.generate(PROMPTS, _params()))
    assert mixed.scheduler.stats["mixed_steps"] > 0
    assert_kv_all_back(mixed)


def test_mixed_graph_token_counts_from_the_flag(ckpts):
    """`--cuda-graph-tokens-mixed`: the mixed graphs are captured at those arrival token
    counts, the largest bounds what a mixed forward takes (a longer arrival prefills in a
    step of its own), and outputs still equal prefills apart."""
    apart = _engine(ckpts, "dflash", mixed=False, overlap=False)
    engine = Engine(model_path=ckpts["tiny-llama"], enable_mixed_chunk=True,
                    mixed_chunk_max_prefill_tokens=16, cuda_graph_tokens_mixed=[12, 6],
                    disable_overlap_schedule=True, speculative_algorithm="DFLASH",
                    speculative_draft_model_path=ckpts["tiny-llama-dflash"], **COMMON)
    runner = engine.worker.model_runner
    mixed = runner.graph_runners[ForwardMode.MIXED]
    assert {x.arrival_tokens for x in mixed.layouts} == {6, 12}
    assert runner.mixed_limits()[2] == 12 == engine.scheduler.mixed_limits[2]
    assert_same_outputs(apart.generate(PROMPTS, _params()), engine.generate(PROMPTS, _params()))
    stats = engine.scheduler.stats
    assert stats["mixed_steps"] > 0 and stats["prefill_steps"] > 0
    assert_kv_all_back(engine)


@pytest.mark.parametrize("tokens", [[], [0, 8], [8, 17]])
def test_mixed_graph_token_counts_out_of_range_are_refused(tokens):
    with pytest.raises(ValueError, match="--cuda-graph-tokens-mixed needs token counts in"):
        ServerArgs(model_path="x", mixed_chunk_max_prefill_tokens=16,
                   cuda_graph_tokens_mixed=tokens)


@pytest.fixture(scope="module")
def runner_pair(ckpts):
    """width -> (a runner with mixed graphs, one without), built once per width."""
    args = dict(max_running_requests=6, max_total_tokens=4096, context_length=256,
                cuda_graph_bs_decode=[1, 2, 4], enable_mixed_chunk=True,
                mixed_chunk_max_prefill_tokens=64, cuda_graph_max_bs_prefill=2)
    pairs = {}

    def get(width: int):
        if width not in pairs:
            runners = []
            for graphs in (True, False):
                runner = make_runner(ckpts["tiny-llama"], disable_decode_cuda_graph=not graphs,
                                     **args)
                runner.init_forwards(ForwardParts(ForwardMode.DECODE, width, PROLOGUE),
                                     ForwardParts(ForwardMode.MIXED, width, PROLOGUE))
                runners.append(runner)
            pairs[width] = tuple(runners)
        return pairs[width]

    return get


def _live_batch(runner, width: int, step_bs: int, arrival_lens: list[int], seed: int):
    """`step_bs` running requests (their next step's slots reserved) and arrivals (their
    prompts' slots reserved, as the scheduler admits them)."""
    running = prefill_random(runner, [7 + 3 * i for i in range(step_bs)], seed)
    publish_rows(runner, running)
    for r in running:
        reserve_kv(runner, r, r.kv_len + width)
    arrivals = new_requests(runner, arrival_lens, seed + 100)
    for r in arrivals:
        reserve_kv(runner, r, len(r.origin_input_ids))
    return running, arrivals


# every captured layout exactly, then padded step requests, arrivals and tokens
PADDED_CASES = [(3, [5, 9]), (1, [40])]


@pytest.mark.parametrize("width", [1, 3])
def test_mixed_graph_replay_equals_eager_at_every_layout(runner_pair, width):
    """Each captured (step requests, arrival tokens) graph, and padded layouts, against the
    same batch run eagerly: the live logits rows and every K/V written agree."""
    graphs, eager = runners = runner_pair(width)
    g = graphs.graph_runners[ForwardMode.MIXED]
    assert {(x.step_bs, x.arrival_tokens, x.arrivals) for x in g.layouts} == {
        (bs, n, 2) for bs in (1, 2, 4) for n in (32, 64)}
    assert eager.graph_runners.get(ForwardMode.MIXED) is None
    cases = [(x.step_bs, [x.arrival_tokens]) for x in g.layouts] + PADDED_CASES
    for seed, (step_bs, arrival_lens) in enumerate(cases):
        out = []
        for runner in runners:
            running, arrivals = _live_batch(runner, width, step_bs, arrival_lens, seed)
            fb = runner.prepare(mixed_inputs(runner, running, arrivals, width))
            assert (runner is graphs) == (fb.prepared_graph is not None)
            live = step_bs * width + len(arrivals)
            logits = runner.forward(fb).next_token_logits[:live].clone()
            out.append((logits, _kv(runner, running + arrivals)))
            release(runner, running + arrivals)
        (la, kva), (lb, kvb) = out
        assert la.shape == (step_bs * width + len(arrival_lens),
                            graphs.model_config.hf_config.vocab_size)
        torch.testing.assert_close(la, lb, **CLOSE)
        for x, y in zip(kva, kvb, strict=True):
            torch.testing.assert_close(x, y, **CLOSE)


@pytest.mark.parametrize("width", [1, 3])
def test_in_graph_prologue_equals_eager_prologue(runner_pair, width):
    """After a replay, the graph's static batch holds what the eager path derives for the
    same live batch (step ids, positions, slots, lengths and prefix lengths; arrival slots),
    and its padding is inert, at an exact and at padded layouts."""
    graphs, eager = runner_pair(width)
    for seed, (step_bs, arrival_lens) in enumerate([(2, [32]), *PADDED_CASES]):
        got = []
        for runner in (graphs, eager):
            running, arrivals = _live_batch(runner, width, step_bs, arrival_lens, seed)
            fb = runner.prepare(mixed_inputs(runner, running, arrivals, width))
            runner.forward(fb)  # the graph's prologue fills its views at replay
            got.append(_live_fields(fb, step_bs, len(arrivals), sum(arrival_lens)))
            release(runner, running + arrivals)
        (a, pad), (b, _) = got
        for name in a:
            assert torch.equal(a[name], b[name]), name
        assert pad["req_pool_indices"].eq(PADDING_REQ_ROW).all()
        assert pad["out_cache_loc"].eq(PADDING_SLOT).all()
    assert graphs.graph_runners[ForwardMode.MIXED].static  # the graphs ran, not the eager path


def _live_fields(fb, bs: int, n: int, tokens: int):
    """`fb`'s live values, whatever its padding (arrival rows relative to the arrivals'
    first token), and its padding (step requests, then arrivals)."""
    s, w = fb.mixed_step_bs, fb.mixed_step_width
    t = s * w
    live, pad = {}, {}
    for name in ("input_ids", "positions", "out_cache_loc"):
        x = getattr(fb, name)
        live[name] = torch.cat([x[: bs * w], x[t : t + tokens]])
        pad[name] = torch.cat([x[bs * w : t], x[t + tokens :]])
    for name in ("req_pool_indices", "seq_lens", "extend_prefix_lens", "extend_seq_lens"):
        x = getattr(fb, name)
        live[name] = torch.cat([x[:bs], x[s : s + n]])
        pad[name] = torch.cat([x[bs:s], x[s + n :]])
    live["extend_start_loc"] = fb.extend_start_loc[s : s + n] - t
    rows = fb.logits_rows[: bs * w + n]
    live["logits_rows"] = torch.cat([rows[: bs * w], rows[bs * w :] - t])
    return live, pad


def test_a_graph_mixed_launch_is_one_copy(runner_pair):
    """Outside its replay, a graph's mixed launch (padded) does one thing on the device: the
    host values' copy; the eager path derives the step and slots itself."""
    graphs, eager = runner_pair(3)
    for runner in (graphs, eager):
        running, arrivals = _live_batch(runner, 3, 3, [5, 9], seed=7)
        with launch_ops(runner) as ops:
            fb = runner.prepare(mixed_inputs(runner, running, arrivals, 3))
            if runner is graphs:
                runner.forward(fb)
        if runner is graphs:
            assert ops == ["copy_"]
        else:
            assert ops[0] == "copy_" and "index" in ops and "sub" in ops, ops
        release(runner, running + arrivals)


def _kv(runner, reqs):
    """Every K/V the requests hold, their step tokens included."""
    pool = runner.req_to_token_pool.req_to_token
    slots = torch.cat([pool[r.req_pool_idx, : r.kv_reserved] for r in reqs])
    kv = runner.token_to_kv_pool
    return [torch.stack([kv.k_buffer[i][slots], kv.v_buffer[i][slots]])
            for i in range(len(kv.k_buffer))]


def test_bad_mixed_input_is_refused(ckpts):
    with pytest.raises(ValueError, match="must be >= 1"):
        ServerArgs(model_path="x", mixed_chunk_max_prefill_tokens=0)
    engine = _engine(ckpts, "target", mixed=True, overlap=False)
    with pytest.raises(ValueError, match="needs step requests and arrivals"):
        mixed_inputs(engine.worker.model_runner, [], [], 1)


if __name__ == "__main__":
    sys.exit(pytest.main([__file__, "-q"]))
