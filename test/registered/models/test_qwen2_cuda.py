"""The Qwen2 tests on the H200: our Engine (CUDA graphs, Triton attention, fp32) against
transformers on the GPU, and lossless DFlash over the shared aux buffer."""

import sys

import pytest
import torch

from sglang_aux.test.ci.ci_register import register_cuda_ci

register_cuda_ci(est_time=60, suite="default")

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")

# The CPU file's tests, collected here with the `device` fixture below.
from test_qwen2 import (  # noqa: E402, F401
    engine,
    folder,
    hf,
    test_dflash_is_lossless_over_the_shared_buffer,
    test_greedy_tokens_equal_transformers,
    test_model_structure,
    test_opts_in_to_the_shared_aux_buffer,
    test_prefill_logits_close_to_transformers,
)


@pytest.fixture(scope="module")
def device():
    return "cuda"


if __name__ == "__main__":
    sys.exit(pytest.main([__file__, "-q"]))
