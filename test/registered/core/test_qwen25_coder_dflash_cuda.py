"""The real pair on the H200: Qwen2.5-Coder-1.5B-Instruct and its trained block-16 DFlash
draft (`train_dflash --recipe qwen2.5-coder-1.5b-instruct-dflash-b16`). In fp32, greedy DFlash
gives the target-only tokens on GSM8K prompts, token for token, while the draft is accepted
often (a draft that never matched would pass the equality trivially)."""

import sys

import pytest
import torch

from sglang_aux.srt.entrypoints.engine import Engine
from sglang_aux.srt.model_loader import builtin
from sglang_aux.test.ci.ci_register import register_cuda_ci
from sglang_aux.test.few_shot_gsm8k import STOP
from sglang_aux.test.gsm8k_data import local_path_or_skip
from sglang_aux.tools.dflash_training.data import gsm8k_prompts

register_cuda_ci(est_time=240, suite="default")

TARGET = "qwen2.5-coder-1.5b-instruct"
DRAFT = "qwen2.5-coder-1.5b-instruct-dflash-b16"
NUM_PROMPTS = 16
MAX_NEW_TOKENS = 160
MIN_ACCEPT_LENGTH = 3.0  # mean per request; the trained draft reaches about 5 on held-out text

if not torch.cuda.is_available():
    pytest.skip("needs CUDA", allow_module_level=True)
try:
    TARGET_DIR = builtin.resolve_model_path(TARGET)
    DRAFT_DIR = builtin.resolve_model_path(DRAFT)
except FileNotFoundError as e:
    pytest.skip(f"the pair is not staged and trained here: {e}", allow_module_level=True)
TEST, TRAIN = local_path_or_skip("test"), local_path_or_skip("train")


def _generate(**spec) -> list[dict]:
    engine = Engine(model_path=TARGET_DIR, dtype="float32", device="cuda",
                    max_running_requests=NUM_PROMPTS, context_length=2048,
                    max_total_tokens=NUM_PROMPTS * 2048, **spec)
    prompts = gsm8k_prompts(TEST, TRAIN, 5, NUM_PROMPTS)
    outs = engine.generate(prompts, {"temperature": 0, "max_new_tokens": MAX_NEW_TOKENS,
                                     "stop": STOP})
    engine.shutdown()
    torch.cuda.empty_cache()
    return outs


def test_greedy_dflash_equals_target_only_in_fp32():
    ref = _generate()
    spec = _generate(speculative_algorithm="DFLASH", speculative_draft_model_path=DRAFT_DIR)
    for i, (r, s) in enumerate(zip(ref, spec, strict=True)):
        assert s["output_ids"] == r["output_ids"], f"prompt {i}"
    accept = [s["meta_info"]["spec_accept_length"] for s in spec]
    assert sum(accept) / len(accept) >= MIN_ACCEPT_LENGTH, accept


if __name__ == "__main__":
    sys.exit(pytest.main([__file__, "-q"]))
