"""The FlashInfer side-by-side benchmark on the H200 (flashinfer importable after
scripts/device/stage_flashinfer.sh --install; skipped, saying why, where it is not): every row
has FlashInfer's decode or prefill path beside ours, each within the bench's error bound
against torch_native."""

import sys
from pathlib import Path

import pytest
import torch

from sglang_aux.test.bench_script import load_bench
from sglang_aux.test.ci.ci_register import register_cuda_ci

register_cuda_ci(est_time=240, suite="default")

SCRIPT = Path(__file__).resolve().parents[3] / "benchmark/spec_decode/bench_flashinfer_attention.py"


def _bench():
    return load_bench(SCRIPT)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_flashinfer_paths_match_torch_native_on_cuda(tmp_path):
    bench = _bench()
    flashinfer, why_not = bench.load_flashinfer()
    if flashinfer is None:
        pytest.skip(why_not)
    report = bench.main(["--bs", "1", "4", "--contexts", "300", "--q-lens", "1", "16",
                         "--calls", "2", "--iters", "3", "--out", str(tmp_path / "b.json")])
    paths = {(r["q_len"], r["path"]) for r in report["rows"]}
    assert {(1, "decode"), (16, "prefill_fa2")} <= paths
    assert all(r["rel_err"] < 2e-2 for r in report["rows"])



if __name__ == "__main__":
    sys.exit(pytest.main([__file__, "-v"]))
