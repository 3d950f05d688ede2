"""The Markov loop kernel's tile benchmark (benchmark/spec_decode/bench_markov_argmax.py) in its
CPU smoke mode: every (model, bs) row has every tile and the certified top-K path at each bias
scale, the first tile the 1.00x baseline; the bytes count one `markov_w2` read per request
block and proposal (two blocks of 16 at 17 requests, one of 32), the top-K path's its
candidates' rows plus the sweeps its certificates leave (none at a small bias, which
certifies every proposal); the sweeps a row needs follow its certificates and divergence; a
tile that chose other tokens than the first stops the run, naming both."""

import os

# NOTE: must precede any @triton.jit definition, i.e. any import of triton or the kernel.
os.environ["TRITON_INTERPRET"] = "1"

import json  # noqa: E402
import sys  # noqa: E402
from pathlib import Path  # noqa: E402

import pytest  # noqa: E402
import torch  # noqa: E402

from sglang_aux.test.bench_script import load_bench  # noqa: E402
from sglang_aux.test.ci.ci_register import register_cpu_ci  # noqa: E402

register_cpu_ci(est_time=40, suite="default")

SCRIPT = Path(__file__).resolve().parents[3] / "benchmark/spec_decode/bench_markov_argmax.py"


def test_smoke_run_reports_every_tile(tmp_path, capsys):
    out = tmp_path / "bench.json"
    bench = load_bench(SCRIPT)
    report = bench.main(["--smoke", "--tiles", "16:4:0", "32:8:0", "--out", str(out)])
    assert json.loads(out.read_text())["rows"] == report["rows"]
    assert "vs first" in capsys.readouterr().out
    rows = {(r["bs"], r["tile"]): r for r in report["rows"]}
    assert set(rows) == {(bs, t) for bs in bench.SMOKE["bs"]
                         for t in ("16:4:0", "32:8:0", "topk@16x1", "topk@16x0.001")}
    assert all(rows[(bs, "topk@16x0.001")]["certified"] == 1.0 for bs in bench.SMOKE["bs"])
    assert all(0 <= rows[(bs, "topk@16x1")]["certified"] <= 1 for bs in bench.SMOKE["bs"])
    n, vocab = bench.TINY
    w2 = vocab * bench.RANK * 4  # fp32 on the CPU
    assert rows[(17, "16:4:0")]["w2_bytes_read"] == 2 * n * w2
    assert rows[(17, "32:8:0")]["w2_bytes_read"] == n * w2
    assert all(r["vs_first"] == 1.0 for (_, t), r in rows.items() if t == "16:4:0")
    assert rows[(17, "topk@16x0.001")]["w2_bytes_read"] == 17 * n * 16 * bench.RANK * 4
    assert rows[(17, "topk@16x1")]["w2_bytes_read"] >= 17 * n * 16 * bench.RANK * 4


def test_the_sweeps_follow_certificates_and_divergence():
    bench = load_bench(SCRIPT)
    cand = torch.tensor([[1, 2, 3, 4], [5, 6, 7, 8], [9, 9, 9, 9]])
    cert = torch.tensor([[1, 1, 1, 1], [1, 0, 1, 1], [1, 0, 1, 0]])
    tokens = cand.clone()
    tokens[1, 1] = 0  # row 1's swept token differs: its later proposals are swept too
    # rows of 2: block 0 (rows 0, 1) sweeps at proposals 1, 2, 3; block 1 (row 2) at 1 and 3
    assert bench.swept_blocks(cand, cert, tokens, 2) == 5
    assert bench.swept_blocks(cand, cert, tokens, 4) == 3  # one block: proposals 1, 2, 3


def test_a_tile_that_chooses_otherwise_stops_the_run(tmp_path, monkeypatch):
    bench = load_bench(SCRIPT)
    real = bench.markov_greedy_tokens

    def wrong_for_32_rows(base, anchor, w1, w2, out, tile):
        real(base, anchor, w1, w2, out, tile)
        if tile.rows == 32:
            out[0, 0] += 1

    monkeypatch.setattr(bench, "markov_greedy_tokens", wrong_for_32_rows)
    with pytest.raises(AssertionError, match="tiny bs 1: tile 32:8:0 chose other tokens than "
                                             "16:4:0"):
        bench.main(["--smoke", "--tiles", "16:4:0", "32:8:0", "--out", str(tmp_path / "b.json")])


def test_a_bad_tile_is_refused():
    bench = load_bench(SCRIPT)
    with pytest.raises(ValueError, match="takes 16 or 32 rows on 4 or 8 warps"):
        bench.parse_tile("64:4:0")


if __name__ == "__main__":
    sys.exit(pytest.main([__file__, "-q"]))
