"""GGUF import of a `qwen2` file (K-quants, Qwen BPE, ChatML) into an HF folder: a tiny file
written here with GGUFWriter, compared with transformers' own GGUF load of it (weights, greedy
tokens, logits, tokenizer ids, chat template, special ids), and transformers loads the folder
we write and agrees."""

import json
import os
import sys
from pathlib import Path

import pytest
import torch
from safetensors import safe_open

from sglang_aux.srt.entrypoints.engine import Engine
from sglang_aux.srt.model_loader import builtin
from sglang_aux.srt.model_loader.tokenizer import Tokenizer
from sglang_aux.test.ci.ci_register import register_cpu_ci
from sglang_aux.test.runtime_utils import prefill, release
from sglang_aux.test.tiny_gguf import CORPUS, HIDDEN, LAYERS, ROPE_BASE, write_tiny_qwen2_gguf
from sglang_aux.tools import import_gguf

register_cpu_ci(est_time=20, suite="default")

gguf = pytest.importorskip("gguf", reason="the `gguf` package writes and reads GGUF (test extra)")
transformers = pytest.importorskip("transformers", reason="compares with transformers")
pytest.importorskip("accelerate", reason="transformers loads GGUF files through accelerate")
os.environ.setdefault("HF_HUB_OFFLINE", "1")

TEXTS = [*CORPUS, "Question: 7 apples, 3 eaten. How many left?\nAnswer:", "I'LL  go\n\n\n12x",
         "<|im_start|>user\nhi<|im_end|>\n", "<tool_call>{\"a\": 1}</tool_call>", "東京 ß"]
MESSAGES = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "2 + 2?"}]
NEW_TOKENS = 8
LOGIT_TOL = {"atol": 1e-4, "rtol": 1e-4}  # the same fp32 weights, math in another order


@pytest.fixture(scope="module")
def files(tmp_path_factory) -> tuple[Path, Path]:
    """(the GGUF file, our fp32 folder imported from it by the command-line tool)."""
    root = tmp_path_factory.mktemp("qwen2-gguf")
    path = write_tiny_qwen2_gguf(root / "tiny-qwen2.Q4_K_M.gguf")
    import_gguf.main(["--gguf", str(path), "--out", str(root / "folder"), "--dtype", "float32"])
    return path, root / "folder"


@pytest.fixture(scope="module")
def from_gguf(files):
    """transformers' own load of the GGUF file: model (fp32) and tokenizer."""
    path = files[0]
    model = transformers.AutoModelForCausalLM.from_pretrained(
        path.parent, gguf_file=path.name, dtype=torch.float32).eval()
    return model, transformers.AutoTokenizer.from_pretrained(path.parent, gguf_file=path.name)


def test_file_has_k_quants_and_config(files):
    reader = gguf.GGUFReader(str(files[0]))
    assert {t.tensor_type.name for t in reader.tensors} == {"Q4_K", "Q6_K", "F32"}
    cfg = json.loads((files[1] / "config.json").read_text())
    expect = dict(architectures=["Qwen2ForCausalLM"], model_type="qwen2", hidden_size=HIDDEN,
                  num_hidden_layers=LAYERS, rope_theta=ROPE_BASE, rms_norm_eps=1e-6,
                  tie_word_embeddings=False, use_sliding_window=False)
    assert {k: cfg[k] for k in expect} == expect


def test_weights_equal_transformers_gguf_load(files, from_gguf):
    """Names, K-quant dequantization, biases and Qwen2's unpermuted q/k, exactly."""
    theirs = from_gguf[0].state_dict()
    with safe_open(str(files[1] / "model.safetensors"), framework="pt") as f:
        names = set(f.keys())
        for name in names:
            assert torch.equal(f.get_tensor(name), theirs[name]), name
    assert "model.layers.0.self_attn.q_proj.bias" in names and "lm_head.weight" in names
    assert names == {k for k in theirs if not k.endswith("rotary_emb.inv_freq")}


def test_engine_matches_transformers(files, from_gguf):
    model, hf_tok = from_gguf
    engine = Engine(model_path=str(files[1]), dtype="float32", device="cpu",
                    max_total_tokens=2048, max_running_requests=4)
    prompts = [hf_tok(t, add_special_tokens=False)["input_ids"] for t in TEXTS[:3]]
    params = {"temperature": 0, "max_new_tokens": NEW_TOKENS, "ignore_eos": True}
    outs = engine.generate(input_ids=prompts, sampling_params=params)
    runner = engine.worker.model_runner
    reqs, prefill_out = prefill(runner, prompts)
    release(runner, reqs)
    for i, (ids, out) in enumerate(zip(prompts, outs, strict=True)):
        with torch.no_grad():
            ref = model.generate(torch.tensor([ids]), max_new_tokens=NEW_TOKENS,
                                 do_sample=False, output_logits=True,
                                 return_dict_in_generate=True, eos_token_id=None)
        assert out["output_ids"] == ref.sequences[0, len(ids):].tolist(), TEXTS[i]
        torch.testing.assert_close(prefill_out.next_token_logits[i], ref.logits[0][0],
                                   **LOGIT_TOL)
    # <|im_end|> ends a turn, and <|endoftext|> a text, as Qwen2.5's generation config says
    assert engine.tokenizer.eos_token_id == hf_tok.convert_tokens_to_ids("<|im_end|>")
    assert engine.scheduler.eos_token_ids == {
        hf_tok.convert_tokens_to_ids(t) for t in ("<|im_end|>", "<|endoftext|>")}


def test_a_gguf_file_is_a_model_path(files, tmp_path, monkeypatch):
    """`--model-path FILE.gguf` serves the file: imported once into the cache (a second
    resolve reuses the folder), the same weights as the import tool's folder."""
    monkeypatch.setenv("SGLANG_AUX_CACHE", str(tmp_path))
    folder = Path(builtin.resolve_model_path(str(files[0])))
    assert folder.parent == tmp_path / "gguf-imports" and (folder / "config.json").is_file()
    stamp = (folder / "model.safetensors").stat().st_mtime_ns
    assert builtin.resolve_model_path(str(files[0])) == str(folder)
    assert (folder / "model.safetensors").stat().st_mtime_ns == stamp
    engine = Engine(model_path=str(files[0]), dtype="float32", device="cpu",
                    max_total_tokens=1024, max_running_requests=2)
    ref = Engine(model_path=str(files[1]), dtype="float32", device="cpu",
                 max_total_tokens=1024, max_running_requests=2)
    params = {"temperature": 0, "max_new_tokens": NEW_TOKENS, "ignore_eos": True}
    assert engine.generate([TEXTS[0]], params)[0]["output_ids"] == (
        ref.generate([TEXTS[0]], params)[0]["output_ids"])


def test_tokenizer_matches_transformers(files, from_gguf):
    hf_tok = from_gguf[1]
    ours = Tokenizer.from_dir(files[1])
    for text in TEXTS:
        ids = hf_tok(text, add_special_tokens=False)["input_ids"]
        assert ours.encode(text) == ids, text
        assert ours.decode(ids, skip_special_tokens=False) == text
    assert len(hf_tok("1234")["input_ids"]) == 4  # Qwen2 splits digits one by one
    assert ours.chat_template == hf_tok.chat_template


def test_transformers_loads_our_folder(files, from_gguf):
    """Our folder is a Qwen2 checkpoint to transformers too: same logits, tokenizer, chat."""
    model, hf_tok = from_gguf
    folder = str(files[1])
    again = transformers.AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32)
    tok = transformers.AutoTokenizer.from_pretrained(folder)
    ids = torch.tensor([hf_tok(TEXTS[0], add_special_tokens=False)["input_ids"]])
    with torch.no_grad():
        torch.testing.assert_close(again(ids).logits, model(ids).logits, rtol=0, atol=0)
    for text in TEXTS:
        assert tok(text)["input_ids"] == hf_tok(text)["input_ids"], text
    assert (tok.eos_token, tok.pad_token) == ("<|im_end|>", "<|endoftext|>")
    for t in (tok, hf_tok):
        assert (t.eos_token_id, t.pad_token_id) == (model.config.eos_token_id,
                                                    model.config.pad_token_id)
    assert again.config.eos_token_id == [tok.eos_token_id, tok.pad_token_id]
    chat = tok.apply_chat_template(MESSAGES, tokenize=False, add_generation_prompt=True)
    assert chat == hf_tok.apply_chat_template(MESSAGES, tokenize=False,
                                              add_generation_prompt=True)
    assert chat.endswith("<|im_end|>\n<|im_start|>assistant\n")


if __name__ == "__main__":
    sys.exit(pytest.main([__file__, "-q"]))
