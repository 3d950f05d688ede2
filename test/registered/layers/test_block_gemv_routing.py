"""The block GEMV candidate routed into a model (`benchmark/spec_decode/block_gemv_routing.py`)
on the CPU (`SGLANG_AUX_FUSED_KERNELS=force`, Triton's interpreter): a tiny Llama's and Qwen2's
8-, 16- and 32-row steps (verify steps of one and two requests, a decode step of eight) give
the unrouted logits and aux states in fp32 with every projection on the candidate (fused norm +
qkv (+ bias), o_proj, fused norm + gate_up, down, the LM head), one-token and wider steps stay
on their paths, the patches are gone after the context, and `bench_graph_replay.py
--block-gemv` reports the routed decode and verify graphs beside the plain ones."""

import os

# NOTE: must precede any @triton.jit definition, i.e. any import of the layers.
os.environ["TRITON_INTERPRET"] = "1"

import json  # noqa: E402
import sys  # noqa: E402
from collections import Counter  # noqa: E402
from pathlib import Path  # noqa: E402

import pytest  # noqa: E402
import torch  # noqa: E402

# The scripts import their siblings by name, as when run from their folder.
sys.path.insert(0, str(Path(__file__).resolve().parents[3] / "benchmark/spec_decode"))

import bench_graph_replay  # noqa: E402
from block_gemv_routing import route_block_gemv  # noqa: E402

from sglang_aux.srt.forward_state.forward_batch_info import ForwardMode  # noqa: E402
from sglang_aux.srt.layers import linear, logits_processor  # noqa: E402
from sglang_aux.srt.layers.triton_ops.dispatch import ENV_VAR  # noqa: E402
from sglang_aux.srt.models import llama  # noqa: E402
from sglang_aux.test import runtime_utils as rt  # noqa: E402
from sglang_aux.test.ci.ci_register import register_cpu_ci  # noqa: E402
from sglang_aux.test.hf_checkpoints import save_tiny_qwen2  # noqa: E402

register_cpu_ci(est_time=120, suite="default")


@pytest.fixture(scope="module")
def checkpoints(tmp_path_factory):
    """Tiny Llama, and tiny Qwen2 (q/k/v biases) where transformers can save it."""
    root = tmp_path_factory.mktemp("ckpt")
    paths = {"tiny-llama": rt.tiny_checkpoint("tiny-llama", root)}
    try:
        paths["tiny-qwen2"] = save_tiny_qwen2(root / "tiny-qwen2")
    except ImportError:
        pass
    return paths


def _step(path, mode, width, prompts):
    """(logits, aux states) of a prefill of `prompts`, then a step of `width` tokens each."""
    runner = rt.make_runner(path, aux_layer_ids=[0, 2], max_total_tokens=1024,
                         max_running_requests=8, context_length=256)
    reqs = rt.prefill_random(runner, prompts, seed=3)
    res = rt.eager_forward(runner, rt.fixed_batch(runner, reqs, mode, width, seed=width))
    return (res.next_token_logits, res.aux_hidden_states), runner.model_config.num_layers


@pytest.mark.parametrize("preset", ["tiny-llama", "tiny-qwen2"])
@pytest.mark.parametrize("mode,width,prompts,routed_rows", [
    (ForwardMode.TARGET_VERIFY, 16, [40], 16), (ForwardMode.TARGET_VERIFY, 8, [40], 8),
    (ForwardMode.DECODE, 1, [40], None), (ForwardMode.DECODE, 1, [33] * 8, 8),
    (ForwardMode.TARGET_VERIFY, 16, [40, 37], 32),
    (ForwardMode.TARGET_VERIFY, 16, [40, 37, 35], None)])
def test_routed_step_equals_the_plain_one(checkpoints, monkeypatch, preset, mode, width,
                                          prompts, routed_rows):
    """Prefill and step inside the routing: the prefill's projections (more than 32 rows)
    stay on their path, its LM head over each prompt's last token too unless there are 2 to
    32 of them."""
    monkeypatch.setenv(ENV_VAR, "force")
    if preset not in checkpoints:
        pytest.skip("tiny-qwen2 is saved by transformers")
    path = checkpoints[preset]
    ref, layers = _step(path, mode, width, prompts)
    sites = (linear._linear, llama.norm_linear, logits_processor.lm_head_logits)
    with route_block_gemv() as routed:
        got, _ = _step(path, mode, width, prompts)
    assert (linear._linear, llama.norm_linear, logits_processor.lm_head_logits) == sites
    for r, g in zip(ref, got, strict=True):
        assert r.abs().max() > 0
        # fp32: sum order, and the fused norm's one rounding
        torch.testing.assert_close(g, r, atol=2e-4, rtol=1e-4)
    # the prefill's LM head over the prompts' last tokens, when 2 to 32 of them
    expected = Counter() if len(prompts) == 1 else Counter({("lm_head", len(prompts)): 1})
    if routed_rows is not None:  # o_proj, down; the two fused norms; the head over every token
        expected += Counter({("linear", routed_rows): 2 * layers,
                             ("norm_linear", routed_rows): 2 * layers,
                             ("lm_head", routed_rows): 1})
    assert routed == expected


def test_graph_replay_times_the_routed_graphs(tmp_path, monkeypatch):
    monkeypatch.setenv(ENV_VAR, "force")
    out = tmp_path / "replay.json"
    monkeypatch.setattr(sys, "argv", ["bench_graph_replay.py", "--device", "cpu", "--iters", "1",
                                      "--presets", "tiny-llama", "--decode-bs", "2",
                                      "--verify-bs", "1", "--draft-bs", "1", "--context", "16",
                                      "--block-gemv", "--out", str(out)])
    bench_graph_replay.main()
    rows = json.loads(out.read_text())["rows"]
    assert [r["graph"] for r in rows] == [
        "DECODE", "DECODE+block_gemv", "TARGET_VERIFY", "DRAFT_BLOCK",
        "TARGET_VERIFY+block_gemv", "DRAFT_BLOCK+block_gemv"]
    pairs = ((rows[0], rows[1], 2), (rows[2], rows[4], rows[4]["tokens_per_req"]),
             (rows[3], rows[5], rows[5]["tokens_per_req"]))
    for plain, routed, m in pairs:
        # m: the decode's 2 requests, the block (a DFLASH engine's calls: its verify and
        # draft graphs' together)
        calls = routed["routed_calls"]
        assert {f"linear/{m}", f"norm_linear/{m}", f"lm_head/{m}"} <= set(calls), calls
        assert "routed_calls" not in plain and routed["replay_ms"] > 0
    # the draft's block: its own layers, the target's head it borrows
    assert rows[3]["tokens_per_req"] == rows[2]["tokens_per_req"]
    assert 0 < rows[3]["weight_bytes"] < rows[2]["weight_bytes"]


if __name__ == "__main__":
    sys.exit(pytest.main([__file__, "-q"]))
