"""The evaluation a user reads: target-only against target + draft, each configuration its own
server (`python -m sglang_aux.launch_server`), on the prompts users send a coder model:

    python -m sglang_aux.test.user_eval --model-path qwen2.5-coder-1.5b-instruct \
        --draft qwen2.5-coder-1.5b-instruct-dflash-b16 --out OUT

- HumanEval: each problem's prompt as a completion, greedy, `--max-new-tokens` (512), stopped
  where HumanEval stops; pass@1 from running every completion with its tests in a sandboxed
  subprocess (`code_sandbox.py`: no network, time and memory limits);
- GSM8K test: the few-shot harness's prompts (`few_shot_gsm8k`), accuracy;
- chat: `data/chat_prompts.json` (`chat_prompts.py`; in no training data) in the target's chat
  template.
For each, one at a time (the first `--num-sequential` prompts) and `--parallel` at a time: mean
accept length (per request) and output tokens/s, and the server's steps (tokens verified per
token kept, the scheduler's step counters over the run). Prints the tables and writes them as
JSON (`OUT/user_eval.json`); the servers' logs go to OUT too.
"""

from __future__ import annotations

import argparse
import json
import os
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass
from pathlib import Path

from sglang_aux.srt.model_loader.builtin import resolve_model_path
from sglang_aux.srt.model_loader.tokenizer import Tokenizer
from sglang_aux.test.chat_prompts import CHAT_STOP, chat_prompt, read_chat_prompts
from sglang_aux.test.code_sandbox import DEFAULT_TIMEOUT_S, run_program
from sglang_aux.test.few_shot_gsm8k import (
    STOP as GSM8K_STOP,
)
from sglang_aux.test.few_shot_gsm8k import (
    Client,
    build_prompt,
    few_shot_prefix,
    get_answer_value,
    label_of,
    read_jsonl,
    verify_tokens_per_kept,
)
from sglang_aux.test.gsm8k_data import data_paths
from sglang_aux.test.humaneval import STOP as HUMANEVAL_STOP
from sglang_aux.test.humaneval import Problem, read_problems
from sglang_aux.test.server_utils import launched_server

TASKS = ("humaneval", "gsm8k", "chat")
CONFIGS = ("target", "dflash")


@dataclass
class Run:
    """One configuration, task and concurrency."""

    config: str
    task: str
    parallel: int
    num_prompts: int
    accept_length: float  # mean per request (1 for target-only)
    output_throughput: float  # tokens/s
    latency: float
    completion_tokens: int
    score: float | None = None  # pass@1 (HumanEval) or accuracy (GSM8K) of the whole run
    # a scored HumanEval run: each problem's sandbox verdict (passed, failed, timeout, ...)
    verdicts: dict[str, str] | None = None
    # tokens the target verified per token a request kept (None: no speculation)
    verify_tokens_per_accepted: float | None = None
    # what the server's scheduler counted during the run (`/get_server_info`'s
    # `scheduler_stats`, after less before; its maxima left out): steps of each kind,
    # prefill interruptions, seconds
    step_stats: dict[str, float] | None = None


@dataclass(frozen=True)
class Task:
    prompts: list[str]
    stop: list[str]


def sandbox_verdicts(problems: list[Problem], completions: list[str], timeout_s: float,
                     workers: int) -> dict[str, str]:
    """Each problem's verdict (task id -> `code_sandbox.Verdict`), its completion run with its
    tests sandboxed."""
    with ThreadPoolExecutor(workers) as pool:
        results = list(pool.map(lambda pc: run_program(pc[0].program(pc[1]), timeout_s=timeout_s),
                                zip(problems, completions, strict=True)))
    return {p.task_id: r.verdict for p, r in zip(problems, results, strict=True)}


def pass_at_1(verdicts: dict[str, str]) -> float:
    """The share of problems whose completion passed its tests."""
    return sum(v == "passed" for v in verdicts.values()) / max(len(verdicts), 1)


def _generate(client: Client, prompts: list[str], stop: list[str], max_new_tokens: int,
              parallel: int) -> tuple[list[dict], float]:
    params = {"temperature": 0, "max_new_tokens": max_new_tokens, "stop": stop}
    with ThreadPoolExecutor(parallel) as pool:
        start = time.perf_counter()
        outs = list(pool.map(lambda p: client.call("/generate", {"text": p,
                                                                 "sampling_params": params}),
                             prompts))
    return outs, time.perf_counter() - start


def _run(config: str, task: str, outs: list[dict], latency: float, parallel: int,
         score: float | None, verdicts: dict[str, str] | None,
         step_stats: dict[str, float] | None = None) -> Run:
    metas = [o["meta_info"] for o in outs]
    tokens = sum(m["completion_tokens"] for m in metas)
    accept = [m.get("spec_accept_length") or 1.0 for m in metas]
    return Run(config, task, parallel, len(outs), sum(accept) / len(accept),
               tokens / latency if latency > 0 else 0.0, latency, tokens, score, verdicts,
               verify_tokens_per_kept(metas), step_stats)


def _scheduler_stats(client: Client) -> dict:
    return client.call("/get_server_info")["scheduler_stats"]


def stats_delta(before: dict, after: dict) -> dict[str, float]:
    """What a run added to each of the scheduler's counters (those that changed; maxima, which
    do not add, left out)."""
    return {k: v - before.get(k, 0) for k, v in after.items()
            if isinstance(v, int | float) and not k.startswith("max_")
            and v != before.get(k, 0)}


def make_tasks(args: argparse.Namespace, tokenizer: Tokenizer
               ) -> tuple[dict[str, Task], list[Problem], list[int]]:
    """The tasks' prompts, HumanEval's problems and GSM8K's labels."""
    tasks: dict[str, Task] = {}
    problems: list[Problem] = []
    labels: list[int] = []
    if "humaneval" in args.tasks:
        problems = read_problems(args.humaneval_path)[: args.num_humaneval]
        tasks["humaneval"] = Task([p.prompt for p in problems], HUMANEVAL_STOP)
    if "gsm8k" in args.tasks:
        test, train = data_paths(args.gsm8k_data_path)
        questions = read_jsonl(test)[: args.num_gsm8k]
        prefix = few_shot_prefix(read_jsonl(train)[: args.num_shots])
        labels = [label_of(q["answer"]) for q in questions]
        tasks["gsm8k"] = Task([build_prompt(prefix, q["question"]) for q in questions],
                              GSM8K_STOP)
    if "chat" in args.tasks:
        _, chat = read_chat_prompts()
        tasks["chat"] = Task([chat_prompt(tokenizer, c) for c in chat[: args.num_chat]],
                             CHAT_STOP)
    return tasks, problems, labels


def evaluate_config(args: argparse.Namespace, config: str, tasks: dict[str, Task],
                    problems: list[Problem], labels: list[int]) -> tuple[list[Run], dict]:
    """Serve `config`, run every task at every concurrency; also returns the texts of the
    widest run of each task (the completions scored)."""
    flags = ["--model-path", args.model_path, *args.server_flags.split()]
    if config == "dflash":
        flags += ["--speculative-algorithm", "DFLASH", "--speculative-draft-model-path",
                  args.draft]
    runs, texts = [], {}
    with launched_server(flags, Path(args.out) / f"server_{config}.log",
                         timeout_s=args.start_timeout) as url:
        host, port = url.rsplit(":", 1)
        client = Client(host, int(port), None)
        for name, task in tasks.items():
            for parallel in sorted(args.parallel):
                prompts = task.prompts[: args.num_sequential] if parallel == 1 else task.prompts
                before = _scheduler_stats(client)
                outs, latency = _generate(client, prompts, task.stop, args.max_new_tokens,
                                          parallel)
                steps = stats_delta(before, _scheduler_stats(client))
                score = verdicts = None
                if parallel == max(args.parallel) or len(args.parallel) == 1:
                    texts[name] = [o["text"] for o in outs]
                    score, verdicts = _score(args, name, texts[name], problems, labels)
                runs.append(_run(config, name, outs, latency, parallel, score, verdicts,
                                 steps))
                print(_row(runs[-1]), flush=True)
    return runs, texts


def _score(args: argparse.Namespace, task: str, texts: list[str], problems: list[Problem],
           labels: list[int]) -> tuple[float | None, dict[str, str] | None]:
    """The run's score, and HumanEval's verdicts per problem."""
    if task == "humaneval":
        verdicts = sandbox_verdicts(problems, texts, args.sandbox_timeout, args.sandbox_workers)
        return pass_at_1(verdicts), verdicts
    if task == "gsm8k":
        return sum(get_answer_value(t) == y for t, y in zip(texts, labels, strict=True)
                   ) / max(len(labels), 1), None
    return None, None


def _steps_row(r: Run) -> str:
    ratio = "" if r.verify_tokens_per_accepted is None else f"{r.verify_tokens_per_accepted:.2f}"
    n = {k: int((r.step_stats or {}).get(k, 0)) for k in (
        "decode_steps", "mixed_steps", "prefill_steps", "prefill_interruptions")}
    return (f"| {r.config} | {r.task} | {r.parallel} | {ratio} | {n['decode_steps']} "
            f"| {n['mixed_steps']} | {n['prefill_steps']} | {n['prefill_interruptions']} |")


def _row(r: Run) -> str:
    score = "" if r.score is None else f"{r.score:.3f}"
    return (f"| {r.config} | {r.task} | {r.parallel} | {r.num_prompts} | {r.accept_length:.2f} "
            f"| {r.output_throughput:.1f} | {score} |")


def make_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add = p.add_argument
    add("--model-path", default="smollm2-135m-instruct", help="target folder or built-in name")
    add("--draft", default=None, help="the DFlash draft (folder or name); needed by `dflash`")
    add("--configs", nargs="+", choices=CONFIGS, default=list(CONFIGS))
    add("--tasks", nargs="+", choices=TASKS, default=list(TASKS))
    add("--parallel", nargs="+", type=int, default=[1, 32],
        help="concurrent requests; the widest run's outputs are scored")
    add("--num-sequential", type=int, default=16, help="prompts of a task one at a time")
    add("--max-new-tokens", type=int, default=512)
    add("--num-humaneval", type=int, default=None, help="first N problems (default: all 164)")
    add("--num-gsm8k", type=int, default=200, help="first N GSM8K test questions")
    add("--num-chat", type=int, default=None, help="first N chat prompts (default: all)")
    add("--num-shots", type=int, default=5)
    add("--humaneval-path", default=None, help="HumanEval jsonl(.gz) (default: "
        "`humaneval.humaneval_path`)")
    add("--gsm8k-data-path", default=None, help="GSM8K test jsonl (default: as the harness)")
    add("--server-flags", default="", help="more flags for every server")
    add("--start-timeout", type=float, default=300.0, help="seconds a server may take to start")
    add("--sandbox-timeout", type=float, default=DEFAULT_TIMEOUT_S,
        help="seconds (wall and CPU) a completion's tests may run")
    add("--sandbox-workers", type=int, default=os.cpu_count() or 1)
    add("--out", required=True, help="folder for user_eval.json and the servers' logs")
    return p


def main(argv: list[str] | None = None) -> dict:
    """Run every configuration; print and write the table, and whether DFlash scored as
    target-only did (greedy DFlash is lossless, so its completions should be the same)."""
    args = make_parser().parse_args(argv)
    if "dflash" in args.configs and not args.draft:
        raise SystemExit("user_eval: error: --configs dflash needs --draft")
    Path(args.out).mkdir(parents=True, exist_ok=True)
    tokenizer = Tokenizer.from_dir(resolve_model_path(args.model_path))
    tasks, problems, labels = make_tasks(args, tokenizer)
    print("| config | task | parallel | prompts | accept length | tokens/s | pass@1 / accuracy |")
    print("|---|---|---|---|---|---|---|")
    runs, texts = [], {}
    for config in args.configs:
        config_runs, texts[config] = evaluate_config(args, config, tasks, problems, labels)
        runs += config_runs
        # written after each configuration: a later one that fails keeps the earlier's runs
        result = _result(args, tasks, runs, texts)
        (Path(args.out) / "user_eval.json").write_text(json.dumps(result, indent=1))
    print("\n| config | task | parallel | verify tokens / kept | decode steps | mixed steps "
          "| prefill steps | prefill interruptions |")
    print("|---|---|---|---|---|---|---|---|")
    for r in runs:
        print(_steps_row(r))
    same = result["same_outputs"]
    if same:
        print("DFlash outputs equal target-only's: " +
              ", ".join(f"{t} {'yes' if s else 'NO'}" for t, s in same.items()))
    if result["humaneval_verdicts_differ"]:
        print("HumanEval verdicts that differ (target-only, DFlash): " + ", ".join(
            f"{k} ({a}, {b})" for k, (a, b) in result["humaneval_verdicts_differ"].items()))
    return result


def _result(args: argparse.Namespace, tasks: dict[str, Task], runs: list[Run],
            texts: dict[str, dict[str, list[str]]]) -> dict:
    same = ({t: texts["target"][t] == texts["dflash"][t] for t in tasks}
            if set(texts) == set(CONFIGS) else {})
    return {"model": args.model_path, "draft": args.draft,
            "max_new_tokens": args.max_new_tokens, "runs": [asdict(r) for r in runs],
            "same_outputs": same, "humaneval_verdicts_differ": _differing_verdicts(runs)}


def _differing_verdicts(runs: list[Run]) -> dict[str, tuple[str, str]]:
    """HumanEval problems whose verdict differs between target-only and DFlash (their scored
    runs), task id -> (target-only's, DFlash's); empty with one configuration."""
    scored = {r.config: r.verdicts for r in runs if r.task == "humaneval" and r.verdicts}
    if set(scored) != set(CONFIGS):
        return {}
    target, dflash = scored["target"], scored["dflash"]
    return {k: (target[k], dflash[k]) for k in target if target[k] != dflash[k]}


if __name__ == "__main__":
    main()
