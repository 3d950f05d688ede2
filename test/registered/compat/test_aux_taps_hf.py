"""Aux taps of the Llama family against transformers' `output_hidden_states`, on models saved by
`save_pretrained`.

The index convention: aux id i means the output of decoder layer i (0-based), which is
transformers' `hidden_states[i + 1]` (`hidden_states[0]` is the embedding output). SGLang
implements it by capturing `hidden + residual` entering layer i + 1
(`layers_to_capture = [i + 1 for i in ids]`); the DFlash drafts were trained on
`hidden_states[i + 1]` for their `target_layer_ids` (DFlash's `extract_context_feature`,
offset 1), so a draft reads the states it was trained on only at this convention. The one
exception: transformers' last entry has the final norm applied, while a tap of the last
layer is the stream before it (published drafts never read the last layer).
"""

import sys

import pytest
import torch

from sglang_aux.srt.configs.dflash_config import build_target_layer_ids
from sglang_aux.srt.entrypoints.engine import Engine
from sglang_aux.test.ci.ci_register import register_cpu_ci
from sglang_aux.test.hf_checkpoints import save_hf_model
from sglang_aux.test.runtime_utils import make_runner, prefill

register_cpu_ci(est_time=40, suite="default")

LAYERS = 6
PROMPT = [17, 101, 33, 250, 4, 99, 7]
ARCHS = ["LlamaForCausalLM", "Qwen2ForCausalLM", "Qwen3ForCausalLM"]


@pytest.fixture(scope="module")
def saved(tmp_path_factory):
    out = {}
    for arch in ARCHS:
        folder = tmp_path_factory.mktemp(arch)
        model = save_hf_model(arch, folder, num_hidden_layers=LAYERS)
        with torch.no_grad():
            states = model(torch.tensor([PROMPT]), output_hidden_states=True).hidden_states
        out[arch] = (str(folder), [s[0] for s in states], model.model.norm)
    return out


def _taps(aux: torch.Tensor, ids: list[int]) -> dict[int, torch.Tensor]:
    return dict(zip(ids, aux.chunk(len(ids), dim=-1), strict=True))


@pytest.mark.parametrize("arch", ARCHS)
def test_every_layer_tap_is_transformers_hidden_state_after_it(saved, arch):
    folder, states, final_norm = saved[arch]
    ids = list(range(LAYERS))
    runner = make_runner(folder, aux_layer_ids=ids)
    _, out = prefill(runner, [PROMPT])
    taps = _taps(out.aux_hidden_states, ids)
    for i in ids[:-1]:
        torch.testing.assert_close(taps[i], states[i + 1], atol=1e-4, rtol=1e-4,
                                   msg=lambda m, i=i: f"layer {i}: {m}")
        assert not torch.allclose(taps[i], states[i], atol=1e-2), "taps must differ by layer"
    last = LAYERS - 1
    with torch.no_grad():
        torch.testing.assert_close(final_norm(taps[last]), states[last + 1], atol=1e-4,
                                   rtol=1e-4)


@pytest.mark.parametrize("arch", ARCHS)
@pytest.mark.parametrize("num_aux", [1, 3])
def test_dflash_target_layer_ids_read_the_states_drafts_train_on(saved, arch, num_aux,
                                                                 tmp_path):
    """The target runner of a DFlash engine, set up from a draft's `target_layer_ids` (the
    default spread of published drafts), taps transformers' `hidden_states[id + 1]`."""
    from test_dflash_published_draft import PUBLISHED_CONFIG, write_draft

    folder, states, _ = saved[arch]
    ids = build_target_layer_ids(LAYERS, num_aux)
    config = {**PUBLISHED_CONFIG, "num_target_layers": LAYERS,
              "dflash_config": {"mask_token": "<|mask|>", "target_layer_ids": ids}}
    draft = write_draft(tmp_path / "draft", config, fc_in_layers=num_aux)
    engine = Engine(model_path=folder, speculative_algorithm="DFLASH",
                    speculative_draft_model_path=draft, device="cpu", max_total_tokens=1024,
                    cuda_graph_bs_decode=[1])
    runner = engine.worker.target_runner
    _, out = prefill(runner, [PROMPT])
    for i, tap in _taps(out.aux_hidden_states, ids).items():
        torch.testing.assert_close(tap, states[i + 1], atol=1e-4, rtol=1e-4)


if __name__ == "__main__":
    sys.exit(pytest.main([__file__, "-q"]))
