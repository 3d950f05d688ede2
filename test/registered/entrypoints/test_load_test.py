"""The server load test (benchmark/spec_decode/load_test_server.py), scaled down to the CPU:
concurrent greedy and sampled DFlash requests with aborts mid-stream, greedy outputs equal to
their sequential runs, every KV slot and request row back, a run of decode steps after it."""

import sys
from pathlib import Path

import pytest

from sglang_aux.test.bench_script import load_bench
from sglang_aux.test.ci.ci_register import register_cpu_ci
from sglang_aux.test.runtime_utils import tiny_checkpoint

register_cpu_ci(est_time=90, suite="default")

SCRIPT = Path(__file__).resolve().parents[3] / "benchmark/spec_decode/load_test_server.py"


def _load_test():
    return load_bench(SCRIPT)


@pytest.mark.parametrize("flags", [[], ["--enable-mixed-chunk"], ["--chunked-prefill-size", "8"]],
                         ids=["apart", "mixed", "chunked"])
def test_load_test_passes_on_a_small_dflash_server(tmp_path, flags):
    """With `--enable-mixed-chunk` (the default on CUDA, not on this CPU) the concurrent
    phase's arrivals ride in verify steps; with `--chunked-prefill-size 8` longer prompts
    prefill in chunks between them."""
    target = tiny_checkpoint("tiny-k3", tmp_path)
    draft = tiny_checkpoint("tiny-k3-dflash", tmp_path)
    out = tmp_path / "load.json"
    report = _load_test().main([
        "--num-requests", "16", "--min-new", "4", "--max-new", "24", "--abort-every", "4",
        "--long-steps", "60", "--long-concurrency", "4", "--long-max-new", "32",
        "--out", str(out), "--",
        "--model-path", target, "--device", "cpu", "--speculative-algorithm", "DFLASH",
        "--speculative-draft-model-path", draft, "--max-running-requests", "8",
        "--cuda-graph-max-bs-decode", "8", "--max-total-tokens", "8192",
        *flags])
    assert out.is_file()
    assert report["aborted"] == 4 and report["checked"] == 12
    assert report["greedy_checked"] > 0 and report["greedy_mismatched"] == []
    assert report["kv_slots_back"] and report["req_rows_back"] and report["final_kv_slots_back"]
    assert report["long_decode_steps"] >= 60
    assert report["radix_cache_hit_tokens"] > 0  # the concurrent phase repeats the references
    assert report["ok"]
    stats = report["scheduler_stats_after_concurrent"]
    assert (stats["mixed_steps"] > 0) == ("--enable-mixed-chunk" in flags), stats
    assert (stats["chunked_prefill_steps"] > 0) == ("--chunked-prefill-size" in flags), stats


if __name__ == "__main__":
    sys.exit(pytest.main([__file__, "-q"]))
