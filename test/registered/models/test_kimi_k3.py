"""Kimi-K3 (AttnRes) target: aux taps, no in-place writes, packed == list, KV cache, MoE, loader."""

from __future__ import annotations

import json
import shutil
import sys
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file

from sglang_aux.srt.configs.model_config import ModelConfig
from sglang_aux.srt.forward_state.forward_batch_info import ForwardMode
from sglang_aux.srt.layers.aux_hidden_states import SupportsSharedAuxHiddenStates
from sglang_aux.srt.managers.schedule_batch import (
    extend_inputs,
    reserve_kv,
    step_inputs,
)
from sglang_aux.srt.model_executor.runner.forward_parts import ForwardParts
from sglang_aux.srt.model_executor.runner.step_prologue import StepPrologue
from sglang_aux.srt.model_loader.loader import get_model
from sglang_aux.srt.model_loader.preset_checkpoint import write_checkpoint
from sglang_aux.srt.models.kimi_k3 import KimiK3ForCausalLM, KimiK3MoE
from sglang_aux.srt.models.llama import LlamaMLP
from sglang_aux.test.ci.ci_register import register_cpu_ci
from sglang_aux.test.runtime_utils import (
    extend_batch,
    make_runner,
    pipeline_stage,
    publish_rows,
)

register_cpu_ci(est_time=10, suite="default")

PROMPTS = [[72, 105, 32, 116, 104, 101, 114, 101, 33], [3, 141, 59, 26, 53]]  # 9 and 5 tokens
TOL = {"atol": 1e-5, "rtol": 1e-4}
# Cached vs recomputed attention differs in fp32 summation order, and the random deep stack
# amplifies that; a KV-cache bug shows up at O(1).
LOGIT_TOL = {"atol": 1e-4, "rtol": 1e-4}


@pytest.fixture(scope="module")
def ckpt(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_checkpoint("tiny-k3", tmp_path_factory.mktemp("tiny-k3"))


def load(path: Path) -> tuple[KimiK3ForCausalLM, ModelConfig]:
    config = ModelConfig.from_pretrained(path)
    return get_model(config, "cpu"), config


def runner_for(model: KimiK3ForCausalLM, config: ModelConfig):
    """A CPU runner around `model` (its KV memory, torch-native attention)."""
    runner = make_runner(config.model_path, model=model, max_running_requests=8,
                         max_total_tokens=512, context_length=256, disable_decode_cuda_graph=True)
    runner.init_forwards(ForwardParts(ForwardMode.DECODE, 1, StepPrologue()))
    return runner


def run(model: KimiK3ForCausalLM, config: ModelConfig, prompts: list[list[int]], **batch_fields):
    _, fb = extend_batch(runner_for(model, config), prompts)
    for name, value in batch_fields.items():
        setattr(fb, name, value)
    return model(fb.input_ids, fb.positions, fb), fb


def ref_rms(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    x = x.double()
    return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps) * weight.double()


def ref_mix(sources, query, norm_weight, eps) -> tuple[torch.Tensor, torch.Tensor]:
    """fp64 AttnRes mixture written source by source: (mixture `[T, H]`, weights `[S, T]`)."""
    scores = torch.stack([ref_rms(s, norm_weight, eps) @ query.double() for s in sources])
    weights = scores.exp() / scores.exp().sum(0, keepdim=True)
    return sum(w[:, None] * s.double() for w, s in zip(weights, sources, strict=True)), weights


def test_aux_taps_equal_independent_attn_res_mixtures(ckpt: Path) -> None:
    model, config = load(ckpt)
    hf, inner = config.hf_config, model.model
    eps, block = hf.rms_norm_eps, hf.attn_res_block_size
    model.set_dflash_layers_to_capture([5, 0, 2])  # captured ascending: 0, 2, 5 (= last layer)
    calls: dict[str, list] = {"attn": [], "mlp": []}
    for layer in inner.layers:
        layer.self_attn.register_forward_hook(lambda m, a, o: calls["attn"].append((a[1], o)))
        layer.mlp.register_forward_hook(lambda m, a, o: calls["mlp"].append((a[0], o)))
    out, fb = run(model, config, PROMPTS)

    # Rebuild the AttnRes walk from the recorded sublayer outputs alone.
    blocks, partial = [inner.embed_tokens(fb.input_ids).double()], None
    attn_mixtures, all_weights = [], []
    for i, layer in enumerate(inner.layers):
        sources = blocks if partial is None else [*blocks, partial]
        mix, w = ref_mix(sources, layer.attn_res_query_attn, layer.attn_res_norm_attn.weight, eps)
        attn_x, attn_out = calls["attn"][i]
        torch.testing.assert_close(
            attn_x.double(), ref_rms(mix, layer.input_layernorm.weight, eps), **TOL
        )
        attn_mixtures.append(mix)
        all_weights.append(w)
        partial = attn_out.double() if partial is None else partial + attn_out
        mix, w = ref_mix([*blocks, partial], layer.attn_res_query_mlp,
                         layer.attn_res_norm_mlp.weight, eps)
        mlp_x, mlp_out = calls["mlp"][i]
        norm_w = layer.post_attention_layernorm.weight
        torch.testing.assert_close(mlp_x.double(), ref_rms(mix, norm_w, eps), **TOL)
        all_weights.append(w)
        partial = partial + mlp_out
        if (i + 1) % block == 0:
            blocks, partial = [*blocks, partial], None
    sources = blocks if partial is None else [*blocks, partial]
    final, _ = ref_mix(sources, inner.final_attn_res_query, inner.final_attn_res_norm.weight, eps)

    expected = torch.cat([attn_mixtures[1], attn_mixtures[3], final], dim=-1)
    assert out.aux_hidden_states.shape == (fb.num_tokens, 3 * hf.hidden_size)
    torch.testing.assert_close(out.aux_hidden_states.double(), expected, **TOL)
    last_rows = torch.tensor([len(PROMPTS[0]) - 1, fb.num_tokens - 1])
    logits = ref_rms(final[last_rows], inner.norm.weight, eps) @ model.lm_head.weight.double().T
    torch.testing.assert_close(out.next_token_logits.double(), logits, **TOL)
    # Random init must give a depth softmax that actually prefers some sources.
    multi = [w for w in all_weights if w.shape[0] > 1]
    assert max((w - 1.0 / w.shape[0]).abs().max().item() for w in multi) > 0.05


@pytest.mark.parametrize("pp_size", [1, 2])
def test_forward_leaves_caller_tensors_alone(ckpt: Path, pp_size: int) -> None:
    model, config = load(ckpt)
    model.set_dflash_layers_to_capture([2])  # a later PP stage with one id: aux is the capture
    held: list[tuple[torch.Tensor, torch.Tensor]] = []

    def pre_hook(module, args) -> None:
        _, blocks, partial, _ = args
        held.extend((t, t.clone()) for t in [*blocks, *([partial] if partial is not None else [])])

    def post_hook(module, args, out) -> None:
        _, partial = out  # the final aggregation's sources; out[0] may be the aux capture
        held.append((partial, partial.clone()))

    def output_hook(module, args, out) -> None:
        held.append((out, out.clone()))

    for layer in model.model.layers:
        layer.register_forward_pre_hook(pre_hook)
        layer.register_forward_hook(post_hook)
        layer.self_attn.register_forward_hook(output_hook)  # sublayer outputs: others hold them
        layer.mlp.register_forward_hook(output_hook)
    _, fb = extend_batch(runner_for(model, config), PROMPTS)
    ids, positions = fb.input_ids.clone(), fb.positions.clone()
    with pipeline_stage(pp_size):
        out = model(fb.input_ids, fb.positions, fb)
    aux = out.aux_hidden_states.clone()

    assert len(held) > 4 * len(model.model.layers)
    for tensor, snapshot in held:
        assert torch.equal(tensor, snapshot), "a source or partial sum was written in place"
    assert torch.equal(fb.input_ids, ids) and torch.equal(fb.positions, positions)
    aux_storage = out.aux_hidden_states.untyped_storage().data_ptr()
    assert all(t.untyped_storage().data_ptr() != aux_storage for t, _ in held)
    # A later forward must not reuse the storage the first one returned.
    with pipeline_stage(pp_size):
        run(model, config, [[9, 8, 7, 6]])
    assert torch.equal(out.aux_hidden_states, aux)


def test_packed_into_caller_buffer_equals_list_path(ckpt: Path) -> None:
    ids = [0, 3, 5]
    model, config = load(ckpt)
    model.set_dflash_layers_to_capture(ids)
    with pipeline_stage(2):  # a later stage keeps the list path
        assert not model.packs_aux_hidden_states
        ref, fb = run(model, config, PROMPTS)
    assert model.packs_aux_hidden_states

    num_tokens, width = fb.num_tokens, len(ids) * config.hf_config.hidden_size
    sentinel = -7.0
    storage = torch.full((num_tokens + 5, width), sentinel)
    buffer = storage[2 : 2 + num_tokens]  # a runner's shared buffer, sliced to this batch
    out, _ = run(model, config, PROMPTS, aux_hidden_states_buffer=buffer)

    assert out.aux_hidden_states.data_ptr() == buffer.data_ptr()
    assert torch.equal(out.aux_hidden_states, ref.aux_hidden_states)
    assert torch.equal(out.next_token_logits, ref.next_token_logits)
    assert (storage[:2] == sentinel).all() and (storage[2 + num_tokens :] == sentinel).all()


def test_decode_and_chunked_prefill_match_one_prefill(ckpt: Path) -> None:
    model, config = load(ckpt)
    next_tokens = [200, 17]
    runner = runner_for(model, config)
    reqs, fb = extend_batch(runner, PROMPTS)
    model(fb.input_ids, fb.positions, fb)
    for req, tok in zip(reqs, next_tokens, strict=True):
        req.output_ids.append(tok)
        reserve_kv(runner, req, req.kv_len + 1)
    publish_rows(runner, reqs)
    fb = runner.prepare(step_inputs(reqs, ForwardMode.DECODE, 1))
    runner.attn_backend.init_forward_metadata(fb)
    decoded = model(fb.input_ids, fb.positions, fb).next_token_logits

    longer = [p + [t] for p, t in zip(PROMPTS, next_tokens, strict=True)]
    full = run(model, config, longer)[0].next_token_logits
    torch.testing.assert_close(decoded, full, **LOGIT_TOL)

    # The same prompts in two chunks, the second reading the first from the KV cache.
    runner = runner_for(model, config)
    reqs, fb = extend_batch(runner, [p[:3] for p in longer])
    model(fb.input_ids, fb.positions, fb)
    for req, full_prompt in zip(reqs, longer, strict=True):
        req.origin_input_ids = full_prompt  # the rest of the prompt arrives as a second chunk
    fb = runner.prepare(extend_inputs(runner, reqs))
    runner.attn_backend.init_forward_metadata(fb)
    chunked = model(fb.input_ids, fb.positions, fb).next_token_logits
    torch.testing.assert_close(chunked, full, **LOGIT_TOL)


def test_moe_equals_per_token_loop_over_selected_experts(ckpt: Path) -> None:
    model, config = load(ckpt)
    hf = config.hf_config
    assert isinstance(model.model.layers[0].mlp, LlamaMLP)  # first_k_dense_replace = 1
    moe = model.model.layers[1].mlp
    assert isinstance(moe, KimiK3MoE) and len(moe.experts) == hf.num_experts
    x = torch.randn(24, hf.hidden_size, generator=torch.Generator().manual_seed(0))

    expected, choices = [], set()
    for row in x[:, None]:  # [1, H] each
        probs = torch.softmax(row[0] @ moe.gate.weight.T, dim=-1).tolist()
        top = sorted(range(hf.num_experts), key=lambda e: -probs[e])[: hf.num_experts_per_tok]
        choices.add(frozenset(top))
        total = sum(probs[e] for e in top)
        y = moe.shared_experts(row)
        for e in top:
            y = y + probs[e] / total * moe.experts[e](row)
        expected.append(y)
    assert len(choices) > 1, "routing should differ across tokens"
    torch.testing.assert_close(moe(x), torch.cat(expected), **TOL)
    assert ((moe.routing_weights(x) > 0).sum(-1) == hf.num_experts_per_tok).all()


def test_shared_aux_protocol_and_width(ckpt: Path) -> None:
    model, config = load(ckpt)
    hidden = config.hf_config.hidden_size
    assert isinstance(model, SupportsSharedAuxHiddenStates)
    assert model.get_packed_aux_hidden_size() == model.get_aux_hidden_states_width() == 0
    model.set_dflash_layers_to_capture([0, 3, 5])
    assert model.get_packed_aux_hidden_size() == model.get_aux_hidden_states_width() == 3 * hidden
    model.set_dspark_layers_to_capture([4])
    assert model.get_aux_hidden_states_width() == hidden
    for bad in ([6], [-1], [1, 1]):
        with pytest.raises(ValueError):
            model.set_dflash_layers_to_capture(bad)

    model.set_dflash_layers_to_capture([0, 3, 5])
    with pipeline_stage(2):
        assert model.get_packed_aux_hidden_size() == model.get_aux_hidden_states_width() == 0


@pytest.mark.parametrize("edit, name", [
    (lambda t: t.update({"model.layers.3.attn_res_query_mlp": torch.zeros(65)}),
     "model.layers.3.attn_res_query_mlp"),
    (lambda t: t.pop("model.final_attn_res_query"), "model.final_attn_res_query"),
    (lambda t: t.update({"model.layers.0.attn_res_bias": torch.zeros(64)}),
     "model.layers.0.attn_res_bias"),
    ("config", "model.layers.0.mlp."),  # intermediate_size only shapes the dense layer 0
], ids=["wrong_shape", "missing", "unexpected", "config_json"])
def test_loader_rejects_mismatched_checkpoint(ckpt: Path, tmp_path: Path, edit, name: str) -> None:
    path = Path(shutil.copytree(ckpt, tmp_path / "ckpt"))
    if edit == "config":
        raw = json.loads((path / "config.json").read_text())
        raw["intermediate_size"] += 32
        (path / "config.json").write_text(json.dumps(raw))
    else:
        tensors = load_file(path / "model.safetensors")
        edit(tensors)
        save_file(tensors, path / "model.safetensors")
    with pytest.raises(ValueError, match=name.replace(".", r"\.")):
        load(path)


if __name__ == "__main__":
    sys.exit(pytest.main([__file__, "-q"]))
