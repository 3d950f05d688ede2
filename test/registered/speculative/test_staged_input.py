"""Staged MXFP8 aux projection inside DFlash prefill (SPEC 3.6): the K3 target streams each aux
state into the draft fc's MXFP8 input; the result is bitwise the concat path's, and DFlash
output does not change."""

import logging
import sys

import pytest
import torch

from sglang_aux.srt.entrypoints.engine import Engine
from sglang_aux.srt.layers.quantization.mxfp8_gemm_choice import SLICED_CUBLAS_MIN_M
from sglang_aux.test.ci.ci_register import register_cpu_ci
from sglang_aux.test.runtime_utils import eager_forward, extend_batch, release, tiny_checkpoint

register_cpu_ci(est_time=45, suite="default")

PROMPTS = ["Natalia sold clips to 48 of her friends in April, and then she sold half as many",
           "The quick brown fox", "12 + 30 ="]
GREEDY = {"temperature": 0, "max_new_tokens": 12, "ignore_eos": True}


@pytest.fixture
def device():
    """The device under test; test_staged_input_cuda.py overrides it."""
    return "cpu"


def _engine(tmp_path, device, target="tiny-k3", **kw):
    return Engine(model_path=tiny_checkpoint(target, tmp_path), device=device,
                  speculative_algorithm="DFLASH",
                  speculative_draft_model_path=tiny_checkpoint(f"{target}-dflash", tmp_path),
                  speculative_draft_fc_quantization="mxfp8", max_total_tokens=4096,
                  cuda_graph_bs_decode=[1, 2, 4], **kw)


def _prefill_batch(worker, prompts):
    return extend_batch(worker.target_runner, prompts)


# 98 rows: the production GEMM for M; 1,095: from SLICED_CUBLAS_MIN_M, one aux slice per cuBLAS
# chunk, also in fc_forward's concat call
@pytest.mark.parametrize("length", [40, 370])
def test_staged_projection_is_bitwise_the_concat_path(tmp_path, device, length):
    worker = _engine(tmp_path, device).worker
    draft = worker.draft_runner.model
    vocab = worker.target_runner.model_config.hf_config.vocab_size
    ids = [(vocab - 70 + i) % vocab for i in range(length)]
    prompts = [ids, ids[:length - 17], ids[5:]]
    reqs, fb = _prefill_batch(worker, prompts)
    fb.aux_projection = draft.new_staged_projection(fb.num_tokens, torch.float32)
    sliced = fb.num_tokens >= SLICED_CUBLAS_MIN_M
    assert sliced == (length > 100)
    hidden = worker.target_runner.model_config.hf_config.hidden_size
    assert fb.aux_projection.candidate == (f"cublas_kc{hidden}" if sliced else None)
    staged_out = eager_forward(worker.target_runner, fb)
    assert staged_out.aux_hidden_states is None  # no packed aux tensor on the staged path
    staged = fb.aux_projection.result().clone()
    with pytest.raises(RuntimeError, match="already read"):
        fb.aux_projection.result()
    release(worker.target_runner, reqs)
    reqs, fb = _prefill_batch(worker, prompts)
    concat_out = eager_forward(worker.target_runner, fb)
    concat = draft.fc_forward(concat_out.aux_hidden_states)
    assert staged.shape == (fb.num_tokens, draft.fc.out_features)
    assert torch.equal(staged, concat)
    assert torch.equal(staged_out.next_token_logits, concat_out.next_token_logits)
    release(worker.target_runner, reqs)


def test_dflash_output_unchanged_with_staged_prefill(tmp_path, device, caplog):
    target_only = Engine(model_path=tiny_checkpoint("tiny-k3", tmp_path), device=device,
                         max_total_tokens=4096, cuda_graph_bs_decode=[1, 2, 4])
    ref = target_only.generate(PROMPTS, GREEDY)
    with caplog.at_level(logging.INFO, logger="sglang_aux.srt.speculative.draft_context"):
        staged = _engine(tmp_path, device, dflash_staged_projection_min_tokens=8)
        calls = []
        context = staged.worker.draft_context
        make = context.staged_projection_for
        context.staged_projection_for = lambda n: calls.append(make(n)) or calls[-1]
        outs = staged.generate(PROMPTS, GREEDY)
        staged.generate(PROMPTS, GREEDY)
    assert any(c is not None for c in calls), "the staged path never ran"
    lines = [r for r in caplog.records if "Staged MXFP8 aux projection active" in r.message]
    assert len(lines) == 1, "the activation is logged exactly once"
    plain = _engine(tmp_path, device).generate(PROMPTS, GREEDY)  # threshold 1024: concat path
    for a, b, c in zip(ref, outs, plain, strict=True):
        assert a["output_ids"] == b["output_ids"] == c["output_ids"]


def test_llama_target_keeps_the_list_path(tmp_path, device):
    worker = _engine(tmp_path, device, "tiny-llama", dflash_staged_projection_min_tokens=1).worker
    assert worker.draft_context.staged_projection_for(64) is None
    reqs, fb = _prefill_batch(worker, [[1, 2, 3, 4]])
    fb.aux_projection = worker.draft_runner.model.new_staged_projection(4, torch.float32)
    with pytest.raises(ValueError, match="cannot stage"):
        eager_forward(worker.target_runner, fb)
    release(worker.target_runner, reqs)


def test_no_staging_without_an_mxfp8_fc(tmp_path, device):
    engine = Engine(model_path=tiny_checkpoint("tiny-k3", tmp_path), device=device,
                    speculative_algorithm="DFLASH",
                    speculative_draft_model_path=tiny_checkpoint("tiny-k3-dflash", tmp_path),
                    max_total_tokens=4096, cuda_graph_bs_decode=[1],
                    dflash_staged_projection_min_tokens=1)
    assert engine.worker.draft_context.staged_projection_for(4096) is None


if __name__ == "__main__":
    sys.exit(pytest.main([__file__, "-q"]))
