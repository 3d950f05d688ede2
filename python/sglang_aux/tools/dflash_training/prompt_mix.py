"""The training prompts of a recipe's mix: how many GSM8K train questions, code tasks and chat
requests (recipe fields `num_samples`, `code_tasks`, `chat_instructions`), each kind with the
stops and the length its answers are generated with."""

from __future__ import annotations

import logging
from dataclasses import dataclass

from sglang_aux.srt.entrypoints.engine import Engine
from sglang_aux.test.chat_prompts import CHAT_STOP, chat_prompt
from sglang_aux.test.few_shot_gsm8k import STOP as GSM8K_STOP
from sglang_aux.tools.dflash_training.chat_instructions import chat_instructions
from sglang_aux.tools.dflash_training.code_tasks import COMPLETION_STOP, CodeTask
from sglang_aux.tools.dflash_training.data import Source

logger = logging.getLogger(__name__)


def _fitting(engine: Engine, prompts: list[str], max_new_tokens: int) -> list[str]:
    """The prompts whose answer fits the target's context (a long docstring may not)."""
    room = engine.model_config.context_len - max_new_tokens
    kept = [p for p in prompts if len(engine.tokenizer.encode(p)) <= room]
    if len(kept) < len(prompts):
        logger.info("%d of %d code prompts left out: longer than the context allows",
                    len(prompts) - len(kept), len(prompts))
    return kept


@dataclass(frozen=True)
class PromptSet:
    source: Source
    prompts: list[str]
    stop: list[str]
    max_new_tokens: int


def prompt_sets(engine: Engine, *, gsm8k: list[str], tasks: list[CodeTask],
                num_chat_instructions: int, seed: int, gsm8k_max_new_tokens: int,
                max_new_tokens: int) -> list[PromptSet]:
    """The non-empty sets, GSM8K first: the `gsm8k` prompts; the code `tasks`, completion
    prompts (the target writes the body) and instructions in the chat template; chat requests
    the target writes (self-instruct) in the chat template. Code and chat answers get
    `max_new_tokens`."""
    completions = [t.completion_prompt() for t in tasks if t.form == "completion"]
    instructions = [chat_prompt(engine.tokenizer, t.instruction())
                    for t in tasks if t.form == "instruction"]
    requests = (chat_instructions(engine, num_chat_instructions, seed)
                if num_chat_instructions else [])
    instructions = _fitting(engine, instructions, max_new_tokens)
    completions = _fitting(engine, completions, max_new_tokens)
    sets = [PromptSet("gsm8k", gsm8k, GSM8K_STOP, gsm8k_max_new_tokens),
            PromptSet("code", completions, COMPLETION_STOP + CHAT_STOP, max_new_tokens),
            PromptSet("code", instructions, CHAT_STOP, max_new_tokens),
            PromptSet("chat", [chat_prompt(engine.tokenizer, r) for r in requests], CHAT_STOP,
                      max_new_tokens)]
    return [s for s in sets if s.prompts]
