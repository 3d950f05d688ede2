"""The bytes a step reads (benchmark/spec_decode/step_bandwidth.py), by hand on tiny models: a
tied LM head read once as the head, an untied embedding only for the step's tokens, routed
experts in the expected number of distinct ones, a DFlash draft's own weights and the target
head it borrows, K/V per request of its context; and
bench_graph_replay's CPU run reporting them beside the copy bandwidth."""

import json
import sys
from pathlib import Path

import pytest
import torch

from sglang_aux.srt.entrypoints.engine import Engine
from sglang_aux.test.bench_script import load_bench
from sglang_aux.test.ci.ci_register import register_cpu_ci
from sglang_aux.test.runtime_utils import tiny_checkpoint

register_cpu_ci(est_time=40, suite="default")

SCRIPTS = Path(__file__).resolve().parents[3] / "benchmark/spec_decode"


def _script(name: str):
    return load_bench(SCRIPTS / f"{name}.py")


@pytest.fixture(scope="module")
def engines(tmp_path_factory):
    root = tmp_path_factory.mktemp("ckpt")
    engines = {p: Engine(model_path=tiny_checkpoint(p, root), device="cpu", dtype="float32",
                         max_total_tokens=512, max_running_requests=2)
               for p in ("tiny-llama", "tiny-k3")}
    engines["dflash"] = Engine(model_path=tiny_checkpoint("tiny-llama", root), device="cpu",
                               dtype="float32", max_total_tokens=512, max_running_requests=2,
                               speculative_algorithm="DFLASH",
                               speculative_draft_model_path=tiny_checkpoint("tiny-llama-dflash",
                                                                            root))
    return engines


def _all_bytes(model) -> int:
    return sum(p.numel() * p.element_size() for p in model.parameters())


def test_tied_head_is_read_once_whole(engines):
    sb = _script("step_bandwidth")
    runner = engines["tiny-llama"].worker.model_runner
    cfg = runner.model_config.hf_config
    assert runner.model.lm_head_weight is runner.model.get_input_embeddings().weight
    # every weight once, the tied embedding as the head: the same for 1 and 64 tokens
    assert sb.weight_bytes(runner.model, cfg, 1) == _all_bytes(runner.model)
    assert sb.weight_bytes(runner.model, cfg, 64) == _all_bytes(runner.model)
    kv = 4 * 2 * 2 * 16 * 4  # layers x (K, V) x kv heads x head_dim x fp32
    assert sb.kv_bytes(runner.token_to_kv_pool, 3, 100, 4) == kv * 3 * 104


def test_a_draft_reads_its_own_weights_and_the_head_it_borrows(engines):
    sb = _script("step_bandwidth")
    worker = engines["dflash"].worker
    draft, target = worker.draft_runner.model, worker.target_runner.model
    head = target.lm_head_weight
    assert draft.lm_head_weight is head and draft.get_input_embeddings() is (
        target.get_input_embeddings())
    assert all(p is not head for p in draft.parameters())
    # tied (tiny-llama): the head once, whole, whatever the tokens
    want = _all_bytes(draft) + head.numel() * head.element_size()
    cfg = worker.draft_runner.model_config.hf_config
    assert sb.weight_bytes(draft, cfg, 1) == sb.weight_bytes(draft, cfg, 16) == want


def test_untied_embedding_rows_and_routed_experts(engines):
    sb = _script("step_bandwidth")
    runner = engines["tiny-k3"].worker.model_runner
    model, cfg = runner.model, runner.model_config.hf_config
    embed = model.get_input_embeddings().weight
    assert model.lm_head_weight is not embed
    row = embed.shape[1] * 4
    experts = sum(p.numel() * 4 for n, p in model.named_parameters() if ".experts." in n)
    rest = _all_bytes(model) - embed.numel() * 4 - experts
    # one token reaches top_k = 2 of 4 experts; 64 tokens all but (1/2)^64 of them
    assert sb.weight_bytes(model, cfg, 1) == int(rest + row + experts * 2 / 4)
    assert sb.weight_bytes(model, cfg, 64) == pytest.approx(rest + 64 * row + experts, rel=1e-9)


def test_copy_bandwidth_is_positive_and_finite():
    bw = _script("step_bandwidth").copy_bandwidth(torch.device("cpu"), nbytes=1 << 22, iters=3)
    assert 1e6 < bw < 1e15


def test_graph_replay_reports_bandwidth(tmp_path, monkeypatch):
    out = tmp_path / "replay.json"
    monkeypatch.setattr(sys, "argv", ["bench_graph_replay.py", "--device", "cpu", "--iters", "1",
                                      "--presets", "tiny-llama", "--decode-bs", "1",
                                      "--verify-bs", "1", "--context", "16", "--out", str(out)])
    _script("bench_graph_replay").main()
    rows = json.loads(out.read_text())["rows"]
    assert [r["graph"] for r in rows] == ["DECODE", "TARGET_VERIFY"]
    for r in rows:
        assert r["weight_bytes"] > 0 and r["kv_bytes"] > 0 and r["copy_tb_s"] > 0
        assert r["achieved_tb_s"] == pytest.approx(
            (r["weight_bytes"] + r["kv_bytes"]) / (r["replay_ms"] / 1e3) / 1e12)
        assert r["fraction_of_copy"] == pytest.approx(r["achieved_tb_s"] / r["copy_tb_s"])


def test_graph_replay_times_both_drafts(tmp_path, monkeypatch):
    """`--draft-algorithms dflash dspark`: each engine's verify and draft graphs, the DSPARK
    one reading its own (bigger: the Markov head) draft."""
    out = tmp_path / "replay.json"
    monkeypatch.setattr(sys, "argv", [
        "bench_graph_replay.py", "--device", "cpu", "--iters", "1", "--presets", "tiny-llama",
        "--decode-bs", "--verify-bs", "1", "--draft-bs", "1", "--context", "16",
        "--draft-algorithms", "dflash", "dspark", "--out", str(out)])
    _script("bench_graph_replay").main()
    rows = json.loads(out.read_text())["rows"]
    assert [(r["algorithm"], r["graph"]) for r in rows] == [
        ("dflash", "TARGET_VERIFY"), ("dflash", "DRAFT_BLOCK"),
        ("dspark", "TARGET_VERIFY"), ("dspark", "DRAFT_BLOCK")]
    draft = {r["algorithm"]: r for r in rows if r["graph"] == "DRAFT_BLOCK"}
    assert draft["dspark"]["weight_bytes"] > draft["dflash"]["weight_bytes"]
    assert draft["dspark"]["tokens_per_req"] == 3 and draft["dflash"]["tokens_per_req"] == 4


def test_graph_replay_times_a_draft_vocabulary(tmp_path, monkeypatch):
    """`--draft-vocabs 0 64`: engines whose draft head is the first 64 ids; their draft graphs
    read the 64-row head instead of the 320-row one, DSpark's markov_w2 rows likewise."""
    out = tmp_path / "replay.json"
    monkeypatch.setattr(sys, "argv", [
        "bench_graph_replay.py", "--device", "cpu", "--iters", "1", "--presets", "tiny-llama",
        "--decode-bs", "--verify-bs", "1", "--draft-bs", "1", "--context", "16",
        "--draft-vocabs", "0", "64", "--draft-algorithms", "dflash", "dspark", "--out", str(out)])
    _script("bench_graph_replay").main()
    rows = json.loads(out.read_text())["rows"]
    assert [(r["algorithm"], r["draft_vocab"], r["graph"]) for r in rows] == [
        (a, v, g) for a in ("dflash", "dspark") for v in (0, 64)
        for g in ("TARGET_VERIFY", "DRAFT_BLOCK")]
    draft = {(r["algorithm"], r["draft_vocab"]): r for r in rows if r["graph"] == "DRAFT_BLOCK"}
    # tiny-llama's head is its embedding (64 wide, fp32): read whole with the full head; with
    # the cut one, its 64 rows plus the block's 4 embedding rows (DSpark's block: 3 rows)
    assert draft["dflash", 0]["weight_bytes"] - draft["dflash", 64]["weight_bytes"] == \
        (320 - 64 - 4) * 64 * 4
    # DSpark's Markov loop reads markov_w2's 64 rows (rank 16, fp32) instead of 320
    assert draft["dspark", 0]["weight_bytes"] - draft["dspark", 64]["weight_bytes"] == \
        (320 - 64 - 3) * 64 * 4 + (320 - 64) * 16 * 4


if __name__ == "__main__":
    sys.exit(pytest.main([__file__, "-q"]))
