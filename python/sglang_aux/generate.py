"""Offline generation with the Engine: `python -m sglang_aux.generate [--prompt TEXT ...]`.

With no flags it runs the built-in default model on the best local device, so a fresh
checkout can see the runtime work end to end. Each prompt is a user message put through the
model's chat template when it has one (`--raw` sends the text as it is).
"""

from __future__ import annotations

import argparse
import json
import time

from sglang_aux.srt.entrypoints.engine import Engine
from sglang_aux.srt.entrypoints.openai.protocol import ChatMessage
from sglang_aux.srt.entrypoints.openai.serving_chat import render_chat
from sglang_aux.srt.model_loader.tokenizer import Tokenizer
from sglang_aux.srt.server_args import HelpFormatter, ServerArgs

DEFAULT_PROMPTS = [
    "Natalia sold clips to 48 of her friends in April, and then she sold half as many clips "
    "in May. How many clips did Natalia sell altogether in April and May?",
    "What is the capital of France?",
    "Write a Python function that returns the n-th Fibonacci number.",
]


def make_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0],
                                     formatter_class=HelpFormatter)
    ServerArgs.add_cli_args(parser, serving=False)
    parser.add_argument("--prompt", action="append",
                        help="a prompt; repeat for a batch (default: three built-in prompts)")
    parser.add_argument("--raw", action="store_true",
                        help="send each prompt as it is, without the chat template")
    parser.add_argument("--max-new-tokens", type=int, default=32, help="tokens per answer")
    parser.add_argument("--temperature", type=float, default=0.0, help="0: greedy")
    return parser


def prompt_text(tokenizer: Tokenizer, prompt: str, raw: bool) -> str:
    """`prompt` as one user turn of the chat template, or as it is (`raw`, or no template)."""
    if raw or tokenizer.chat_template is None:
        return prompt
    return render_chat(tokenizer, [ChatMessage(role="user", content=prompt)])


def main(argv: list[str] | None = None) -> list[dict]:
    parser = make_parser()
    args = parser.parse_args(argv)
    engine = Engine(ServerArgs.from_parsed(parser, args))
    prompts = args.prompt or DEFAULT_PROMPTS
    texts = [prompt_text(engine.tokenizer, p, args.raw) for p in prompts]
    params = {"max_new_tokens": args.max_new_tokens, "temperature": args.temperature}
    start = time.perf_counter()
    try:
        outs = engine.generate(texts, params)
        seconds = time.perf_counter() - start
    finally:
        engine.shutdown()  # under --tp-size, the other ranks stop
    for prompt, out in zip(prompts, outs, strict=True):
        print(f"--- {prompt!r}\n{out['text']!r}\n{json.dumps(out['meta_info'])}")
    tokens = sum(o["meta_info"]["completion_tokens"] for o in outs)
    print(f"model {engine.server_args.model_path} on {engine.worker.model_runner.device}: "
          f"{tokens} tokens in {seconds:.2f} s ({tokens / seconds:.1f} tok/s)")
    return outs


if __name__ == "__main__":
    main()
