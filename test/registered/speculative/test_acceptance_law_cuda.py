"""The sampling law tests on the H200 (`sglang_aux/test/law_pair.py`'s pair, float32, real
CUDA graphs, Triton attention): every block position of DFlash and DSpark sampling follows the
target's law, and so does every token compact verify emits through the ragged verify
attention."""

import sys

import pytest
import torch

from sglang_aux.test.ci.ci_register import register_cuda_ci
from sglang_aux.test.law_pair import (
    DRAFTS,
    assert_block_positions_follow_the_target_law,
    assert_compact_verify_keeps_the_target_law,
    law_pairs,
)

register_cuda_ci(est_time=120, suite="default")

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")


@pytest.fixture(scope="module")
def pairs(tmp_path_factory):
    return law_pairs(tmp_path_factory.mktemp("law"))


@pytest.mark.parametrize("algorithm", list(DRAFTS))
def test_every_block_position_follows_the_target_law(pairs, algorithm):
    assert_block_positions_follow_the_target_law(pairs, algorithm, device="cuda")


@pytest.mark.parametrize("algorithm", list(DRAFTS))
def test_static_verify_narrower_than_the_block_keeps_the_law(pairs, algorithm):
    assert_block_positions_follow_the_target_law(pairs, algorithm, device="cuda", width=3)


@pytest.mark.parametrize("algorithm", list(DRAFTS))
def test_compact_verify_keeps_every_token_on_the_target_law(pairs, algorithm):
    assert_compact_verify_keeps_the_target_law(pairs, algorithm, device="cuda")


if __name__ == "__main__":
    sys.exit(pytest.main([__file__, "-q"]))
