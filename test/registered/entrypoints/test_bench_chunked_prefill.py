"""The chunked prefill benchmark (benchmark/spec_decode/bench_chunked_prefill.py) in its CPU
smoke mode: a tiny-k3 chunk step under each aux projection, then a long prompt through two real
HTTP servers (chunked and unchunked) while other requests decode; the servers report their
chunk size, the chunked one prefills in chunks, and both give the same greedy tokens."""

import argparse
import json
import sys
from pathlib import Path

import pytest

from sglang_aux.srt.model_loader.tokenizer import Tokenizer
from sglang_aux.test.bench_script import load_bench
from sglang_aux.test.ci.ci_register import register_cpu_ci
from sglang_aux.test.gsm8k_data import gsm8k_path
from sglang_aux.test.runtime_utils import tiny_checkpoint

register_cpu_ci(est_time=60, suite="default")

SCRIPT = Path(__file__).resolve().parents[3] / "benchmark/spec_decode/bench_chunked_prefill.py"


def _bench():
    return load_bench(SCRIPT)


def test_smoke_run_reports_every_figure(tmp_path, capsys):
    out = tmp_path / "bench.json"
    report = _bench().main(["--smoke", "--out", str(out)])
    assert out.is_file()
    printed = capsys.readouterr().out
    assert "step peak B" in printed and "prefill tok/s" in printed
    steps = {s["path"]: s for s in report["chunk_step"]}
    assert set(steps) == {"concat", "staged", "streamed"}
    # the packed rows of a chunk: 32 tokens x 3 captures x hidden 64, fp32; the streamed
    # accumulator's: 32 x the draft's hidden 64, fp32; staged writes none of them
    assert steps["concat"]["aux_rows_bytes"] == 32 * 3 * 64 * 4
    assert steps["streamed"]["aux_rows_bytes"] == 32 * 64 * 4
    assert steps["staged"]["aux_rows_bytes"] == 0
    # the target-only floor: the same chunk with no draft, so no aux rows
    assert report["target_chunk_step"]["aux_rows_bytes"] == 0
    assert report["target_chunk_step"]["chunk"] == 32
    chunked, whole = report["long_prompt"]
    assert chunked["server_chunked_prefill_size"] == 32
    assert whole["server_chunked_prefill_size"] == -1
    assert chunked["chunked_prefill_steps"] >= 200 // 32 and whole["chunked_prefill_steps"] == 0
    assert report["same_tokens"] and len(chunked["output_ids"]) == 8
    for r in (chunked, whole):
        assert r["ttft_s"] > 0 and r["prefill_tok_s"] > 0
        assert r["others_decode_tok_s_before"] > 0


def test_a_text_prompt_in_the_models_tokenizer(tmp_path):
    bench = _bench()
    ckpt = tiny_checkpoint("tiny-llama", tmp_path)
    a = argparse.Namespace(model_path=ckpt, server_args=["--device", "cpu"], prompt_tokens=300)
    ids = bench.text_prompt(a)
    tokenizer = Tokenizer.from_dir(ckpt)
    first = json.loads(gsm8k_path("train").open().readline())
    assert len(ids) == 300
    assert ids[:20] == tokenizer.encode(f"Question: {first['question']}")[:20]
    with pytest.raises(ValueError, match="fewer than --prompt-tokens"):
        bench.text_prompt(argparse.Namespace(model_path=ckpt, server_args=[],
                                             prompt_tokens=10**9))


def test_live_at_peak_replays_allocs_and_frees():
    frames = [{"filename": "/x/python/sglang_aux/srt/models/m.py", "line": 7, "name": "forward"},
              {"filename": "/usr/lib/torch/nn.py", "line": 1, "name": "call"}]
    trace = [{"action": "alloc", "addr": 1, "size": 100, "frames": frames},
             {"action": "alloc", "addr": 2, "size": 300, "frames": []},
             {"action": "free_requested", "addr": 2, "size": 300},
             {"action": "free_completed", "addr": 2, "size": 300},
             {"action": "alloc", "addr": 3, "size": 250, "frames": frames},
             {"action": "alloc", "addr": 4, "size": 10, "frames": frames},
             {"action": "free_requested", "addr": 1, "size": 100}]
    peak, live = _bench().live_at_peak(trace, top=2)
    assert peak == 400  # 100 + 300, not 100 + 250 + 10 = 360
    assert live == [{"bytes": 300, "at": ""},
                    {"bytes": 100, "at": "srt/models/m.py:7 forward"}]


if __name__ == "__main__":
    sys.exit(pytest.main([__file__, "-v"]))
