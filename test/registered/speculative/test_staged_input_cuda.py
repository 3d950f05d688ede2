"""The staged MXFP8 projection tests on the H200: Triton quantizer and GEMM, CUDA graphs."""

import sys

import pytest
import torch

from sglang_aux.test.ci.ci_register import register_cuda_ci

register_cuda_ci(est_time=90, suite="default")

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")

# The CPU file's tests, collected here with the `device` fixture below.
from test_staged_input import (  # noqa: E402, F401
    test_dflash_output_unchanged_with_staged_prefill,
    test_llama_target_keeps_the_list_path,
    test_no_staging_without_an_mxfp8_fc,
    test_staged_projection_is_bitwise_the_concat_path,
)


@pytest.fixture
def device():
    return "cuda"


if __name__ == "__main__":
    sys.exit(pytest.main([__file__, "-q"]))
