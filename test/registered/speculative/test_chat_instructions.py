"""Self-instruct chat requests (`chat_instructions.py`): the target's answers cleaned,
filtered and deduplicated, the same for the same seed; the seed topics file is read whole or
refused naming it."""

import json
import sys

import pytest

from sglang_aux.srt.entrypoints.engine import Engine
from sglang_aux.test.chat_prompts import chat_prompt
from sglang_aux.test.ci.ci_register import register_cpu_ci
from sglang_aux.test.runtime_utils import tiny_checkpoint
from sglang_aux.tools.dflash_training.chat_instructions import (
    ASK,
    chat_instructions,
    cleaned_request,
    read_seed_topics,
)

register_cpu_ci(est_time=20, suite="default")


@pytest.fixture(scope="module")
def engine(tmp_path_factory):
    path = tiny_checkpoint("tiny-llama", tmp_path_factory.mktemp("ckpt"))
    e = Engine(model_path=path, device="cpu", max_running_requests=8, max_total_tokens=4096)
    yield e
    e.shutdown()


def test_cleaning_drops_preambles_and_out_of_bounds_answers():
    assert cleaned_request('  "How do I sort a list of tuples by the second item?" ') == \
        "How do I sort a list of tuples by the second item?"
    assert cleaned_request("Sure! Here is a message: how do I sort?") is None
    assert cleaned_request("Hi?") is None
    assert cleaned_request("x" * 601) is None


def test_seed_topics_shipped_and_a_bad_file_is_named(tmp_path):
    assert len(read_seed_topics()) >= 50
    bad = tmp_path / "topics.json"
    bad.write_text(json.dumps(["python", ""]))
    with pytest.raises(ValueError, match="topics.json"):
        read_seed_topics(bad)


def test_requests_are_distinct_bounded_and_seeded(engine):
    topics = ["sorting lists", "reading files"]
    requests = chat_instructions(engine, 3, seed=5, topics=topics)
    assert len(requests) <= 3 and len(set(requests)) == len(requests)
    assert all(cleaned_request(r) == r for r in requests)
    assert chat_instructions(engine, 3, seed=5, topics=topics) == requests
    # the ask is the user's turn of the chat template (ChatML for the tiny preset)
    ask = chat_prompt(engine.tokenizer, ASK.format(topic="sorting lists"))
    assert ask.endswith("<|im_start|>assistant\n") and "about sorting lists" in ask


if __name__ == "__main__":
    sys.exit(pytest.main([__file__, "-q"]))
