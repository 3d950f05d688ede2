"""FlashInfer's norm, activation and RoPE kernels beside ours on the H200 (flashinfer
importable after scripts/device/stage_flashinfer.sh --install; skipped, saying why, where it
is not): every op has FlashInfer's row beside ours at Qwen2.5-1.5B's sizes, each within bf16
rounding of the fp32 reference."""

import sys
from pathlib import Path

import pytest
import torch

from sglang_aux.test.bench_script import load_bench
from sglang_aux.test.ci.ci_register import register_cuda_ci

register_cuda_ci(est_time=120, suite="default")

SCRIPT = (Path(__file__).resolve().parents[3]
          / "benchmark/spec_decode/bench_flashinfer_elementwise.py")


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_flashinfer_and_our_paths_match_the_reference_on_cuda(tmp_path):
    bench = load_bench(SCRIPT)
    flashinfer, why_not = bench.load_flashinfer()
    if flashinfer is None:
        pytest.skip(why_not)
    report = bench.main(["--rows", "1", "16", "--calls", "2", "--iters", "3",
                         "--out", str(tmp_path / "b.json")])
    paths = {(r["op"], r["path"]) for r in report["rows"]}
    assert paths == {(op, p) for op in bench.OPS for p in ("ours", "flashinfer")}
    assert all(r["rel_err"] < 2e-2 for r in report["rows"])


if __name__ == "__main__":
    sys.exit(pytest.main([__file__, "-v"]))
