"""Few-shot GSM8K accuracy of a running server: `python -m sglang_aux.test.few_shot_gsm8k`.

Every prompt is the first `--num-shots` train questions with their worked answers, then the
test question; greedy `/generate` requests go out `--parallel` at a time and stop at the next
`Question`. The model's answer is the last integer of its output, the label the number after
`####`. Prints Accuracy, Invalid, Latency, Output throughput, the mean accept length and the
target tokens verified per accepted token (speculative decoding; 0 without it: DSpark's
compact verify spends fewer), and appends them as one JSON line to `--result-file`.
The questions: `--data-path`, else `gsm8k_data.gsm8k_path` (`$SGLANG_AUX_GSM8K_DIR`, the copy
beside the checkout, or the official files, downloaded into the cache on first use).
"""

from __future__ import annotations

import argparse
import json
import re
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Iterable, Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from sglang_aux.test.gsm8k_data import DATA_DIR_ENV, data_paths

INVALID = -9999999
STOP = ["Question", "</s>", "<|im_end|>"]
REQUEST_TIMEOUT_S = 600
# A leading minus counts unless it follows a number or ")" (then it is a subtraction: "18 - 6").
_INTEGER = re.compile(r"(?<![\d)])(?<![\d)]\s)-?\d+")


def read_jsonl(path: Path) -> list[dict]:
    with open(path) as f:
        return [json.loads(line) for line in f if line.strip()]


def get_answer_value(text: str) -> int:
    """The last integer in `text` (thousands separators dropped), or INVALID."""
    numbers = _INTEGER.findall(text.replace(",", ""))
    return int(numbers[-1]) if numbers else INVALID


def label_of(answer: str) -> int:
    """The number after `####` in a GSM8K worked answer."""
    if "####" not in answer:
        raise ValueError(f"no '####' in GSM8K answer {answer!r}")
    return get_answer_value(answer.split("####")[-1])


def few_shot_prefix(shots: list[dict]) -> str:
    return "".join(f"Question: {s['question']}\nAnswer: {s['answer']}\n\n" for s in shots)


def build_prompt(prefix: str, question: str) -> str:
    return f"{prefix}Question: {question}\nAnswer:"


def _progress(items: Iterable, total: int) -> Iterator:
    """tqdm when installed, else a counter on stderr."""
    try:
        from tqdm import tqdm
    except ImportError:
        for i, item in enumerate(items, 1):
            print(f"\r{i}/{total}", end="" if i < total else "\n", file=sys.stderr, flush=True)
            yield item
        return
    yield from tqdm(items, total=total)


def verify_tokens_per_kept(metas: list[dict]) -> float | None:
    """Tokens the target verified per token the requests kept (their `meta_info`s); None
    without speculation."""
    verified = sum(m.get("spec_verify_tokens", 0) for m in metas)
    kept = sum(m.get("spec_accepted_drafts", 0) + m.get("spec_verify_ct", 0) for m in metas)
    return verified / kept if verified and kept else None


class Client:
    """Blocking JSON calls to the server (the standard library only; one per thread is fine)."""

    def __init__(self, host: str, port: int, api_key: str | None):
        base = host if host.startswith("http") else f"http://{host}"
        self.url = f"{base}:{port}"
        self.headers = {"Content-Type": "application/json"}
        if api_key:
            self.headers["Authorization"] = f"Bearer {api_key}"

    def call(self, path: str, payload: dict | None = None) -> dict:
        data = None if payload is None else json.dumps(payload).encode()
        req = urllib.request.Request(self.url + path, data=data, headers=self.headers)
        try:
            with urllib.request.urlopen(req, timeout=REQUEST_TIMEOUT_S) as resp:
                return json.loads(resp.read())
        except urllib.error.HTTPError as e:
            raise RuntimeError(f"{path}: HTTP {e.code}: {e.read().decode(errors='replace')}") \
                from None


def run_eval(args: argparse.Namespace) -> dict:
    """Run the evaluation and return its metrics (also printed and appended to the result
    file)."""
    data_path, shots_path = data_paths(args.data_path)
    questions = read_jsonl(data_path)[: args.num_questions]
    shots = read_jsonl(data_path if args.shots_from == "test" else shots_path)[: args.num_shots]
    prefix = few_shot_prefix(shots)
    labels = [label_of(q["answer"]) for q in questions]
    client = Client(args.host, args.port, args.api_key)
    model = client.call("/get_model_info")["model_path"]
    params = {"temperature": 0, "max_new_tokens": args.max_new_tokens, "stop": STOP}

    def ask(q: dict) -> dict | str:
        try:
            return client.call("/generate", {"text": build_prompt(prefix, q["question"]),
                                             "sampling_params": params})
        except (RuntimeError, OSError) as e:  # counted, so one bad question cannot end a run
            return str(e)

    start = time.perf_counter()
    with ThreadPoolExecutor(args.parallel) as pool:
        outs = list(_progress(pool.map(ask, questions), len(questions)))
    latency = time.perf_counter() - start

    answered = [o for o in outs if isinstance(o, dict)]
    errors = [o for o in outs if isinstance(o, str)]
    preds = [get_answer_value(o["text"]) if isinstance(o, dict) else INVALID for o in outs]
    n = max(len(questions), 1)
    tokens = sum(o["meta_info"]["completion_tokens"] for o in answered)
    accept = [o["meta_info"]["spec_accept_length"] for o in answered]
    verified = verify_tokens_per_kept([o["meta_info"] for o in answered])
    metrics = {
        "task": "gsm8k",
        "model": model,
        "num_questions": len(questions),
        "num_shots": args.num_shots,
        "shots_from": args.shots_from,
        "parallel": args.parallel,
        "max_new_tokens": args.max_new_tokens,
        "accuracy": sum(p == y for p, y in zip(preds, labels, strict=True)) / n,
        "invalid": sum(p == INVALID for p in preds) / n,
        "num_errors": len(errors),
        "latency": latency,
        "output_throughput": tokens / latency if latency > 0 else 0.0,
        "accept_length": sum(accept) / len(accept) if accept else 0.0,
        "verify_tokens_per_accepted": verified or 0.0,
    }
    if errors:
        print(f"Errors: {len(errors)} (first: {errors[0]})")
    print(f"Accuracy: {metrics['accuracy']:.3f}")
    print(f"Invalid: {metrics['invalid']:.3f}")
    print(f"Latency: {latency:.3f} s")
    print(f"Output throughput: {metrics['output_throughput']:.3f} token/s")
    print(f"Accept length: {metrics['accept_length']:.3f}")
    print(f"Verify tokens per accepted token: {metrics['verify_tokens_per_accepted']:.3f}")
    if args.result_file:
        with open(args.result_file, "a") as f:
            f.write(json.dumps(metrics) + "\n")
    return metrics


def make_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--data-path", default=None,
                        help=f"GSM8K test jsonl; train.jsonl beside it gives the shots "
                             f"(default: ${DATA_DIR_ENV}, the copy beside the checkout, or "
                             "the official files, downloaded into the cache on first use)")
    parser.add_argument("--num-shots", type=int, default=5)
    parser.add_argument("--shots-from", choices=("train", "test"), default="train",
                        help="where the shots come from: the train file (default), or the "
                             "first test questions, as SGLang 0.5.23's `few_shot_gsm8k` takes "
                             "them (its first questions then see their own answers)")
    parser.add_argument("--num-questions", type=int, default=200)
    parser.add_argument("--parallel", type=int, default=64, help="concurrent requests")
    parser.add_argument("--max-new-tokens", type=int, default=512)
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=30000)
    parser.add_argument("--api-key", default=None)
    parser.add_argument("--result-file", default=None, help="append the metrics as JSON here")
    return parser


def main(argv: list[str] | None = None) -> dict:
    """Parse flags, run, and return the metrics."""
    return run_eval(make_parser().parse_args(argv))


if __name__ == "__main__":
    main()
