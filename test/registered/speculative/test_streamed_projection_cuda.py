"""The streamed projection tests on the H200: Triton accumulating GEMMs inside the runtime."""

import sys

import pytest
import torch

from sglang_aux.test.ci.ci_register import register_cuda_ci

register_cuda_ci(est_time=90, suite="default")

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")

# The CPU file's tests, collected here with the `device` fixture below.
from test_streamed_projection import (  # noqa: E402, F401
    test_construction_errors_name_shapes,
    test_dflash_greedy_equals_target_only_with_streamed_prefill,
    test_projected_capture_counts_at_finish,
    test_sink_contract,
    test_streamed_equals_the_fc_of_the_concat,
    test_target_feeds_the_streamed_projection,
)


@pytest.fixture
def device():
    return "cuda"


if __name__ == "__main__":
    sys.exit(pytest.main([__file__, "-q"]))
