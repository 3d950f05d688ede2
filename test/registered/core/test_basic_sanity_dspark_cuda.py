"""The DSPARK end-to-end server test on the H200: CUDA graphs (the Markov loop in the draft
graph, TARGET_VERIFY graphs per batch size and per token bucket) and Triton attention."""

import sys

import pytest
import torch

from sglang_aux.test.ci.ci_register import register_cuda_ci

register_cuda_ci(est_time=180, suite="default")

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")

# The CPU file's tests, collected here with the `device` fixture below.
from test_basic_sanity_dspark import (  # noqa: E402, F401
    servers,
    test_concurrent_requests_match_sequential,
    test_greedy_dspark_equals_target_only_server,
    test_gsm8k_harness_on_real_questions,
    test_return_logprob_is_refused_and_the_server_keeps_serving,
    test_server_info_carries_the_spec_fields,
    test_streaming_and_openai_routes,
)


@pytest.fixture(scope="module")
def device():
    return "cuda"


if __name__ == "__main__":
    sys.exit(pytest.main([__file__, "-q"]))
