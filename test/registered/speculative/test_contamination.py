"""Evaluation prompts kept out of training data (`contamination.py`): a training prompt that
holds one is refused in one line naming the data, the first such sample in file order, and the
prompt's set and index, wherever it sits in the prompt (its own part, the shared prefix, or
across the two)."""

import sys

import pytest

from sglang_aux.test.ci.ci_register import register_cpu_ci
from sglang_aux.tools.dflash_training.contamination import check_no_eval_prompts
from sglang_aux.tools.dflash_training.data import BadInputError, Sample

register_cpu_ci(est_time=2, suite="default")

SHOTS = "Question: shot one?\nAnswer: 1\n\n" * 4


def decode(ids: list[int]) -> str:  # a byte-level vocabulary
    return bytes(ids).decode("utf-8", errors="replace")


def sample(prompt: str) -> Sample:
    return Sample(list(prompt.encode()), list(b" 42"))


EVAL = {"test.jsonl": ["How many eggs does Janet sell?", "What is 3 + 4?"],
        "train.jsonl (held out)": ["Why is the sky blue?"]}


def test_clean_training_data_passes():
    samples = [sample(f"{SHOTS}Question: {q}\nAnswer:") for q in
               ["How many cats?", "What is 3 + 5?", "How many eggs does Janet buy?"]]
    # "What is 3 + 5?" is not the evaluation's "What is 3 + 4?": only whole questions count
    assert check_no_eval_prompts(samples, decode, EVAL, "clean.jsonl") is None


def test_the_first_sample_holding_an_evaluation_prompt_is_named():
    questions = ["How many cats?", "Why is the sky blue?", "What is 3 + 4?", "What is 3 + 4?"]
    samples = [sample(f"{SHOTS}Question: {q}\nAnswer:") for q in questions]
    with pytest.raises(BadInputError) as e:
        check_no_eval_prompts(samples, decode, EVAL, "data.jsonl.xz")
    assert str(e.value) == ("data.jsonl.xz: sample 1's prompt holds evaluation prompt 0 of "
                            "train.jsonl (held out) ('Why is the sky blue?'...); keep "
                            "evaluation prompts out of training data")


@pytest.mark.parametrize("shared", [SHOTS + "Question: What is 3 + 4?\nAnswer: 7\n\n",
                                    SHOTS + "Question: What is 3"])
def test_found_in_the_shared_prefix_and_across_it(shared):
    """An evaluation prompt among the shots is in every sample (so in sample 0); one that
    starts in the tokens every sample shares and ends in a sample's own is found whole."""
    samples = [sample(f"{shared} + 4?\nAnswer:"), sample(f"{shared} + 9?\nAnswer:")]
    with pytest.raises(BadInputError, match="^d.jsonl: sample 0's prompt holds evaluation "
                                            r"prompt 1 of test.jsonl \('What is 3 \+ 4\?'"):
        check_no_eval_prompts(samples, decode, EVAL, "d.jsonl")


HUMANEVAL_PROMPT = ('def add(x: int, y: int):\n    """Add two numbers x and y\n    >>> add(2, 3)'
                    '\n    5\n    """\n')
CODE_EVAL = {"HumanEval.jsonl.gz (prompts)": [HUMANEVAL_PROMPT],
             "HumanEval.jsonl.gz (signatures)": ["def add(x: int, y: int):"]}


def code_sample(prompt: str, source: str = "code") -> Sample:
    return Sample(list(prompt.encode()), list(b" 42"), source=source)


def test_a_reindented_humaneval_prompt_and_a_signature_are_found():
    """Whitespace runs count as one space: a HumanEval prompt inside a chat template, its
    lines reflowed, is still found; so is its signature alone, with another docstring."""
    chat = "<|im_start|>user\nComplete:\n" + " ".join(HUMANEVAL_PROMPT.split()) + "<|im_end|>"
    samples = [code_sample("def mul(x, y):\n    ..."), code_sample(chat)]
    with pytest.raises(BadInputError, match=r"^c.jsonl: sample 1's prompt holds evaluation "
                                            r"prompt 0 of HumanEval.jsonl.gz \(prompts\)"):
        check_no_eval_prompts(samples, decode, CODE_EVAL, "c.jsonl")
    renamed = [code_sample('def add(x: int, y: int):\n    """Sum them."""\n')]
    with pytest.raises(BadInputError, match=r"\(signatures\)"):
        check_no_eval_prompts(renamed, decode, CODE_EVAL, "c.jsonl")


def test_each_source_shares_its_own_prefix():
    """Samples of two sources, interleaved: each source's shared prefix is searched, and a hit
    there names that source's first sample in file order."""
    chat_prefix = "<|im_start|>system\nWhy is the sky blue?<|im_end|>\n<|im_start|>user\n"
    samples = [sample(f"{SHOTS}Question: How many cats?\nAnswer:"),
               code_sample(chat_prefix + "Sort a list.", "chat"),
               sample(f"{SHOTS}Question: How many dogs?\nAnswer:"),
               code_sample(chat_prefix + "Read a file.", "chat")]
    with pytest.raises(BadInputError, match="^m.jsonl: sample 1's prompt holds evaluation "
                                            "prompt 0 of train.jsonl"):
        check_no_eval_prompts(samples, decode, EVAL, "m.jsonl")
    clean = [s for i, s in enumerate(samples) if i % 2 == 0]
    assert check_no_eval_prompts(clean, decode, EVAL, "m.jsonl") is None


if __name__ == "__main__":
    sys.exit(pytest.main([__file__, "-q"]))
