"""Offline generation with the Engine: `python -m sglang_aux.generate [--prompt TEXT ...]`.

With no flags it serves the built-in default model on the best local device, so a fresh
checkout can see the runtime work end to end.
"""

from __future__ import annotations

import argparse
import json
import time

from sglang_aux.srt.entrypoints.engine import Engine
from sglang_aux.srt.server_args import ServerArgs

DEFAULT_PROMPTS = [
    "Question: Natalia sold clips to 48 of her friends in April. How many clips did she sell?\n"
    "Answer:",
    "The capital of France is",
    "def fibonacci(n):",
]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ServerArgs.add_cli_args(parser)
    parser.add_argument("--prompt", action="append", help="repeat for a batch")
    parser.add_argument("--max-new-tokens", type=int, default=32)
    parser.add_argument("--temperature", type=float, default=0.0)
    args = parser.parse_args()
    engine = Engine(ServerArgs.from_cli_args(args))
    prompts = args.prompt or DEFAULT_PROMPTS
    params = {"max_new_tokens": args.max_new_tokens, "temperature": args.temperature}
    start = time.perf_counter()
    outs = engine.generate(prompts, params)
    seconds = time.perf_counter() - start
    for prompt, out in zip(prompts, outs, strict=True):
        print(f"--- {prompt!r}\n{out['text']!r}\n{json.dumps(out['meta_info'])}")
    tokens = sum(o["meta_info"]["completion_tokens"] for o in outs)
    print(f"model {engine.server_args.model_path} on {engine.worker.model_runner.device}: "
          f"{tokens} tokens in {seconds:.2f} s ({tokens / seconds:.1f} tok/s)")


if __name__ == "__main__":
    main()
