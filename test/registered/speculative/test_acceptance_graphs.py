"""DFlash sampling inside the graphs on CPU (the eager-replay backend): sampled and mixed
batches give the eager path's tokens at every captured size and a padded one, greedy batches
never replay a sampling tail, each step reads back once, and seeded outputs depend neither on
the batch nor on graph versus eager."""

import sys

import pytest

from sglang_aux.srt.entrypoints.engine import Engine
from sglang_aux.test.ci.ci_register import register_cpu_ci
from sglang_aux.test.runtime_utils import tiny_checkpoint

register_cpu_ci(est_time=90, suite="default")

PROMPTS = ["Hi", "The quick brown fox jumps over", "12 + 30 =", "Natalia sold clips to 48 of"]
GREEDY = {"temperature": 0, "max_new_tokens": 10, "ignore_eos": True}
SAMPLED = [{"temperature": 0.8, "top_p": 0.9, "top_k": 20}, {"temperature": 1.3},
           {"temperature": 0.6, "top_k": 5}, {"temperature": 1.0, "top_p": 0.7}]
COMMON = dict(device="cpu", max_total_tokens=4096, cuda_graph_bs_decode=[1, 2, 4],
              max_running_requests=4)


@pytest.fixture(scope="module")
def engines(tmp_path_factory):
    root = tmp_path_factory.mktemp("ckpt")
    spec = dict(model_path=tiny_checkpoint("tiny-k3", root), speculative_algorithm="DFLASH",
                speculative_draft_model_path=tiny_checkpoint("tiny-k3-dflash", root), **COMMON)
    return Engine(**spec), Engine(**spec, disable_decode_cuda_graph=True)


def _params(n: int, mixed: bool) -> list[dict]:
    """`n` seeded sampled requests; with `mixed`, every other one greedy."""
    return [dict(GREEDY) if mixed and i % 2 else dict(GREEDY, **SAMPLED[i], seed=7 + i)
            for i in range(n)]


def _count_tail_replays(engine, monkeypatch) -> list[int]:
    """Per decode step from now on, how many sampling-tail graphs the two runners replay."""
    worker, counts = engine.worker, []
    for runner in (worker.draft_runner, worker.target_runner):
        gr = runner.step_graphs

        def counted(handle, gr=gr, replay=gr.backend.replay):
            if any(handle is t for t in gr.sampling_graphs):
                counts[-1] += 1
            replay(handle)

        monkeypatch.setattr(gr.backend, "replay", counted)
    decode = worker.decode

    def step(reqs):
        counts.append(0)
        return decode(reqs)

    monkeypatch.setattr(worker, "decode", step)
    return counts


@pytest.mark.parametrize("mixed", [False, True])
def test_sampled_graph_steps_equal_eager_steps_at_every_size(engines, mixed, monkeypatch):
    graphs, eager = engines
    assert len(graphs.worker.target_runner.step_graphs.sampling_graphs) == 3
    assert len(graphs.worker.draft_runner.step_graphs.sampling_graphs) == 3
    tails = _count_tail_replays(graphs, monkeypatch)
    for bs in [1, 2, 3, 4]:  # 3 replays the graphs of 4
        params = _params(bs, mixed and bs > 1)
        a = graphs.generate(PROMPTS[:bs], params)
        b = eager.generate(PROMPTS[:bs], params)
        for x, y in zip(a, b, strict=True):
            assert x["output_ids"] == y["output_ids"], bs
            assert x["meta_info"]["spec_accept_histogram"] == y["meta_info"][
                "spec_accept_histogram"]
    assert tails and all(n == 2 for n in tails), tails  # draft and verify tails, every step
    sampled = [o for o in a if o["meta_info"]["spec_accept_histogram"][0] > 0]
    assert sampled, "no sampled step rejected a draft: the rejection path went untested"


def test_greedy_batches_replay_no_sampling_tail(engines, monkeypatch):
    graphs, _ = engines
    tails = _count_tail_replays(graphs, monkeypatch)
    graphs.generate(PROMPTS, GREEDY)
    assert tails and all(n == 0 for n in tails), tails


def test_one_readback_per_step_with_sampled_requests(engines, monkeypatch):
    graphs, _ = engines
    readback, step = graphs.worker.readback, graphs.scheduler.step
    copies = []

    def counted_step():
        before = readback.num_copies
        step()
        copies.append(readback.num_copies - before)

    monkeypatch.setattr(graphs.scheduler, "step", counted_step)
    graphs.generate(PROMPTS, _params(4, mixed=True))
    assert copies and all(c == 1 for c in copies), copies


def test_seeded_output_is_reproducible_and_batch_independent(engines):
    graphs, eager = engines
    mine = dict(GREEDY, **SAMPLED[0], seed=123)
    alone = graphs.generate(PROMPTS[1], mine)["output_ids"]
    assert graphs.generate(PROMPTS[1], mine)["output_ids"] == alone
    assert eager.generate(PROMPTS[1], mine)["output_ids"] == alone
    o = _params(4, mixed=True)
    for prompts, batch in (([PROMPTS[0], PROMPTS[1], PROMPTS[2]], [o[0], mine, o[1]]),
                           ([PROMPTS[2], PROMPTS[3], PROMPTS[0], PROMPTS[1]],
                            [o[2], o[3], o[0], mine])):
        outs = graphs.generate(prompts, batch)
        assert outs[batch.index(mine)]["output_ids"] == alone
        assert len({tuple(x["output_ids"]) for x in outs}) > 1

if __name__ == "__main__":
    sys.exit(pytest.main([__file__, "-q"]))
