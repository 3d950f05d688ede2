"""Chat prompts: a user's message in the target's chat template, where its answer stops, and
the evaluation's own chat prompts (`data/chat_prompts.json`, written for this repository and in
no training data)."""

from __future__ import annotations

import json
from pathlib import Path

from sglang_aux.srt.entrypoints.openai.protocol import ChatMessage
from sglang_aux.srt.entrypoints.openai.serving_chat import render_chat
from sglang_aux.srt.model_loader.tokenizer import Tokenizer

CHAT_PROMPTS_PATH = Path(__file__).resolve().parents[1] / "data" / "chat_prompts.json"
# The end-of-turn texts of ChatML (Qwen, SmolLM2) and of the tiny presets' tokenizers
CHAT_STOP = ["<|im_end|>", "</s>", "<|endoftext|>"]


def chat_prompt(tokenizer: Tokenizer, message: str) -> str:
    """`message` as the user's turn of the target's chat template, the assistant's turn open."""
    return render_chat(tokenizer, [ChatMessage(role="user", content=message)])


def read_chat_prompts(path: Path = CHAT_PROMPTS_PATH) -> tuple[Path, list[str]]:
    """(the file, its prompts): a JSON list of non-empty strings; `ValueError` naming the file
    otherwise."""
    prompts = json.loads(Path(path).read_text())
    if not isinstance(prompts, list) or not prompts or not all(
            isinstance(p, str) and p.strip() for p in prompts):
        raise ValueError(f"{path}: not a JSON list of non-empty strings")
    return Path(path), prompts
