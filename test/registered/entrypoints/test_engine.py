"""Offline Engine: greedy generation through the decode graph runner with continuous batching
equals plain greedy decoding that recomputes the whole sequence every token."""

import sys

import pytest

from sglang_aux.srt.entrypoints.engine import Engine
from sglang_aux.test.ci.ci_register import register_cpu_ci
from sglang_aux.test.runtime_utils import assert_kv_all_back, prefill, release, tiny_checkpoint

register_cpu_ci(est_time=60, suite="default")

PROMPTS = ["Hi", "The quick brown fox jumps over", "12 + 30 =", "A", "Natalia sold clips to 48"]
MAX_NEW = 12


def _reference_greedy(runner, prompt_ids: list[int], n: int) -> list[int]:
    """Greedy tokens by a fresh full prefill of prompt + outputs for every token."""
    out = []
    for _ in range(n):
        reqs, logits_out = prefill(runner, [prompt_ids + out])
        out.append(int(logits_out.next_token_logits[0].argmax()))
        release(runner, reqs)
    return out


@pytest.mark.parametrize("preset", ["tiny-k3", "tiny-llama"])
def test_engine_greedy_equals_recompute_greedy(tmp_path, preset):
    path = tiny_checkpoint(preset, tmp_path)
    # 3 running slots for 5 prompts: later prompts join while others decode
    engine = Engine(model_path=path, device="cpu", max_running_requests=3,
                    cuda_graph_bs_decode=[1, 2, 3], max_total_tokens=2048)
    outs = engine.generate(PROMPTS, {"temperature": 0, "max_new_tokens": MAX_NEW,
                                     "ignore_eos": True})
    assert engine.worker.model_runner.step_graphs is not None
    assert engine.scheduler.stats["prefill_steps"] >= 2, "continuous batching never admitted late"
    ref_engine = Engine(model_path=path, device="cpu", disable_decode_cuda_graph=True,
                        max_total_tokens=2048)
    runner = ref_engine.worker.model_runner
    for prompt, out in zip(PROMPTS, outs, strict=True):
        ids = engine.tokenizer.encode(prompt)
        assert out["output_ids"] == _reference_greedy(runner, ids, MAX_NEW), prompt
        assert out["meta_info"]["completion_tokens"] == MAX_NEW
        assert out["meta_info"]["prompt_tokens"] == len(ids)
    assert len({tuple(o["output_ids"]) for o in outs}) > 1
    assert_kv_all_back(engine)


def test_engine_rejects_bad_requests_and_keeps_working(tmp_path):
    engine = Engine(model_path=tiny_checkpoint("tiny-llama", tmp_path), device="cpu",
                    max_total_tokens=2048, context_length=64, cuda_graph_bs_decode=[1])
    with pytest.raises(ValueError, match="empty"):
        engine.generate("", {"max_new_tokens": 2})
    with pytest.raises(ValueError, match="context"):
        engine.generate("x" * 100, {"max_new_tokens": 2})
    with pytest.raises(ValueError, match="temperature"):
        engine.generate("hi", {"temperature": -1})
    with pytest.raises(ValueError, match="unknown sampling"):
        engine.generate("hi", {"max_tokens": 3})
    out = engine.generate("hi", {"max_new_tokens": 3, "temperature": 0, "ignore_eos": True})
    assert len(out["output_ids"]) == 3
    with pytest.raises(ValueError, match="pipeline stage"):
        Engine(model_path=tiny_checkpoint("tiny-llama", tmp_path), device="cpu", pp_size=2)


def test_sampling_with_seed_is_reproducible(tmp_path):
    engine = Engine(model_path=tiny_checkpoint("tiny-llama", tmp_path), device="cpu",
                    max_total_tokens=2048, cuda_graph_bs_decode=[1, 2])
    params = {"temperature": 1.0, "max_new_tokens": 8, "seed": 7, "ignore_eos": True}
    a = engine.generate("hello", params)["output_ids"]
    b = engine.generate("hello", params)["output_ids"]
    assert a == b


if __name__ == "__main__":
    sys.exit(pytest.main([__file__, "-q"]))
