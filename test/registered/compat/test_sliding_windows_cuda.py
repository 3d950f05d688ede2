"""Sliding windows on the GPU (run on the H200): a transformers-saved tiny Qwen3 with full and
sliding layers, on Triton attention and real CUDA graphs. Decode and verify graph replay equal
eager at every captured size and at padded ones; the Engine's greedy tokens (graphs on) equal
transformers' in fp32; a DFlash draft with a causal sliding layer (its DRAFT_BLOCK graph) stays
lossless. Prompts are longer than the window throughout."""

import json
import sys
from pathlib import Path

import pytest
import torch

from sglang_aux.srt.configs.presets import MASK_TOKEN_ID
from sglang_aux.srt.entrypoints.engine import Engine
from sglang_aux.srt.forward_state.forward_batch_info import ForwardMode
from sglang_aux.srt.model_executor.runner.forward_parts import ForwardParts
from sglang_aux.srt.model_executor.runner.step_prologue import StepPrologue
from sglang_aux.srt.models.weight_utils import init_random_weights
from sglang_aux.test.ci.ci_register import register_cuda_ci
from sglang_aux.test.hf_checkpoints import hf_greedy, save_hf_model
from sglang_aux.test.kernel_checks import REAL_TRITON_ON_CUDA
from sglang_aux.test.runtime_utils import (
    eager_forward,
    make_runner,
    prefill_random,
    release,
    step_batch,
)
from sglang_aux.tools.dflash_training.export import draft_config, new_draft, write_draft

register_cuda_ci(est_time=120, suite="default")

pytestmark = REAL_TRITON_ON_CUDA

WINDOW = 16
BLOCK = 8
CAPTURE = [1, 2, 4, 8]
LAYER_TYPES = ["sliding_attention", "full_attention", "sliding_attention", "sliding_attention"]
PROMPTS = [list(range(5, 75)), list(range(80, 103)), [3, 9, 27, 81, 30, 90, 17, 51, 40] * 4]
GREEDY = {"temperature": 0, "max_new_tokens": 24, "ignore_eos": True}
ENGINE = dict(device="cuda", dtype="float32", max_total_tokens=8192, context_length=512,
              cuda_graph_bs_decode=[1, 2, 4])


@pytest.fixture(scope="module")
def target(tmp_path_factory):
    out = tmp_path_factory.mktemp("qwen3-sliding")
    hf_model = save_hf_model("Qwen3ForCausalLM", out, max_position_embeddings=1024,
                             use_sliding_window=True, sliding_window=WINDOW, max_window_layers=0,
                             layer_types=LAYER_TYPES,
                             rope_parameters={"rope_type": "default", "rope_theta": 1e6})
    return str(out), hf_model


@pytest.mark.parametrize("mode,width", [(ForwardMode.TARGET_VERIFY, BLOCK),
                                        (ForwardMode.DECODE, 1)])
def test_cuda_graph_replay_equals_eager(target, mode, width):
    runner = make_runner(target[0], aux_layer_ids=[0, 2], device="cuda",
                         speculative_algorithm="DFLASH", max_running_requests=16,
                         max_total_tokens=8192, context_length=512, cuda_graph_bs_decode=CAPTURE)
    drafts = torch.randint(0, runner.model_config.hf_config.vocab_size, (16, width - 1),
                           generator=torch.Generator().manual_seed(width)).cuda()
    runner.init_forwards(ForwardParts(mode, width, StepPrologue(
        block_tokens=lambda bs: drafts[:bs])))
    gr = runner.step_graphs
    assert type(gr.backend).__name__ == "CudaGraphBackend"
    for bs in [*CAPTURE, 3, 6]:  # 3 and 6 replay padded graphs
        reqs = prefill_random(runner, [3 * WINDOW + 7 * i for i in range(bs)], seed=bs)
        fb = step_batch(runner, reqs, mode, width)
        assert fb.prepared_graph is not None
        logits = runner.forward(fb).next_token_logits.clone()
        eager = eager_forward(runner, fb)
        assert torch.isfinite(logits).all()
        torch.testing.assert_close(logits, eager.next_token_logits, rtol=1e-4, atol=1e-4)
        release(runner, reqs)


def test_engine_greedy_equals_transformers(target):
    path, hf_model = target
    engine = Engine(model_path=path, **ENGINE)
    outs = engine.generate(input_ids=PROMPTS, sampling_params=GREEDY)
    for prompt, out in zip(PROMPTS, outs, strict=True):
        assert out["output_ids"] == hf_greedy(hf_model, prompt, GREEDY["max_new_tokens"])


def test_sliding_draft_is_lossless(target, tmp_path):
    path, _ = target
    target_cfg = json.loads((Path(path) / "config.json").read_text())
    config = {**draft_config(target_cfg, num_layers=2, num_aux_layers=2, block_size=BLOCK,
                             mask_token_id=MASK_TOKEN_ID),
              "layer_types": ["sliding_attention", "full_attention"], "sliding_window": WINDOW}
    draft = new_draft(config, torch.device("cpu"), seed=0)
    init_random_weights(draft, seed=1)
    write_draft(draft, config, tmp_path / "draft", card="random sliding-window draft\n")
    ref = Engine(model_path=path, **ENGINE).generate(input_ids=PROMPTS, sampling_params=GREEDY)
    spec = Engine(model_path=path, speculative_algorithm="DFLASH",
                  speculative_draft_model_path=str(tmp_path / "draft"), **ENGINE)
    assert spec.worker.draft_runner.step_graphs is not None
    outs = spec.generate(input_ids=PROMPTS, sampling_params=GREEDY)
    for r, s in zip(ref, outs, strict=True):
        assert s["output_ids"] == r["output_ids"]
        assert s["meta_info"]["spec_verify_ct"] > 0


if __name__ == "__main__":
    sys.exit(pytest.main([__file__, "-q"]))
