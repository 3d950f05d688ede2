"""Models on the fused kernels (`SGLANG_AUX_FUSED_KERNELS=force`, Triton's CPU interpreter)
== the same models on the torch twins (`off`), and the merged projections' weight loading."""

import os

# NOTE: must precede any @triton.jit definition, i.e. any import of the layers.
os.environ["TRITON_INTERPRET"] = "1"

import sys  # noqa: E402
from pathlib import Path  # noqa: E402
from types import SimpleNamespace  # noqa: E402

import pytest  # noqa: E402
import torch  # noqa: E402
from safetensors.torch import load_file  # noqa: E402

from sglang_aux.srt.configs.model_config import ModelConfig  # noqa: E402
from sglang_aux.srt.configs.presets import PRESETS  # noqa: E402
from sglang_aux.srt.forward_state.forward_batch_info import ForwardMode  # noqa: E402
from sglang_aux.srt.layers.triton_ops.dispatch import ENV_VAR  # noqa: E402
from sglang_aux.srt.mem_cache.memory_pool import MHATokenToKVPool  # noqa: E402
from sglang_aux.srt.model_loader.loader import get_model  # noqa: E402
from sglang_aux.srt.models.llama import LlamaForCausalLM  # noqa: E402
from sglang_aux.srt.models.weight_utils import (  # noqa: E402
    checkpoint_tensors,
    init_random_weights,
    load_named_weights,
)
from sglang_aux.test.ci.ci_register import register_cpu_ci  # noqa: E402
from sglang_aux.test.runtime_utils import (  # noqa: E402
    eager_forward,
    fixed_batch,
    make_runner,
    prefill_random,
    tiny_checkpoint,
)

register_cpu_ci(est_time=60, suite="default")

# fp32 on both paths; the kernels differ from the twins in summation order only.
TOL = {"atol": 1e-4, "rtol": 1e-4}
CASES = [("tiny-llama", [0, 2, 3]), ("tiny-qwen3", [1]), ("tiny-k3", [1, 3, 5])]


def _run_steps(path: str, aux: list[int]) -> dict[str, torch.Tensor]:
    """Prefill two requests, then one DECODE and one TARGET_VERIFY step; what they produce."""
    runner = make_runner(path, aux_layer_ids=aux, max_total_tokens=512, max_running_requests=4,
                         context_length=256)
    reqs = prefill_random(runner, [9, 5], seed=3)
    out = {}
    for mode, width in ((ForwardMode.DECODE, 1), (ForwardMode.TARGET_VERIFY, 4)):
        fb = fixed_batch(runner, reqs, mode, width, seed=width)
        res = eager_forward(runner, fb)
        out[f"{mode.name}.logits"] = res.next_token_logits
        out[f"{mode.name}.aux"] = res.aux_hidden_states
    slots = torch.cat([runner.req_to_token_pool.req_to_token[r.req_pool_idx, : r.kv_len]
                       for r in reqs])
    pool = runner.token_to_kv_pool
    out["k_cache"] = torch.stack([b[slots] for b in pool.k_buffer])
    out["v_cache"] = torch.stack([b[slots] for b in pool.v_buffer])
    return out


@pytest.mark.parametrize("preset,aux", CASES, ids=[c[0] for c in CASES])
def test_fused_forward_equals_twins(tmp_path, monkeypatch, preset, aux):
    path = tiny_checkpoint(preset, tmp_path)
    monkeypatch.setenv(ENV_VAR, "off")
    twins = _run_steps(path, aux)
    monkeypatch.setenv(ENV_VAR, "force")
    fused = _run_steps(path, aux)
    assert fused.keys() == twins.keys()
    for name, ref in twins.items():
        assert ref is not None and ref.abs().max() > 0, name
        torch.testing.assert_close(fused[name], ref, **TOL, msg=lambda m, n=name: f"{n}: {m}")


def _draft(tmp_path):
    config = ModelConfig.from_pretrained(tiny_checkpoint("tiny-llama-dflash", tmp_path))
    return get_model(config, "cpu"), config.hf_config


def test_draft_context_kv_fused_store_and_unfused_math(tmp_path, monkeypatch):
    draft, hf = _draft(tmp_path)
    weights = load_file(Path(tmp_path) / "tiny-llama-dflash" / "model.safetensors")
    n, kvh, d = 6, hf.num_key_value_heads, hf.head_dim
    aux = torch.randn(n, draft.fc.in_features, generator=torch.Generator().manual_seed(0))
    positions, loc = torch.tensor([0, 1, 2, 7, 30, 31]), torch.tensor([3, 9, 4, 11, 1, 6])
    caches = {}
    for mode in ("off", "force"):
        monkeypatch.setenv(ENV_VAR, mode)
        pool = MHATokenToKVPool(12, hf.num_hidden_layers, kvh, d, torch.float32, "cpu")
        draft.write_context_kv(aux, positions, loc, pool)
        caches[mode] = torch.stack([*pool.k_buffer, *pool.v_buffer])
    torch.testing.assert_close(caches["force"], caches["off"], **TOL)

    # The unfused definition, from the checkpoint's own k/v tensors.
    ctx = draft.project_context(aux)
    rope = draft.layers[0].self_attn.rotary_emb
    cos, sin = rope.cos_sin_cache[positions].chunk(2, -1)
    for i, (k, v) in enumerate(draft.context_kv(ctx, positions)):
        pre = f"layers.{i}.self_attn."
        k_ref = (ctx @ weights[pre + "k_proj.weight"].T).view(n, kvh, d)
        k_ref = draft.layers[i].self_attn.k_norm.forward_native(k_ref)
        k1, k2 = k_ref.chunk(2, -1)
        k_ref = torch.cat([k1 * cos[:, None] - k2 * sin[:, None],
                           k2 * cos[:, None] + k1 * sin[:, None]], -1)
        torch.testing.assert_close(k, k_ref, **TOL)
        torch.testing.assert_close(v, (ctx @ weights[pre + "v_proj.weight"].T).view(n, kvh, d),
                                   **TOL)
        torch.testing.assert_close(caches["off"][i][loc], k, **TOL)


def test_draft_context_weights_follow_in_place_updates(tmp_path):
    """The stacked context k/v weight is cached, but never stale."""
    draft, hf = _draft(tmp_path)
    ctx, positions = torch.randn(3, hf.hidden_size), torch.arange(3)
    before = draft.context_kv(ctx, positions)[0][1]
    with torch.no_grad():
        draft.layers[0].self_attn.qkv_proj.shard_param("v_proj", "weight").mul_(2.0)
    after = draft.context_kv(ctx, positions)[0][1]
    torch.testing.assert_close(after, 2.0 * before)


def test_training_with_gradients_takes_the_twins(tmp_path, monkeypatch):
    monkeypatch.setenv(ENV_VAR, "force")
    draft, hf = _draft(tmp_path)
    ctx = torch.randn(3, hf.hidden_size)
    with torch.enable_grad():
        k, _ = draft.context_kv(ctx, torch.arange(3))[0]
        k.sum().backward()
    assert draft.layers[0].self_attn.qkv_proj.weight.grad.abs().sum() > 0
    assert draft.layers[0].self_attn.k_norm.weight.grad.abs().sum() > 0


def test_checkpoint_names_and_merged_rows(tmp_path):
    path = Path(tiny_checkpoint("tiny-qwen3", tmp_path))
    file = load_file(path / "model.safetensors")
    assert not any("qkv_proj" in k or "gate_up_proj" in k for k in file)
    model = get_model(ModelConfig.from_pretrained(path), "cpu")
    assert checkpoint_tensors(model).keys() == file.keys()
    layer = model.model.layers[1]
    pre = "model.layers.1."
    assert torch.equal(layer.self_attn.qkv_proj.weight, torch.cat(
        [file[pre + f"self_attn.{s}_proj.weight"] for s in "qkv"]))
    assert torch.equal(layer.mlp.gate_up_proj.weight, torch.cat(
        [file[pre + f"mlp.{s}_proj.weight"] for s in ("gate", "up")]))


def test_missing_or_misshapen_shard_is_named(tmp_path):
    path = Path(tiny_checkpoint("tiny-llama", tmp_path))
    file = load_file(path / "model.safetensors")
    model = get_model(ModelConfig.from_pretrained(path), "cpu")
    missing = {k: v for k, v in file.items() if k != "model.layers.2.self_attn.k_proj.weight"}
    with pytest.raises(ValueError, match=r"lacks 1 tensors .*layers\.2\.self_attn\.k_proj\.weight"):
        model.load_weights(missing.items())
    bad = {**file, "model.layers.0.mlp.up_proj.weight": torch.zeros(3, 64)}
    with pytest.raises(ValueError, match=r"'model\.layers\.0\.mlp\.up_proj\.weight' has shape "
                                         r"\(3, 64\), the model expects \(128, 64\)"):
        model.load_weights(bad.items())


def test_qkv_bias_loads_and_round_trips():
    config = SimpleNamespace(**{**PRESETS["tiny-llama"], "attention_bias": True})
    src, dst = LlamaForCausalLM(config), LlamaForCausalLM(config)
    init_random_weights(src, seed=4)
    with torch.no_grad():
        for layer in src.model.layers:
            layer.self_attn.qkv_proj.bias.normal_()
    tensors = checkpoint_tensors(src)
    assert {"model.layers.0.self_attn.q_proj.bias", "model.layers.0.self_attn.v_proj.bias"} \
        <= tensors.keys()
    load_named_weights(dst, tensors.items())
    for a, b in zip(src.parameters(), dst.parameters(), strict=True):
        assert torch.equal(a, b)
    x = torch.randn(2, config.hidden_size)
    qkv = src.model.layers[0].self_attn.qkv_proj
    q = x @ tensors["model.layers.0.self_attn.q_proj.weight"].T
    torch.testing.assert_close(qkv.split(qkv(x))[0],
                               q + tensors["model.layers.0.self_attn.q_proj.bias"])


if __name__ == "__main__":
    sys.exit(pytest.main([__file__, "-q"]))
