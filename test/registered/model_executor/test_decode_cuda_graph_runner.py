"""Step graphs (SPEC 3.2-3.3) on the CPU eager-replay backend.

Every captured size's aux output is a row slice of the runner's one aux storage; only a DFlash
target with an opting-in model gets that storage; replay equals eager at every captured size
and at a padded size, for the Kimi-K3-style and the Llama targets.
"""

import sys

import pytest
import torch
from torch import nn

from sglang_aux.srt.configs.model_config import ModelConfig
from sglang_aux.srt.forward_state.forward_batch_info import ForwardMode
from sglang_aux.srt.layers.aux_hidden_states import SupportsSharedAuxHiddenStates
from sglang_aux.srt.managers.schedule_batch import step_inputs
from sglang_aux.srt.model_executor.runner.epilogue import Epilogue
from sglang_aux.srt.model_executor.runner.forward_parts import ForwardParts
from sglang_aux.srt.model_executor.runner.step_prologue import StepPrologue
from sglang_aux.srt.model_executor.runner_utils.capture_sizes import get_capture_bs
from sglang_aux.srt.model_loader.loader import get_model
from sglang_aux.test.ci.ci_register import register_cpu_ci
from sglang_aux.test.runtime_utils import (
    eager_forward,
    make_runner,
    pipeline_stage,
    prefill_random,
    release,
    step_batch,
    tiny_checkpoint,
)

register_cpu_ci(est_time=60, suite="default")

BLOCK = 4
K3_AUX = [1, 3, 5]  # tiny-k3 has 6 layers: includes the last (output aggregation)
LLAMA_AUX = [0, 2, 3]  # tiny-llama has 4 layers


@pytest.fixture(scope="module")
def ckpts(tmp_path_factory):
    root = tmp_path_factory.mktemp("ckpt")
    return {p: tiny_checkpoint(p, root) for p in ("tiny-k3", "tiny-llama", "tiny-qwen3")}


def _dflash_runner(path, aux, **kw):
    kw.setdefault("cuda_graph_bs_decode", [8, 32, 64])
    return make_runner(path, aux_layer_ids=aux, speculative_algorithm="DFLASH",
                       max_running_requests=64, max_total_tokens=8192, context_length=256, **kw)


def _steps(runner, mode=ForwardMode.TARGET_VERIFY, width=BLOCK):
    """Register `mode` steps whose block tokens are random (fixed per row), capturing them."""
    drafts = torch.randint(0, runner.model_config.hf_config.vocab_size, (64, max(width - 1, 0)),
                           generator=torch.Generator().manual_seed(width))
    runner.init_forwards(ForwardParts(mode, width, StepPrologue(
        block_tokens=lambda bs: drafts[:bs])))


def _aux_outputs(runner):
    g = runner.step_graphs
    return {x.step_bs: out.aux_hidden_states for x, out in zip(g.layouts, g.outputs, strict=True)}


def test_capture_sizes_share_row_slices_of_one_buffer(ckpts):
    runner = _dflash_runner(ckpts["tiny-k3"], K3_AUX)
    _steps(runner)
    buf = runner.aux_storage.buffer
    hidden = runner.model_config.hf_config.hidden_size
    assert buf.shape == (64 * BLOCK, len(K3_AUX) * hidden)
    for bs, aux in _aux_outputs(runner).items():
        assert aux.data_ptr() == buf.data_ptr(), f"bs {bs} does not write the shared buffer"
        assert aux.shape == (bs * BLOCK, buf.shape[1])
    other = _dflash_runner(ckpts["tiny-k3"], K3_AUX)
    _steps(other)
    assert other.aux_storage.buffer.data_ptr() != buf.data_ptr()
    # recapture reuses the runner's storage
    runner.step_graphs.capture()
    assert all(a.data_ptr() == buf.data_ptr() for a in _aux_outputs(runner).values())


def test_per_graph_path_when_sharing_disabled(ckpts):
    runner = _dflash_runner(ckpts["tiny-k3"], K3_AUX, disable_shared_aux_buffer=True)
    _steps(runner)
    assert runner.aux_storage is None
    ptrs = {a.untyped_storage().data_ptr() for a in _aux_outputs(runner).values()}
    assert len(ptrs) == 3, "each graph should own its aux output on the baseline path"


@pytest.mark.parametrize(
    "case",
    ["eagle3", "none", "draft", "pp2", "no_layers"],
)
def test_who_gets_no_shared_buffer(ckpts, case):
    path, aux, kw = ckpts["tiny-k3"], K3_AUX, {"speculative_algorithm": "DFLASH"}
    if case == "eagle3":
        kw["speculative_algorithm"] = "EAGLE3"
    elif case == "none":
        kw["speculative_algorithm"] = "NONE"
    elif case == "no_layers":
        aux = None
    runner = make_runner(path, aux_layer_ids=aux, max_total_tokens=4096, context_length=256, **kw)
    if case == "draft":
        runner.is_draft_worker = True
    with pipeline_stage(2 if case == "pp2" else 1):  # the model's own pipeline check
        assert runner.get_aux_hidden_states_width() == 0


@pytest.mark.parametrize("model,aux", [("tiny-k3", K3_AUX), ("tiny-llama", LLAMA_AUX)])
def test_dflash_targets_that_opt_in_get_width(ckpts, model, aux):
    runner = _dflash_runner(ckpts[model], aux)
    assert runner.get_aux_hidden_states_width() == len(aux) * 64


class NotOptedIn(nn.Module):
    """A target without SupportsSharedAuxHiddenStates (the contract a model opts in with)."""

    def __init__(self, inner: nn.Module):
        super().__init__()
        self.inner = inner

    def set_dflash_layers_to_capture(self, layer_ids: list[int]) -> None:
        self.inner.set_dflash_layers_to_capture(layer_ids)

    def forward(self, input_ids, positions, forward_batch):
        return self.inner.forward(input_ids, positions, forward_batch)


def test_model_that_does_not_opt_in_falls_back(ckpts):
    path = ckpts["tiny-llama"]
    model = NotOptedIn(get_model(ModelConfig.from_pretrained(path), "cpu"))
    assert not isinstance(model, SupportsSharedAuxHiddenStates)
    runner = make_runner(path, aux_layer_ids=LLAMA_AUX, model=model,
                         speculative_algorithm="DFLASH", max_total_tokens=4096,
                         context_length=256, cuda_graph_bs_decode=[2, 4])
    assert runner.get_aux_hidden_states_width() == 0
    _steps(runner)
    assert runner.aux_storage is None
    outs = _aux_outputs(runner)
    assert len({a.untyped_storage().data_ptr() for a in outs.values()}) == 2
    reqs = prefill_random(runner, [6, 9, 5])
    fb = step_batch(runner, reqs, ForwardMode.TARGET_VERIFY, BLOCK)
    assert fb.prepared_graph is not None
    replayed = runner.forward(fb).aux_hidden_states.clone()
    torch.testing.assert_close(replayed, eager_forward(runner, fb).aux_hidden_states,
                               rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("model,aux", [("tiny-k3", K3_AUX), ("tiny-llama", LLAMA_AUX),
                                       ("tiny-qwen3", LLAMA_AUX)])
@pytest.mark.parametrize("mode,width", [(ForwardMode.TARGET_VERIFY, BLOCK),
                                        (ForwardMode.DECODE, 1)])
def test_replay_equals_eager_at_every_size_and_padded(ckpts, model, aux, mode, width):
    runner = _dflash_runner(ckpts[model], aux, cuda_graph_bs_decode=[1, 2, 4, 8])
    _steps(runner, mode, width)
    for bs in [1, 2, 3, 4, 5, 8]:  # 3 and 5 pad to 4 and 8
        reqs = prefill_random(runner, [7 + 3 * i for i in range(bs)], seed=bs)
        fb = step_batch(runner, reqs, mode, width)
        assert fb.prepared_graph is not None and fb.batch_size == bs
        replayed = runner.forward(fb)
        logits, aux_out = replayed.next_token_logits.clone(), replayed.aux_hidden_states.clone()
        # the same inputs (the graph's prologue derived them in its views) run eagerly
        eager = eager_forward(runner, fb)
        torch.testing.assert_close(logits, eager.next_token_logits, rtol=1e-4, atol=1e-4)
        torch.testing.assert_close(aux_out, eager.aux_hidden_states, rtol=1e-4, atol=1e-4)
        assert logits.shape[0] == bs * width
        release(runner, reqs)


def test_padded_rows_are_inert(ckpts):
    runner = _dflash_runner(ckpts["tiny-k3"], K3_AUX, cuda_graph_bs_decode=[4])
    _steps(runner)
    reqs = prefill_random(runner, [5, 9, 6])
    fb = step_batch(runner, reqs, ForwardMode.TARGET_VERIFY, BLOCK)
    pool = runner.token_to_kv_pool
    untouched = torch.ones(pool.size + 1, dtype=torch.bool)
    untouched[0] = False
    for r in reqs:
        untouched[runner.req_to_token_pool.req_to_token[r.req_pool_idx, : r.kv_reserved]] = False
    before = pool.k_buffer[0][untouched].clone()
    runner.forward(fb)
    assert runner.step_graphs.static[0].out_cache_loc[3 * BLOCK:].eq(0).all()
    assert torch.equal(pool.k_buffer[0][untouched], before), "padding wrote a live KV slot"


def test_forward_parts_are_checked(ckpts):
    with pytest.raises(ValueError, match="step prologue"):
        ForwardParts(ForwardMode.TARGET_VERIFY, BLOCK)
    with pytest.raises(ValueError, match="TARGET_VERIFY epilogue for EXTEND"):
        ForwardParts(ForwardMode.EXTEND, epilogue=Epilogue(ForwardMode.TARGET_VERIFY,
                                                           lambda fb, out: None))
    runner = _dflash_runner(ckpts["tiny-k3"], K3_AUX, cuda_graph_bs_decode=[2])
    with pytest.raises(ValueError, match="as many tokens per request as the step mode"):
        runner.init_forwards(ForwardParts(ForwardMode.TARGET_VERIFY, BLOCK, StepPrologue()),
                             ForwardParts(ForwardMode.MIXED, 2, StepPrologue()))
    with pytest.raises(ValueError, match="TARGET_VERIFY forwards need tokens per request"):
        runner.prepare(step_inputs([], ForwardMode.TARGET_VERIFY, BLOCK))  # none registered
    _steps(runner)
    with pytest.raises(RuntimeError, match="once"):
        _steps(runner)
    with pytest.raises(ValueError, match="needs requests"):
        runner.prepare(step_inputs([], ForwardMode.TARGET_VERIFY, BLOCK))


def test_capture_bs_defaults_follow_sglang():
    spec = get_capture_bs(max_bs=48, speculative=True)
    assert spec[:8] == list(range(1, 9)) and spec[8:20] == list(range(10, 33, 2))
    assert spec[20:] == [36, 40, 44, 48][1:] or spec[-1] == 48
    assert get_capture_bs(max_bs=50, speculative=True)[-2:] == [48, 50]
    assert get_capture_bs(max_bs=256, speculative=True)[-3:] == [240, 248, 256]
    assert get_capture_bs(max_bs=8, speculative=True, override=[4, 2, 4]) == [2, 4]
    with pytest.raises(ValueError):
        get_capture_bs(max_bs=0, speculative=True)


if __name__ == "__main__":
    sys.exit(pytest.main([__file__, "-q"]))
