"""The mixed-step benchmark (benchmark/spec_decode/bench_mixed_step.py) in its CPU smoke mode
(tiny-llama and its block-4 draft, host-clock ms): a running batch stepped by the scheduler,
then arrivals priced as a prefill apart and inside a mixed forward whose graph has the step's
batch size and verify width and the smallest of the asked arrival token counts that holds the
arrivals' uncached tokens."""

import sys
from pathlib import Path

import pytest

from sglang_aux.test.bench_script import load_bench
from sglang_aux.test.ci.ci_register import register_cpu_ci

register_cpu_ci(est_time=10, suite="default")

SCRIPT = Path(__file__).resolve().parents[3] / "benchmark/spec_decode/bench_mixed_step.py"
BS, NEW, WIDTH = 4, 8, 3


@pytest.fixture(scope="module")
def report(tmp_path_factory):
    out = tmp_path_factory.mktemp("mixed") / "mixed.json"
    return load_bench(SCRIPT).main([
        "--device", "cpu", "--target", "tiny-llama", "--draft", "tiny-llama-dflash",
        "--bs", str(BS), "--prefix", "40", "--new", str(NEW), "--widths", "1", "2",
        "--iters", "2", "--kernels", "0", "--vocab", "200", "--verify-width", str(WIDTH),
        "--mixed-tokens", "12", "24", "--out", str(out)])


def test_each_engine_and_arrival_count_is_priced(report):
    rows = {(r["engine"], r["arrivals"]): r for r in report["rows"]}
    assert set(rows) == {(e, n) for e in ("target", "dflash") for n in (1, 2)}
    for (engine, n), r in rows.items():
        width = 1 if engine == "target" else WIDTH
        assert r["step_graph"] == ("DECODE" if engine == "target" else "TARGET_VERIFY")
        assert r["width"] == width and r["bs"] == BS
        # the prefix came from the cache: only the new tokens are prefilled
        assert r["arrival_tokens"] == n * NEW
        step_bs, mixed_width, arrival_tokens = r["mixed_graph"]
        # the smallest of --mixed-tokens that holds the arrivals
        assert step_bs == BS and mixed_width == width and arrival_tokens == (12 if n == 1
                                                                              else 24)
        for key in ("step_ms", "prefill_ms", "step_then_prefill_ms", "mixed_replay_ms",
                    "mixed_forward_ms"):
            assert r[key] > 0, key


if __name__ == "__main__":
    sys.exit(pytest.main([__file__, "-v"]))
