"""The streamed verify tests on the H200: real CUDA graphs replay the streamed projection and
the draft-context commit; fp32 greedy equals target-only, bf16 runs end to end."""

import sys

import pytest
import torch

from sglang_aux.test.ci.ci_register import register_cuda_ci

register_cuda_ci(est_time=120, suite="default")

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")

# The CPU file's tests, collected here with the `device` / `dtype` fixtures below.
from test_draft_context_streamed import (  # noqa: E402, F401
    test_greedy_streamed_verify_equals_target_only,
    test_poisoned_accumulator_between_steps_changes_nothing,
    test_replay_equals_eager_at_every_size_and_padded,
    test_verify_runner_holds_only_the_accumulator,
)


@pytest.fixture
def device():
    return "cuda"


@pytest.fixture(params=["float32", "bfloat16"])
def dtype(request):
    return request.param


if __name__ == "__main__":
    sys.exit(pytest.main([__file__, "-q"]))
