"""Chat requests the target writes itself (self-instruct): for each seed topic
(`data/seed_topics.json`) the target is asked, through its chat template, for one message a
user might send about it; the answers are cleaned, filtered by length and deduplicated. The
requests then become chat prompts whose answers the target regenerates like any other prompt.
Deterministic given the engine and the seed (every draw is seeded)."""

from __future__ import annotations

import json
import logging
from pathlib import Path

from sglang_aux.srt.entrypoints.engine import Engine
from sglang_aux.test.chat_prompts import CHAT_STOP, chat_prompt

logger = logging.getLogger(__name__)

SEED_TOPICS_PATH = Path(__file__).resolve().parents[2] / "data" / "seed_topics.json"
ASK = ("Write one realistic message that a user might send to an AI assistant about {topic}. "
       "Reply with the user's message only, without any introduction or answer.")
REQUEST_TEMPERATURE = 1.0  # varied requests: each topic is asked again and again
MAX_REQUEST_TOKENS = 128
MIN_REQUEST_CHARS = 15
MAX_REQUEST_CHARS = 600
# Rounds over every topic, at most: a target whose answers the filter mostly rejects ends with
# fewer requests instead of asking forever.
MAX_ROUNDS_PER_TOPIC_SHARE = 3
# Openings of an answer that introduces the request instead of being it.
PREAMBLES = ("sure", "here is", "here's", "certainly", "of course", "as an ai", "i'm sorry",
             "i am sorry", "user:", "message:")


def read_seed_topics(path: str | Path = SEED_TOPICS_PATH) -> list[str]:
    """The topics of `path`, a JSON list of non-empty strings; `ValueError` naming the file
    otherwise."""
    topics = json.loads(Path(path).read_text())
    if not isinstance(topics, list) or not topics or not all(
            isinstance(t, str) and t.strip() for t in topics):
        raise ValueError(f"{path}: not a JSON list of non-empty topic strings")
    return topics


def cleaned_request(text: str) -> str | None:
    """The request in the target's answer: stripped of quotes; None when it is out of length
    bounds or opens with a preamble instead of the request."""
    text = text.strip().strip('"').strip()
    if not MIN_REQUEST_CHARS <= len(text) <= MAX_REQUEST_CHARS:
        return None
    if text.casefold().startswith(PREAMBLES):
        return None
    return text


def _normalized(text: str) -> str:
    return " ".join(text.split()).casefold()


def chat_instructions(engine: Engine, num: int, seed: int,
                      topics: list[str] | None = None) -> list[str]:
    """`num` distinct requests (fewer when `MAX_ROUNDS_PER_TOPIC_SHARE` rounds do not find
    them), asked round-robin over the topics, draw i seeded `seed + i`."""
    topics = read_seed_topics() if topics is None else topics
    rounds = MAX_ROUNDS_PER_TOPIC_SHARE * max(1, -(-num // len(topics)))
    asks = [chat_prompt(engine.tokenizer, ASK.format(topic=t)) for t in topics]
    requests: list[str] = []
    seen: set[str] = set()
    draws = 0
    for _ in range(rounds):
        params = [{"temperature": REQUEST_TEMPERATURE, "max_new_tokens": MAX_REQUEST_TOKENS,
                   "stop": CHAT_STOP, "seed": seed + draws + i} for i in range(len(asks))]
        draws += len(asks)
        for out in engine.generate(asks, params):
            request = cleaned_request(out["text"])
            if request is not None and _normalized(request) not in seen:
                seen.add(_normalized(request))
                requests.append(request)
        logger.info("self-instruct: %d/%d requests after %d draws", len(requests), num, draws)
        if len(requests) >= num:
            break
    return requests[:num]
