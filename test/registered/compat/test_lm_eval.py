"""`lm-evaluation-harness` unchanged against the real server (tiny preset, CPU): its
`local-completions` model runs a multiple-choice loglikelihood task read from a local file
(`echo` + `logprobs` on /v1/completions with token id prompts), and each loglikelihood and
greedy flag it reports equals the native route's for the same tokens. Skips when pip cannot
install lm-eval (no network); fails when it installs but does not import."""

import json
import subprocess
import sys

import httpx
import pytest

from sglang_aux.srt.model_loader.tokenizer import Tokenizer
from sglang_aux.test.ci.ci_register import register_cpu_ci
from sglang_aux.test.lm_eval_client import install_lm_eval, offline_env
from sglang_aux.test.runtime_utils import tiny_checkpoint
from sglang_aux.test.server_utils import launched_server

register_cpu_ci(est_time=90, suite="default")

NAME = "tiny-lm-eval"
DOCS = [
    {"question": "The quick brown fox jumps over the lazy", "choices": [" dog", " cat", " car"],
     "label": 0},
    {"question": "One, two, three, four,", "choices": [" five", " seven", " blue"], "label": 0},
    {"question": "The capital of France is", "choices": [" Paris", " Berlin"], "label": 0},
]
TASK = """task: tinyqa
dataset_path: json
dataset_kwargs:
  data_files:
    test: {data}
test_split: test
output_type: multiple_choice
doc_to_text: "{{{{question}}}}"
doc_to_choice: "{{{{choices}}}}"
doc_to_target: label
target_delimiter: ""
metric_list:
  - metric: acc
"""
RUN_TIMEOUT_S = 600


@pytest.fixture(scope="module")
def lm_eval():
    try:
        return install_lm_eval()
    except (RuntimeError, subprocess.TimeoutExpired) as e:
        pytest.skip(f"lm-eval cannot be installed here: {str(e).splitlines()[0]}")


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    ckpt = tiny_checkpoint("tiny-llama", tmp_path_factory.mktemp("ckpt"))
    args = ["--model-path", ckpt, "--device", "cpu", "--max-total-tokens", "8192",
            "--served-model-name", NAME]
    with launched_server(args, tmp_path_factory.mktemp("log") / "server.log") as url:
        yield url, ckpt


def _native(url: str, tok: Tokenizer, context: str, continuation: str) -> tuple[float, bool]:
    """The continuation's loglikelihood and whether each of its tokens is the argmax, from
    the prompt logprobs of the native route (the first entry, the context's last token's,
    is null)."""
    ctx, cont = tok.encode(context), tok.encode(continuation)
    r = httpx.post(f"{url}/generate", timeout=300, json={
        "input_ids": ctx + cont, "return_logprob": True, "logprob_start_len": len(ctx) - 1,
        "top_logprobs_num": 1, "sampling_params": {"max_new_tokens": 0}})
    assert r.status_code == 200, r.text
    meta = r.json()["meta_info"]
    rows, tops = meta["input_token_logprobs"][1:], meta["input_top_logprobs"][1:]
    assert [t for _, t, _ in rows] == cont
    greedy = all(top[0][1] == t for (_, t, _), top in zip(rows, tops, strict=True))
    return sum(v for v, _, _ in rows), greedy


def test_local_completions_loglikelihoods_equal_the_native_ones(lm_eval, server, tmp_path):
    url, ckpt = server
    data = tmp_path / "tinyqa.jsonl"
    data.write_text("".join(json.dumps(d) + "\n" for d in DOCS))
    (tmp_path / "tinyqa.yaml").write_text(TASK.format(data=data))
    model_args = (f"base_url={url}/v1/completions,model={NAME},tokenizer={ckpt},"
                  "tokenizer_backend=huggingface,num_concurrent=2,max_retries=1")
    done = subprocess.run(
        [*lm_eval, "--model", "local-completions", "--model_args", model_args,
         "--tasks", "tinyqa", "--include_path", str(tmp_path), "--output_path",
         str(tmp_path / "out"), "--log_samples"],
        cwd=tmp_path, env=offline_env(), capture_output=True, text=True, timeout=RUN_TIMEOUT_S)
    assert done.returncode == 0, done.stderr[-4000:]
    samples = [json.loads(line) for f in (tmp_path / "out").rglob("samples_tinyqa_*.jsonl")
               for line in f.read_text().splitlines()]
    assert sorted(s["doc_id"] for s in samples) == list(range(len(DOCS)))
    tok = Tokenizer.from_dir(ckpt)
    for sample in samples:
        doc = DOCS[sample["doc_id"]]
        native = [_native(url, tok, doc["question"], c) for c in doc["choices"]]
        reported = [(float(v), g == "True") for v, g in sample["filtered_resps"]]
        assert [g for _, g in reported] == [g for _, g in native]
        assert [v for v, _ in reported] == pytest.approx([v for v, _ in native], rel=1e-5)
        best = max(range(len(native)), key=lambda i: native[i][0])
        assert sample["acc"] == float(best == doc["label"])


if __name__ == "__main__":
    sys.exit(pytest.main([__file__, "-v"]))
