"""SGLang's opt-in to the shared aux buffer, in both spellings: a DFlash target whose model
implements only `get_aux_hidden_states_width()` (SGLang 0.5.23's `_SupportsPackedAuxHiddenStates`)
or only `get_packed_aux_hidden_size()` shares, with the width it reports; a model with neither
keeps the list path; a model with both must agree. Every seam is imported from the module path
SGLang gives it, as code written against SGLang would."""

import sys

import pytest
import torch
from torch import nn

from sglang_aux.srt.batch_overlap.two_batch_overlap import split_batch
from sglang_aux.srt.configs.model_config import ModelConfig
from sglang_aux.srt.layers.aux_hidden_states import (
    AuxHiddenStatePacker,
    SupportsSharedAuxHiddenStates,
)
from sglang_aux.srt.model_executor.forward_batch_info import ForwardBatch, ForwardMode
from sglang_aux.srt.model_executor.model_runner_components.misc_utils import (
    resolve_aux_hidden_states_width,
)
from sglang_aux.srt.model_executor.runner.decode_cuda_graph_runner import DecodeCudaGraphRunner
from sglang_aux.srt.model_executor.runner.forward_parts import ForwardParts
from sglang_aux.srt.model_executor.runner.step_prologue import StepPrologue
from sglang_aux.srt.model_executor.runner_utils.buffers import DecodeInputBuffers
from sglang_aux.srt.model_loader.loader import get_model
from sglang_aux.srt.speculative.spec_info import SpeculativeAlgorithm
from sglang_aux.test.ci.ci_register import register_cpu_ci
from sglang_aux.test.runtime_utils import (
    eager_forward,
    make_runner,
    prefill_random,
    step_batch,
    tiny_checkpoint,
)

register_cpu_ci(est_time=20, suite="default")

BLOCK = 4
AUX = [0, 2]
HIDDEN = 64  # tiny-llama


class Wrapped(nn.Module):
    """The tiny Llama, forwarding only what a runner calls."""

    def __init__(self, inner: nn.Module):
        super().__init__()
        self.inner = inner

    def set_dflash_layers_to_capture(self, layer_ids: list[int]) -> None:
        self.inner.set_dflash_layers_to_capture(layer_ids)

    def forward(self, input_ids, positions, forward_batch):
        return self.inner.forward(input_ids, positions, forward_batch)


class SGLangSpelling(Wrapped):
    def get_aux_hidden_states_width(self) -> int:
        return self.inner.get_packed_aux_hidden_size()


class OurSpelling(Wrapped):
    def get_packed_aux_hidden_size(self) -> int:
        return self.inner.get_packed_aux_hidden_size()


class Disagreeing(SGLangSpelling):
    def get_packed_aux_hidden_size(self) -> int:
        return 1


@pytest.fixture(scope="module")
def ckpt(tmp_path_factory):
    return tiny_checkpoint("tiny-llama", tmp_path_factory.mktemp("ckpt"))


def _runner(ckpt: str, wrapper: type[Wrapped]):
    model = wrapper(get_model(ModelConfig.from_pretrained(ckpt), "cpu"))
    return make_runner(ckpt, aux_layer_ids=AUX, model=model, speculative_algorithm="DFLASH",
                       max_total_tokens=2048, context_length=256, cuda_graph_bs_decode=[2, 4])


@pytest.mark.parametrize("wrapper", [SGLangSpelling, OurSpelling])
def test_either_spelling_shares_the_aux_buffer(ckpt, wrapper):
    runner = _runner(ckpt, wrapper)
    assert runner.get_aux_hidden_states_width() == len(AUX) * HIDDEN
    runner.init_forwards(ForwardParts(ForwardMode.TARGET_VERIFY, BLOCK, StepPrologue()))
    shared = runner.aux_storage.buffer
    assert shared.shape[1] == len(AUX) * HIDDEN
    fb = step_batch(runner, prefill_random(runner, [5, 8, 6]), ForwardMode.TARGET_VERIFY,
                    BLOCK)
    assert fb.prepared_graph is not None
    replayed = runner.forward(fb).aux_hidden_states
    assert replayed.untyped_storage().data_ptr() == shared.untyped_storage().data_ptr()
    torch.testing.assert_close(replayed.clone(), eager_forward(runner, fb).aux_hidden_states)


def test_neither_spelling_keeps_the_list_path(ckpt):
    runner = _runner(ckpt, Wrapped)
    assert runner.get_aux_hidden_states_width() == 0
    runner.init_forwards(ForwardParts(ForwardMode.TARGET_VERIFY, BLOCK, StepPrologue()))
    assert runner.aux_storage is None


@pytest.mark.parametrize("family", [SpeculativeAlgorithm.DFLASH, SpeculativeAlgorithm.DSPARK])
def test_only_dflash_family_targets_share_and_two_widths_are_refused(ckpt, family):
    model = SGLangSpelling(get_model(ModelConfig.from_pretrained(ckpt), "cpu"))
    model.set_dflash_layers_to_capture(AUX)
    dflash = family
    assert resolve_aux_hidden_states_width(model=model, spec_algorithm=dflash,
                                           is_draft_worker=False) == len(AUX) * HIDDEN
    assert resolve_aux_hidden_states_width(model=model, spec_algorithm=dflash,
                                           is_draft_worker=True) == 0
    assert resolve_aux_hidden_states_width(model=model, spec_algorithm=SpeculativeAlgorithm.EAGLE3,
                                           is_draft_worker=False) == 0
    both = Disagreeing(model.inner)
    with pytest.raises(ValueError, match="two aux widths"):
        resolve_aux_hidden_states_width(model=both, spec_algorithm=dflash, is_draft_worker=False)


def test_capture_prepare_hands_each_graph_its_rows_of_the_one_aux_buffer(ckpt):
    runner = _runner(ckpt, OurSpelling)
    runner.init_forwards(ForwardParts(ForwardMode.TARGET_VERIFY, BLOCK, StepPrologue()))
    graphs = runner.step_graphs
    assert isinstance(graphs, DecodeCudaGraphRunner)
    assert isinstance(graphs.buffers, DecodeInputBuffers)
    assert isinstance(runner.model, SupportsSharedAuxHiddenStates)
    shared = runner.aux_storage.buffer
    for layout in graphs.layouts:
        fb = graphs.capture_prepare(layout)
        assert isinstance(fb, ForwardBatch) and fb.forward_mode == ForwardMode.TARGET_VERIFY
        rows = fb.aux_hidden_states_buffer
        assert rows.shape == (layout.num_tokens, len(AUX) * HIDDEN)
        assert rows.data_ptr() == shared.data_ptr()
        logits = fb.next_token_logits_buffer
        assert logits.data_ptr() == graphs.buffers.next_token_logits_buffer.data_ptr()
        # the packer writes the model's captures into the caller's rows (`out=`)
        packer = AuxHiddenStatePacker.for_batch(fb, len(AUX))
        for i in range(len(AUX)):
            packer.append(torch.full((layout.num_tokens, HIDDEN), float(i)))
        assert packer.finalize() is rows and rows[:, HIDDEN:].eq(1).all()
        # two-batch overlap: the children never see the parent's rows
        assert all(child.aux_hidden_states_buffer is None for child in split_batch(fb))


if __name__ == "__main__":
    sys.exit(pytest.main([__file__, "-q"]))
