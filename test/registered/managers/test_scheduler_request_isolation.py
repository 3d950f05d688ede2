"""One request's bad values fail that request alone. At admission every integer sampling field
must fit int64 (the column it travels in), with a ValueError naming the field; and a request
whose per-request admission work still fails (values that bypassed validation) is failed alone
by the scheduler: the requests running beside it finish with the tokens they give alone, its
row and KV go back, and the prefix cache keeps what it held."""

import math
import sys

import pytest

from sglang_aux.srt.entrypoints.engine import Engine
from sglang_aux.srt.managers.schedule_batch import Req
from sglang_aux.srt.sampling.sampling_params import SamplingParams
from sglang_aux.test.ci.ci_register import register_cpu_ci
from sglang_aux.test.runtime_utils import assert_kv_all_back, tiny_checkpoint

register_cpu_ci(est_time=20, suite="default")

PROMPTS = ["The quick brown fox jumps over", "12 + 30 =", "Natalia sold clips to 48"]
PARAMS = [{"temperature": 0, "max_new_tokens": 10, "ignore_eos": True},
          {"temperature": 0.8, "top_p": 0.9, "top_k": 20, "seed": 7, "max_new_tokens": 10,
           "ignore_eos": True},
          {"temperature": 1.0, "seed": -5, "max_new_tokens": 10, "ignore_eos": True}]
CACHED = "A prompt whose K/V the prefix cache holds throughout"


@pytest.mark.parametrize(("field", "value"), [
    ("seed", 2**64), ("seed", 2**63), ("seed", -(2**63) - 1), ("top_k", 2**63),
    ("stop_token_ids", [1, 2**64]), ("max_new_tokens", 2**70),
])
def test_integer_fields_out_of_int64_are_refused_naming_the_field(field, value):
    with pytest.raises(ValueError, match=field):
        SamplingParams.from_dict({field: value})


@pytest.mark.parametrize(("field", "value"), [
    ("temperature", math.nan), ("temperature", math.inf), ("top_p", math.nan),
    ("top_p", -math.inf),
])
def test_non_finite_floats_are_refused_naming_the_field(field, value):
    with pytest.raises(ValueError, match=field):
        SamplingParams.from_dict({field: value})


def test_int64_edges_are_accepted():
    for seed in (2**63 - 1, -(2**63)):
        assert SamplingParams.from_dict({"seed": seed}).seed == seed
    assert SamplingParams.from_dict({"top_k": 2**63 - 1}).top_k == 2**63 - 1


@pytest.fixture(scope="module")
def engine(tmp_path_factory):
    path = tiny_checkpoint("tiny-llama", tmp_path_factory.mktemp("ckpt"))
    return Engine(model_path=path, device="cpu", max_running_requests=8, max_total_tokens=2048,
                  cuda_graph_bs_decode=[1, 2, 4, 8])


def test_a_request_failing_admission_fails_alone_amid_running_requests(engine):
    sched = engine.scheduler
    engine.generate(CACHED, {"max_new_tokens": 1})
    cached_ids = engine.tokenizer.encode(CACHED)
    cached_before = sched.tree_cache.match_prefix(cached_ids).slots.numel()
    assert cached_before > 0
    alone = [engine.generate(p, params) for p, params in zip(PROMPTS, PARAMS, strict=True)]

    running = [engine.make_request(text=PROMPTS[0], sampling_params=PARAMS[0])]
    sched.add_request(running[0])
    sched.step()
    sched.step()
    assert running[0] in sched.running and not running[0].finished
    ids = engine.tokenizer.encode("Hi there")
    # values validation refuses, built past it: each passes the scheduler's own checks
    bad_seed = Req("bad-seed", ids, SamplingParams(temperature=0.7), seed=2**64)
    bad_float = Req("bad-float", ids, SamplingParams(temperature=1e300), seed=1)
    later = [engine.make_request(text=p, sampling_params=params)
             for p, params in zip(PROMPTS[1:], PARAMS[1:], strict=True)]
    for req in (bad_seed, later[0], bad_float, later[1]):
        sched.add_request(req)
    reqs = running + later
    while not all(r.finished for r in (*reqs, bad_seed, bad_float)):
        sched.step()

    for req, want in zip(reqs, alone, strict=True):
        assert engine.output_of(req)["output_ids"] == want["output_ids"], req.rid
    assert bad_seed.finished_reason["type"] == "abort"
    assert "seed" in bad_seed.finished_reason["message"]
    assert bad_float.finished_reason["type"] == "abort"
    assert "float" in bad_float.finished_reason["message"]
    assert bad_seed.output_ids == bad_float.output_ids == []
    assert sched.tree_cache.match_prefix(cached_ids).slots.numel() == cached_before
    assert_kv_all_back(engine)


if __name__ == "__main__":
    sys.exit(pytest.main([__file__, "-q"]))
