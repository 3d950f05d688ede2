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
import sys
import time
from functools import partial
from pathlib import Path

import torch

from sglang_aux.srt.configs.acceptance_profile import DRAFT_PROFILE, AcceptanceProfile
from sglang_aux.srt.entrypoints.engine import Engine
from sglang_aux.srt.model_loader.builtin import resolve_model_path
from sglang_aux.tools.build_token_map import coverage, token_map
from sglang_aux.tools.dflash_training.contamination import check_no_eval_prompts
from sglang_aux.tools.dflash_training.data import (
    BadInputError,
    Sample,
    describe_data,
    keep_prompt_fraction,
    load_samples,
    new_prompts_only,
    prompt_groups,
    prompt_owners,
    save_samples,
)
from sglang_aux.tools.dflash_training.dspark_objective import DSparkTrainer
from sglang_aux.tools.dflash_training.evaluate import measure_accept_lengths
from sglang_aux.tools.dflash_training.export import (
    TRAINING_RECORD,
    draft_config,
    dspark_draft_config,
    new_draft,
    render_card,
    set_card_eval,
    token_map_file,
    write_draft,
)
from sglang_aux.tools.dflash_training.feature_cache import FeatureCache, Features
from sglang_aux.tools.dflash_training.features import (
    MAX_FORWARD_TOKENS,
    check_rows_fit,
    extract_by_source,
    rows_to_keep,
)
from sglang_aux.tools.dflash_training.mxfp8_rows import MXFP8Rows
from sglang_aux.tools.dflash_training.run_prompts import (
    accept_sets,
    evaluation_prompts_by_file,
    generate_run_samples,
)
from sglang_aux.tools.dflash_training.sequence_set import SequenceSet
from sglang_aux.tools.dflash_training.snapshot import clear_snapshots, write_snapshot
from sglang_aux.tools.dflash_training.target_head import logsumexp_columns_count
from sglang_aux.tools.dflash_training.train_args import parse_args, resolve_mask_token
from sglang_aux.tools.dflash_training.trainer import TrainConfig, Trainer, held_out_index
from sglang_aux.tools.dflash_training.training_checkpoint import (
    TrainingCheckpoint,
    run_fingerprint,
)
from sglang_aux.tools.dflash_training.warm_start import init_from

logger = logging.getLogger("train_dflash")

EVAL_PARALLEL = 64  # concurrent evaluation requests, as the GSM8K harness's --parallel
# Seconds a deadline keeps for what follows training: writing the draft and its card.
DEADLINE_RESERVE_S = 20

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


def evaluate(args: argparse.Namespace, target: str) -> str:
    """Held-out accept length on each `--eval-tasks` kind; written into the card (one line)
    and returned as its text."""
    sets = accept_sets(args, target)
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


def _train_budget(args: argparse.Namespace, started: float) -> float | None:
    """Seconds training may take: `--train-budget-s`, cut to what `--deadline-s` leaves."""
    if args.deadline_s is None:
        return args.train_budget_s
    left = args.deadline_s - (time.perf_counter() - started) - DEADLINE_RESERVE_S
    return max(0.0, left if args.train_budget_s is None else min(left, args.train_budget_s))


def _extra_samples(args: argparse.Namespace, samples: list[Sample], decode,
                   eval_sets: dict[str, list[str]]) -> list[Sample]:
    """`--extra-samples-file`'s samples of prompts none before them has, each file checked
    for evaluation prompts under its own name."""
    extra: list[Sample] = []
    for path in args.extra_samples_file:
        more = load_samples(path)
        check_no_eval_prompts(more, decode, eval_sets, path)
        new = new_prompts_only(samples + extra, more)
        logger.info("%s: %d samples, %d of prompts not seen before", path, len(more), len(new))
        extra += new
    return extra


def _row_codec(runner, num_aux: int, dspark: bool, args: argparse.Namespace) -> MXFP8Rows:
    """`--mxfp8-rows`: the rows' hidden states (the aux states, and DSpark's final one) as
    MXFP8, the kept logsumexp's columns as bytes."""
    hidden, dtype = runner.model_config.hf_config.hidden_size, runner.model_config.dtype
    return MXFP8Rows(quantized=hidden * (num_aux + dspark),
                     raw=logsumexp_columns_count(dtype) if args.target_logsumexp else 0,
                     dtype=dtype, decoder=args.mxfp8_rows_decode)


def _row_bytes(runner, num_aux: int, dspark: bool, args: argparse.Namespace,
               codec: MXFP8Rows | None) -> int:
    """Bytes of a kept row: its encoding, else its columns (the codec's layout) in the
    target's dtype."""
    if codec is not None:
        return codec.width
    layout = _row_codec(runner, num_aux, dspark, args)
    return layout.columns * layout.dtype.itemsize


def _feature_key(args: argparse.Namespace, target: str) -> tuple:
    """What a run's samples and features depend on: the target and its engine, the samples
    file (and its cut), the layers the draft reads, what its rows hold (DSpark's final hidden
    state, the target's logsumexp), how and where they are kept."""
    files = tuple((str(path), path.stat().st_size, path.stat().st_mtime_ns)
                  for path in map(Path, [args.samples_file, *args.extra_samples_file]))
    cut = None if args.code_tasks or args.chat_instructions else args.num_samples
    return (target, tuple(sorted(_feature_engine_args(args).items())), files,
            cut, args.sample_fraction, args.num_aux_layers,
            args.algorithm,
            args.target_logsumexp, args.mxfp8_rows, args.mxfp8_rows_decode,
            args.device_reserve_gb)


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
        samples = generate_run_samples(args, engine, started)
        if args.samples_file:
            save_samples(samples, args.samples_file)
    if not kept and args.sample_fraction < 1:
        samples = keep_prompt_fraction(samples, args.sample_fraction)
    eval_sets = evaluation_prompts_by_file(args, samples)
    check_no_eval_prompts(samples, engine.tokenizer.decode, eval_sets,
                          args.samples_file or "the generated samples")
    if args.phase == "data":
        return None
    trainable = [samples[i] for i in SequenceSet.trainable(samples)]
    try:
        held_out_index(prompt_groups(trainable), args.val_samples, args.seed)
    except ValueError:
        raise BadInputError(f"--val-samples {args.val_samples} leaves none of the "
                            f"{len(trainable)} trainable sequences of "
                            f"{args.samples_file or 'the samples'} to train on") from None
    val_among = len(set(prompt_groups(trainable))) if args.extra_samples_file else None
    own = samples  # (what `features` keeps: the extra files' are read again)
    samples = samples + _extra_samples(args, samples, engine.tokenizer.decode, eval_sets)
    timings["engine and samples" if loaded else "engine and generation"] = (
        time.perf_counter() - t0)
    runner.model.requires_grad_(False)
    vocab = _draft_vocabulary(args, config, samples, engine.eos_token_ids)
    if args.train_over_token_map:
        config["dflash_config"]["token_map"] = token_map_file(vocab[0])
    cfg = TrainConfig(steps=args.steps, batch_size=args.batch_size, lr=args.lr,
                      anchors_per_seq=args.anchors_per_seq, gamma=args.gamma, seed=args.seed,
                      log_every=args.log_every, profile_steps=args.profile_steps,
                      context_bucket=args.context_bucket, sdpa_backend=args.sdpa_backend,
                      fill_budget=args.fill_budget, batch_stream=args.batch_stream,
                      compile=args.compile, pack_context=args.pack_context,
                      val_samples=args.val_samples, val_every=args.val_every,
                      keep_best=args.keep_best, fused_adam=args.fused_adam,
                      val_among_prompts=val_among,
                      group_by_length=args.group_by_length)
    draft = new_draft(config, runner.device, args.seed)
    warm = init_from(draft, config, args.init_from) if args.init_from else None
    token_ids = torch.tensor(vocab[1]) if args.train_over_token_map else None
    trainer = (DSparkTrainer(draft, runner.model.get_input_embeddings(),
                             runner.model.lm_head_weight, mask_id, cfg, token_ids=token_ids,
                             target_logsumexp=args.target_logsumexp)
               if dspark else Trainer(draft, runner.model.get_input_embeddings(),
                                      runner.model.lm_head_weight, mask_id, cfg,
                                      token_ids=token_ids))
    target_name = Path(args.target).name if Path(args.target).is_dir() else args.target
    checkpoint = None
    if args.resume:  # before the features: a checkpoint of another run stops at once
        checkpoint = TrainingCheckpoint(Path(args.checkpoint), run_fingerprint(
            recipe=args.recipe, algorithm=args.algorithm, target=target_name,
            draft_config=config, cfg=cfg, samples=samples,
            init=warm.digest if warm else None))
        if checkpoint.load(trainer):
            logger.info("resumed %s at step %d of %d", checkpoint.path, trainer.num_steps,
                        trainer.total_steps)
    t0 = time.perf_counter()
    if kept:
        data = kept.data
        timings["features (kept from an earlier run)"] = kept.seconds
    else:
        layer_ids = config["dflash_config"]["target_layer_ids"]
        reserve = int(args.device_reserve_gb * (1 << 30))
        codec = _row_codec(runner, len(layer_ids), dspark, args) if args.mxfp8_rows else None
        logger.info(check_rows_fit(rows_to_keep(samples, share_prompts=True),
                                   _row_bytes(runner, len(layer_ids), dspark, args, codec),
                                   runner.device, reserve))
        prefixes, prefix_of, aux = extract_by_source(
            runner, samples, layer_ids, dspark, reserve_bytes=reserve,
            logsumexp_head=runner.model.lm_head_weight if args.target_logsumexp else None,
            codec=codec, share_prompts=True)
        data = SequenceSet(samples, aux, runner.device, prefixes, reserve, prefix_of=prefix_of,
                           codec=codec, prompt_owner=prompt_owners(samples))
        del aux, prefixes
        timings["features"] = time.perf_counter() - t0
        if key is not None:
            features.put(Features(key, engine, own, data, timings["features"]))
    logger.info("%d sequences, %d tokens; features %.1f s%s", len(data), data.num_tokens,
                timings.get("features", kept.seconds if kept else 0.0),
                " (kept from an earlier run)" if kept else "")
    if args.snapshot_every_s:
        clear_snapshots(args.out)
    stats = trainer.fit(data, _train_budget(args, started),
                        checkpoint=partial(checkpoint.save, trainer) if checkpoint else None,
                        checkpoint_every=args.checkpoint_every,
                        max_run_steps=args.max_run_steps,
                        snapshot=partial(_snapshot, args, trainer, config, vocab)
                        if args.snapshot_every_s else None,
                        snapshot_every_s=args.snapshot_every_s)
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
    if warm is not None:
        info["init_line"] = warm.card_line(args.init_from)
    if vocab is not None:
        info["token_map_line"] = _token_map_line(args, vocab, samples)
    if trainer.val_curve:
        info["val_line"] = _val_line(trainer.held_out_size, trainer.val_curve, trainer.kept_point())
    out = write_draft(draft, config, args.out, render_card(Path(args.out).name, info),
                      token_map=vocab)
    (out / TRAINING_RECORD).write_text(json.dumps(
        {"steps": stats["steps"], "train_seconds": round(stats["train_seconds"], 2),
         "timings": {k: round(v, 2) for k, v in timings.items()},
         "loss": stats["loss"], "accept": stats["accept"], "val_curve": trainer.val_curve,
         "kept_step": (trainer.kept_point() or {"step": stats["steps"]})["step"]},
        indent=1) + "\n")
    # Free the data-generation engine and the features before an evaluation engine starts
    # (unless `features` keeps them for the next run: its caller frees them first).
    del engine, runner, data, trainer, kept
    gc.collect()
    if torch.cuda.is_available():
        torch.cuda.empty_cache()
    return out


def _val_line(held_out: tuple[int, int], curve: list[dict], kept: dict | None) -> str:
    """The card's line on the held-out sequences' objective during training (`held_out`:
    how many sequences, of how many prompts), and which step's draft was written when the
    best validation's is kept."""
    points = ", ".join(f"{p['accept']:.3f} ({p['loss']:.3f}) at {p['step']}" for p in curve)
    line = (f"- Held out of training: {held_out[0]} of the sequences (every continuation of "
            f"{held_out[1]} prompts), their training accept length (loss) over the run, the "
            f"same anchors each time: {points}.")
    if kept is not None:
        line += f" The weights written are step {kept['step']}'s, the best of the curve."
    return line + "\n"


def _draft_vocabulary(args, config: dict, samples: list, eos_ids: frozenset[int]
                      ) -> tuple[int, list[int]] | None:
    """The draft vocabulary shipped beside the draft: (`--token-map-size`, the ids the samples'
    continuations write most, the target's end tokens first); none when the target's
    vocabulary is no larger."""
    size = args.token_map_size
    if not size or config["vocab_size"] <= size:
        return None
    return size, token_map(samples, size, sorted(eos_ids))


def _snapshot(args, trainer: Trainer, config: dict, vocab: tuple[int, list[int]] | None,
              seconds: float) -> None:
    path = write_snapshot(trainer.draft, config, args.out, step=trainer.num_steps,
                          total_steps=trainer.total_steps, train_seconds=seconds,
                          command=args.command, token_map=vocab)
    logger.info("snapshot of step %d: %s", trainer.num_steps, path)


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
