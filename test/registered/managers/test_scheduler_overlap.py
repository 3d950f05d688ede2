"""The overlap scheduler on CPU: step n+1 launches before the host reads step n, from the rows'
device state, and every output, finish reason and slot equals the serial schedule's, through
stop strings, length limits, the context end and aborts."""

import sys

import pytest

from sglang_aux.srt.entrypoints.engine import Engine
from sglang_aux.test.ci.ci_register import register_cpu_ci
from sglang_aux.test.runtime_utils import assert_kv_all_back, assert_same_outputs, tiny_checkpoint

register_cpu_ci(est_time=90, suite="default")

PROMPTS = ["Hi", "The quick brown fox jumps over", "12 + 30 =", "Natalia sold clips to 48 of",
           "x", "What is the capital of France?"]
COMMON = dict(device="cpu", dtype="float32", max_total_tokens=4096, max_running_requests=4,
              cuda_graph_bs_decode=[1, 2, 4])
KINDS = ["target", "dflash"]


@pytest.fixture(scope="module")
def ckpts(tmp_path_factory):
    root = tmp_path_factory.mktemp("ckpt")
    return {p: tiny_checkpoint(p, root) for p in ("tiny-llama", "tiny-llama-dflash")}


def _engine(ckpts, kind, overlap, **kw):
    spec = {} if kind == "target" else dict(
        speculative_algorithm="DFLASH", speculative_draft_model_path=ckpts["tiny-llama-dflash"])
    return Engine(model_path=ckpts["tiny-llama"], disable_overlap_schedule=not overlap, **spec,
                  **{**COMMON, **kw})


def _params():
    """Greedy and seeded sampled requests of different lengths, some ending on stop strings."""
    out = []
    for i in range(len(PROMPTS)):
        p = {"max_new_tokens": 5 + 7 * i, "ignore_eos": True}
        p.update({"temperature": 0} if i % 2 == 0 else
                 {"temperature": 0.9, "top_p": 0.9, "top_k": 30, "seed": i})
        if i % 3 == 1:  # characters and a token the tiny byte-level model emits often
            p.update(stop=["r", "EE"], stop_token_ids=[81, 52])
        out.append(p)
    return out


@pytest.mark.parametrize("kind", KINDS)
def test_overlap_equals_the_serial_schedule(ckpts, kind):
    serial = _engine(ckpts, kind, overlap=False)
    engine = _engine(ckpts, kind, overlap=True)
    sched, worker = engine.scheduler, engine.worker
    unread_at_launch = []
    decode = worker.decode

    def launch(reqs):
        unread_at_launch.append(bool(sched.in_flight))
        return decode(reqs)

    worker.decode = launch
    for _ in range(2):  # a second round reuses rows and slots a dropped step wrote last
        want, got = serial.generate(PROMPTS, _params()), engine.generate(PROMPTS, _params())
        assert_same_outputs(want, got)
        assert [o["text"] for o in got] == [o["text"] for o in want]
    assert any(o["meta_info"]["finish_reason"]["type"] == "stop" for o in got)
    # the host read step n only after launching step n+1, nearly every time
    assert sum(unread_at_launch) >= 0.8 * len(unread_at_launch), unread_at_launch
    assert_kv_all_back(engine)


@pytest.mark.parametrize("kind", KINDS)
def test_requests_that_reach_the_context_end(ckpts, kind):
    """Near the context a request cannot take a step it might not have room for; it waits for
    its previous step's tokens instead, and ends exactly where the serial schedule ends it."""
    prompts = ["Natalia sold clips to 48 of her friends in April, and then she sold"] * 2
    params = {"temperature": 0, "max_new_tokens": 500, "ignore_eos": True}
    kw = dict(context_length=96)  # the prompt is 67 byte-level tokens
    want = _engine(ckpts, kind, overlap=False, **kw).generate(prompts, params)
    engine = _engine(ckpts, kind, overlap=True, **kw)
    sched, held_back = engine.scheduler, []
    can_launch = sched._can_launch
    sched._can_launch = lambda r: can_launch(r) or held_back.append(r) or False
    got = engine.generate(prompts, params)
    # a one-token step in flight always leaves room for the next; a DFlash block may not
    assert bool(held_back) == (kind == "dflash"), len(held_back)
    for a, b in zip(want, got, strict=True):
        assert b["output_ids"] == a["output_ids"]
        assert b["meta_info"]["finish_reason"]["type"] == "length"
    assert_kv_all_back(engine)


@pytest.mark.parametrize("kind", KINDS)
def test_abort_while_its_step_is_in_flight(ckpts, kind):
    engine = _engine(ckpts, kind, overlap=True)
    sched = engine.scheduler
    reqs = [engine.make_request(text=p, sampling_params={"temperature": 0, "max_new_tokens": 40,
                                                         "ignore_eos": True}) for p in PROMPTS]
    for r in reqs:
        sched.add_request(r)
    for _ in range(4):
        sched.step()
    victim = next(r for step in sched.in_flight for r in step.reqs if r in sched.running)
    kept = len(victim.output_ids)
    sched.abort(victim)
    while sched.has_work():
        sched.step()
    assert victim.finished_reason == {"type": "abort"}
    assert len(victim.output_ids) == kept, "the aborted request got its in-flight tokens"
    assert all(len(r.output_ids) == 40 for r in reqs if r is not victim)
    assert sched.in_flight == []
    assert_kv_all_back(engine)


if __name__ == "__main__":
    sys.exit(pytest.main([__file__, "-q"]))


def test_overlap_charges_a_pass_to_the_step_it_completes(ckpts):
    """A pass launches step n and waits for step n-1's tokens: its seconds are n-1's, so the
    pass that launches the first decode step (completing the prefill) adds to the prefill's."""
    engine = _engine(ckpts, "target", overlap=True)
    sched, stats = engine.scheduler, engine.scheduler.stats
    req = engine.make_request(text=PROMPTS[1], sampling_params={"max_new_tokens": 8,
                                                                "ignore_eos": True})
    sched.add_request(req)
    sched.step()  # the prefill's launch
    assert stats["prefill_steps"] == 1 and not req.output_ids
    sched.step()  # the first decode step's launch; the prefill's tokens read
    assert stats["decode_steps"] == 1 and len(req.output_ids) == 1
    assert stats["decode_seconds"] == 0.0 < stats["prefill_seconds"]
    prefill_seconds = stats["prefill_seconds"]
    sched.step()  # the second decode step's launch; the first's tokens read
    assert stats["decode_seconds"] > 0.0 and stats["prefill_seconds"] == prefill_seconds
    while sched.has_work():
        sched.step()
    assert req.finished and len(req.output_ids) == 8
