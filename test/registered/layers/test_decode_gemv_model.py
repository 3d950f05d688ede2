"""`--decode-gemv-backend triton` end to end on the CPU (`SGLANG_AUX_FUSED_KERNELS=force`,
Triton's interpreter): tiny Llama and Qwen2 (q/k/v biases) Engines give the greedy tokens of
the torch backend in fp32, one-token forwards run the kernels (norm + qkv + bias + RoPE + K/V
store and norm + gate_up + SiLU-mul paired, o_proj and down plain; unpaired under
`SGLANG_AUX_PAIRED_GEMV=0`) and longer ones do not, and the flag is on by default (a CPU in
`auto` mode still takes the torch path) and validated."""

import os

# NOTE: must precede any @triton.jit definition, i.e. any import of the layers.
os.environ["TRITON_INTERPRET"] = "1"

import sys  # noqa: E402
from collections import Counter  # noqa: E402

import pytest  # noqa: E402
import torch  # noqa: E402

from sglang_aux.srt.entrypoints.engine import Engine  # noqa: E402
from sglang_aux.srt.forward_state.forward_batch_info import ForwardMode  # noqa: E402
from sglang_aux.srt.layers.decode_gemv import set_decode_gemv_backend  # noqa: E402
from sglang_aux.srt.layers.triton_ops import paired_row_gemv as paired_module  # noqa: E402
from sglang_aux.srt.layers.triton_ops import row_gemv as row_gemv_module  # noqa: E402
from sglang_aux.srt.layers.triton_ops.dispatch import (  # noqa: E402
    ENV_VAR,
    PAIRED_GEMV_ENV_VAR,
    PDL_ENV_VAR,
)
from sglang_aux.srt.server_args import ServerArgs  # noqa: E402
from sglang_aux.test.ci.ci_register import register_cpu_ci  # noqa: E402
from sglang_aux.test.hf_checkpoints import save_tiny_qwen2  # noqa: E402
from sglang_aux.test.runtime_utils import (  # noqa: E402
    eager_forward,
    fixed_batch,
    make_runner,
    prefill_random,
    tiny_checkpoint,
)

register_cpu_ci(est_time=120, suite="default")

# Prompts of 9, 20 and 1 tokens (a one-token prefill runs the kernel too).
PROMPTS = [[72, 105, 32, 116, 104, 101, 114, 101, 33], list(range(40, 60)), [90]]
NEW_TOKENS = 8
# fp32 on both paths; the kernel differs from cuBLAS / the CPU GEMM in summation order only.
TOL = {"atol": 1e-4, "rtol": 1e-4}


@pytest.fixture(scope="module")
def root(tmp_path_factory):
    return tmp_path_factory.mktemp("ckpt")


def _checkpoint(root, preset: str) -> str:
    if preset == "tiny-qwen2":
        pytest.importorskip("transformers", reason="tiny-qwen2 is saved by transformers")
        return save_tiny_qwen2(root / "tiny-qwen2")
    return tiny_checkpoint(preset, root)


@pytest.fixture
def launches(monkeypatch):
    """Calls of the real kernels by (rows, fused norm, epilogue, bias), counted."""
    seen = Counter()
    real = row_gemv_module.row_gemv
    rope_store, silu_mul = paired_module.row_gemv_rope_store, paired_module.row_gemv_silu_mul

    def counted(x, weight, bias=None, **kw):
        seen[(x.shape[0], kw.get("norm_weight") is not None, None, bias is not None)] += 1
        return real(x, weight, bias, **kw)

    def counted_rope_store(x, weight, bias, *args, **kw):
        seen[(x.shape[0], kw.get("norm_weight") is not None, "rope_store",
              bias is not None)] += 1
        return rope_store(x, weight, bias, *args, **kw)

    def counted_silu_mul(x, weight, **kw):
        seen[(x.shape[0], kw.get("norm_weight") is not None, "silu_mul", False)] += 1
        return silu_mul(x, weight, **kw)

    monkeypatch.setattr(row_gemv_module, "row_gemv", counted)
    monkeypatch.setattr(paired_module, "row_gemv_rope_store", counted_rope_store)
    monkeypatch.setattr(paired_module, "row_gemv_silu_mul", counted_silu_mul)
    return seen


def _variants(has_bias: bool, paired: bool) -> set[tuple]:
    """The (fused norm, epilogue, bias) launched by a one-token forward."""
    if paired:
        return {(True, "rope_store", has_bias), (True, "silu_mul", False), (False, None, False)}
    return {(True, None, has_bias), (True, None, False), (False, None, False)}


def _greedy(path: str, backend: str) -> list[list[int]]:
    engine = Engine(model_path=path, device="cpu", dtype="float32", max_total_tokens=512,
                    max_running_requests=4, decode_gemv_backend=backend)
    params = {"temperature": 0, "max_new_tokens": NEW_TOKENS, "ignore_eos": True}
    return [o["output_ids"] for o in engine.generate(input_ids=PROMPTS, sampling_params=params)]


@pytest.mark.parametrize("preset,paired", [("tiny-llama", True), ("tiny-qwen2", True),
                                           ("tiny-qwen2", False)])
def test_greedy_tokens_equal_the_torch_backend(root, monkeypatch, launches, preset, paired):
    monkeypatch.setenv(ENV_VAR, "force")
    monkeypatch.setenv(PAIRED_GEMV_ENV_VAR, "1" if paired else "0")
    path = _checkpoint(root, preset)
    ref = _greedy(path, "torch")
    assert not launches, "the torch backend never runs the kernel"
    out = _greedy(path, "triton")
    assert out == ref
    assert all(len(set(ids)) > 2 for ids in ref), "a model that moves, not one repeated token"
    rows = {r for r, *_ in launches}
    assert rows == {1}, rows
    assert {v[1:] for v in launches} == _variants(preset == "tiny-qwen2", paired)


@pytest.mark.parametrize("preset", ["tiny-llama", "tiny-qwen2"])
@pytest.mark.parametrize("mode,width,prompts", [
    (ForwardMode.DECODE, 1, [20]), (ForwardMode.DECODE, 1, [20, 17, 30]),
    (ForwardMode.TARGET_VERIFY, 8, [20]), (ForwardMode.TARGET_VERIFY, 16, [20]),
    (ForwardMode.TARGET_VERIFY, 16, [20, 17])])
def test_step_logits_and_aux_equal_the_torch_backend(root, monkeypatch, launches, preset,
                                                     mode, width, prompts):
    """Prefills; then a step of `width` tokens per request: one request's decode runs the
    kernel, every wider step the torch path."""
    monkeypatch.setenv(ENV_VAR, "force")
    out = {}
    for backend in ("torch", "triton"):
        runner = make_runner(_checkpoint(root, preset), aux_layer_ids=[0, 2], max_total_tokens=512,
                             max_running_requests=4, context_length=256,
                             decode_gemv_backend=backend)
        reqs = prefill_random(runner, prompts, seed=3)
        res = eager_forward(runner, fixed_batch(runner, reqs, mode, width, seed=width))
        out[backend] = res.next_token_logits, res.aux_hidden_states
    for ref, got in zip(out["torch"], out["triton"], strict=True):
        assert ref.abs().max() > 0
        torch.testing.assert_close(got, ref, **TOL)
    rows = width * len(prompts)
    assert {r for r, *_ in launches} == ({1} if rows == 1 else set())
    if rows == 1:
        assert {v[1:] for v in launches} == _variants(preset == "tiny-qwen2", True)


def test_off_by_default_and_validated(root, monkeypatch):
    path = _checkpoint(root, "tiny-llama")
    assert ServerArgs(model_path=path).decode_gemv_backend == "triton"
    with pytest.raises(ValueError, match=r"--decode-gemv-backend must be one of \('torch', "
                                         r"'triton'\), got 'cutlass'"):
        ServerArgs(model_path=path, decode_gemv_backend="cutlass")
    runner = make_runner(path, max_total_tokens=64,
                         decode_gemv_backend="triton")
    assert runner.model.model.layers[0].mlp.down_proj.gemv_backend == "triton"
    with pytest.raises(ValueError, match="decode GEMV backend 'cuda'"):
        set_decode_gemv_backend(runner.model, "cuda")
    for name, value, choices in ((PAIRED_GEMV_ENV_VAR, "yes", "1, 0"),
                                 (PDL_ENV_VAR, "on", "auto, 0, 1"),
                                 (ENV_VAR, "triton", "auto, off, force")):
        with monkeypatch.context() as env:
            env.setenv(name, value)
            with pytest.raises(ValueError, match=rf"^{name}='{value}'; choose from {choices}$"):
                ServerArgs(model_path=path)


if __name__ == "__main__":
    sys.exit(pytest.main([__file__, "-q"]))
