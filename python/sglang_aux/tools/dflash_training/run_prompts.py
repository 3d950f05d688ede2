"""The prompts one training run reads, from its flags: the training questions, code tasks
and chat requests whose continuations it generates (greedy, then sampled passes inside the
generation budget), the evaluation prompts its training data must not hold, and the held-out
sets `--eval` measures accept length on."""

from __future__ import annotations

import argparse
import logging
import time
from pathlib import Path

from sglang_aux.srt.entrypoints.engine import Engine
from sglang_aux.srt.model_loader.tokenizer import Tokenizer
from sglang_aux.test.chat_prompts import CHAT_STOP, chat_prompt, read_chat_prompts
from sglang_aux.test.few_shot_gsm8k import STOP as GSM8K_STOP
from sglang_aux.test.gsm8k_data import gsm8k_path
from sglang_aux.test.humaneval import STOP as HUMANEVAL_STOP
from sglang_aux.test.humaneval import humaneval_path, read_problems
from sglang_aux.tools.dflash_training.code_tasks import CodeTask, code_tasks, load_tasks
from sglang_aux.tools.dflash_training.data import (
    BadInputError,
    Sample,
    by_source,
    generate_samples,
    gsm8k_prompts,
    gsm8k_questions,
)
from sglang_aux.tools.dflash_training.evaluate import EVAL_TASKS, EvalSet
from sglang_aux.tools.dflash_training.prompt_mix import prompt_sets

logger = logging.getLogger("train_dflash")


def train_prompts(args: argparse.Namespace) -> list[str]:
    """The training questions' prompts: the train file without its shots and the last
    `--holdout` questions, the first `--num-samples` of them."""
    prompts = gsm8k_prompts(args.data_path, args.data_path, args.num_shots, None)
    return prompts[: len(prompts) - args.holdout][: args.num_samples]


def gsm8k_eval_prompts(args: argparse.Namespace) -> tuple[list[str], str]:
    """Evaluation prompts and where they come from: the held-out train questions with
    `--holdout`, else the first `--eval-num-prompts` of `--eval-data-path`."""
    if args.holdout:
        prompts = gsm8k_prompts(args.data_path, args.data_path, args.num_shots, None)
        return (prompts[len(prompts) - args.holdout:][: args.eval_num_prompts],
                f"the last {args.holdout} train questions, held out")
    prompts = gsm8k_prompts(args.eval_data_path, args.data_path, args.num_shots,
                            args.eval_num_prompts)
    return prompts, f"`{Path(args.eval_data_path).name}`"


def accept_sets(args: argparse.Namespace, target: str) -> dict[str, tuple[EvalSet, str]]:
    """Each `--eval-tasks` kind's prompts, and their description for the card."""
    tasks = args.eval_tasks or (list(EVAL_TASKS) if args.code_tasks or args.chat_instructions
                                else ["gsm8k"])
    n, sets = args.eval_num_prompts, {}
    if "gsm8k" in tasks:
        prompts, source = gsm8k_eval_prompts(args)
        sets["gsm8k"] = (EvalSet(prompts, GSM8K_STOP, args.max_new_tokens),
                         f"held-out GSM8K prompts ({source}, {args.num_shots}-shot)")
    if "humaneval" in tasks:
        path = Path(args.humaneval_path or humaneval_path())
        sets["humaneval"] = (EvalSet([p.prompt for p in read_problems(path)[:n]],
                                     HUMANEVAL_STOP, args.code_chat_max_new_tokens),
                             f"HumanEval prompts as completions (`{path.name}`)")
    if "chat" in tasks:
        tokenizer = Tokenizer.from_dir(target)
        chat_path, chat = read_chat_prompts()
        sets["chat"] = (EvalSet([chat_prompt(tokenizer, c) for c in chat[:n]], CHAT_STOP,
                                args.code_chat_max_new_tokens),
                        f"chat prompts in the target's template (`{chat_path.name}`)")
    return sets



def run_code_tasks(args: argparse.Namespace) -> list[CodeTask]:
    """The run's `--code-tasks`: the first of `--code-tasks-file`, else drawn from this
    machine's packages; a file that is not tasks, or holds too few, stops in one line."""
    if args.code_tasks_file is None:
        return code_tasks(args.code_tasks, args.seed)
    try:
        tasks = load_tasks(args.code_tasks_file)
    except ValueError as e:
        raise BadInputError(str(e)) from None
    if len(tasks) < args.code_tasks:
        raise BadInputError(f"{args.code_tasks_file}: {len(tasks)} code tasks, "
                            f"--code-tasks asks for {args.code_tasks}")
    return tasks[: args.code_tasks]


def generate_run_samples(args: argparse.Namespace, engine: Engine, started: float) -> list[Sample]:
    """Greedy continuations of the mix's prompts, then up to `--sampled-passes` sampled ones:
    a pass starts only when, at the pace of the last one, it ends inside `--gen-budget-s`."""
    sets = prompt_sets(engine, gsm8k=train_prompts(args), tasks=run_code_tasks(args),
                       num_chat_instructions=args.chat_instructions, seed=args.seed,
                       gsm8k_max_new_tokens=args.max_new_tokens,
                       max_new_tokens=args.code_chat_max_new_tokens)
    num_prompts = sum(len(p.prompts) for p in sets)

    def one_pass(temperature: float, seed: int) -> list[Sample]:
        out = []
        for p in sets:
            out += generate_samples(engine, p.prompts, p.max_new_tokens, temperature,
                                    seed + len(out), stop=p.stop, source=p.source)
        return out

    t0 = time.perf_counter()
    samples = one_pass(0.0, 0)
    for k in range(args.sampled_passes):
        pace = time.perf_counter() - t0
        if args.gen_budget_s is not None and (
                time.perf_counter() - started + pace > args.gen_budget_s):
            logger.info("generation budget %.0f s: %d of %d sampled passes", args.gen_budget_s,
                        k, args.sampled_passes)
            break
        t0 = time.perf_counter()
        samples += one_pass(args.sample_temperature, (k + 1) * num_prompts)
    return samples



def evaluation_prompts_by_file(args: argparse.Namespace, samples: list[Sample]
                               ) -> dict[str, list[str]]:
    """Every prompt the recipe evaluates on, by file: all GSM8K test questions (the served
    evaluation reads them all), with `--holdout` the held-out train questions, and when the
    samples hold code or chat prompts, HumanEval's prompts and signatures and the chat
    evaluation prompts (a GSM8K prompt holds none of those)."""
    test = args.eval_data_path or str(gsm8k_path("test"))
    sets = {test: gsm8k_questions(test, args.data_path, args.num_shots)}
    if args.holdout:
        train_q = gsm8k_questions(args.data_path, args.data_path, args.num_shots)
        sets[f"{args.data_path} (the last {args.holdout}, held out)"] = train_q[-args.holdout:]
    if set(by_source(samples)) - {"gsm8k"}:
        path = Path(args.humaneval_path or humaneval_path())
        problems = read_problems(path)
        sets[f"{path} (prompts)"] = [p.prompt for p in problems]
        sets[f"{path} (signatures)"] = [p.signature() for p in problems]
        chat_path, chat = read_chat_prompts()
        sets[str(chat_path)] = chat
    return sets
