"""The DFlash draft's optimization loop: AdamW over random blocks of the training sequences
(`sequence_set.py`) on the block objective (`block_objective.py`), paced to a time budget,
resumable, with sequences held out and measured as it trains."""

from __future__ import annotations

import logging
import math
import time
from collections.abc import Callable
from contextlib import ExitStack
from dataclasses import dataclass

import torch
from torch import nn
from torch.nn.attention import SDPBackend, sdpa_kernel

from sglang_aux.srt.models.dflash import DFlashDraftModel
from sglang_aux.tools.dflash_training.block_objective import (
    OFF_VOCAB,
    block_labels,
    block_loss,
    offset_weights,
    slice_cross_entropy,
    vocab_labels,
)
from sglang_aux.tools.dflash_training.draft_forward import (
    draft_block_hidden,
    grouped_kv_kernel_enabled,
)
from sglang_aux.tools.dflash_training.sequence_set import (
    Batch,
    BatchDraws,
    SequenceSet,
    sample_anchors,
)
from sglang_aux.tools.dflash_training.sliced_loss import SLICE_ROWS
from sglang_aux.tools.dflash_training.step_profile import StepProfile

logger = logging.getLogger(__name__)

SDPA_BACKENDS = {"auto": None, "cudnn": SDPBackend.CUDNN_ATTENTION,
                 "efficient": SDPBackend.EFFICIENT_ATTENTION, "flash": SDPBackend.FLASH_ATTENTION,
                 "math": SDPBackend.MATH}


@dataclass(frozen=True)
class TrainConfig:
    steps: int = 6000
    batch_size: int = 32  # sequences per step
    anchors_per_seq: int = 16  # blocks per sequence per step
    lr: float = 1e-3
    weight_decay: float = 0.01
    warmup_frac: float = 0.05  # linear warm-up, then cosine decay to zero
    gamma: float = 4.0  # loss decay over block offsets (B = 8: offset 7 weighs 0.22)
    grad_clip: float = 1.0
    seed: int = 0
    log_every: int = 50
    profile_steps: int = 0  # steps profiled after the warm-up ones (0: none), table logged
    # a batch's padded length rounded up to a multiple of this (0: the longest sequence's), so
    # the draft's attention sees few distinct shapes: cuDNN builds a graph for each new one,
    # and with 0 a mix step on the H200 took 278 ms profiled against 56 (docs/training.md)
    context_bucket: int = 256
    # the draft attention's SDPA kernels (SDPA_BACKENDS): "auto" lets torch choose (cuDNN's
    # on an H100 and the H200)
    sdpa_backend: str = "auto"
    # with a time budget (and no checkpoint), the steps are what the budget holds, more than
    # `steps` too: a device session's minutes all train
    fill_budget: bool = False
    # CUDA: a batch's host rows are copied in on a stream of their own, beside the step
    # before, instead of in line with the steps: 60.5 against 63.4 ms a step on an H100
    # with every row in pinned host memory, as most of the whole mix's are (docs/training.md)
    batch_stream: bool = True
    # the draft's forward and the loss through torch.compile; None: on CUDA, where it took
    # 16.6 against 31.5 ms a mix step on an H100 (docs/training.md), eager elsewhere
    compile: bool | None = None
    # project only the sequences' own context rows, not a batch's padding (47.5% of a mix
    # batch's rows with the 256-row bucket): 1.09x eager, not faster compiled (docs/training.md)
    pack_context: bool = False
    # sequences held out of training (drawn once from the seed), their objective measured
    # every `val_every` steps and at the end: whether more steps over the same data still
    # generalize
    val_samples: int = 0
    val_every: int = 1000
    # held-out prompts drawn among the first this many prompts only (None: all): those of
    # `--samples-file`, so that `--extra-samples-file` adds training data and leaves the
    # held-out sequences, and the curve they draw, those of a run without it
    val_among_prompts: int | None = None
    # each batch drawn from one length group (`BatchDraws`): a candidate, off until timed and
    # searched (a mix batch's own rows 79% of its padded ones against 52%, but one kind of
    # prompt a batch)
    group_by_length: bool = False
    # AdamW's fused kernels instead of its foreach ones (a candidate, off until timed: the
    # optimizer was 9% of the compiled mix step's device time on the H200)
    fused_adam: bool = False
    # with sequences held out: the draft a finished training leaves is the one of its best
    # validation (held-out accept length, then loss), not the last step's when that one is
    # worse: many passes over the same data may learn its samples
    keep_best: bool = False

    def __post_init__(self) -> None:
        for name in ("steps", "batch_size", "anchors_per_seq", "log_every", "val_every"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be >= 1, got {getattr(self, name)}")
        if self.profile_steps < 0:
            raise ValueError(f"profile_steps must be >= 0, got {self.profile_steps}")
        if self.val_samples < 0:
            raise ValueError(f"val_samples must be >= 0, got {self.val_samples}")
        if self.context_bucket < 0:
            raise ValueError(f"context_bucket must be >= 0, got {self.context_bucket}")
        if self.sdpa_backend not in SDPA_BACKENDS:
            raise ValueError(f"sdpa_backend must be one of {', '.join(SDPA_BACKENDS)}, got "
                             f"{self.sdpa_backend!r}")

    def compiles_on(self, device: torch.device) -> bool:
        """Whether a trainer on `device` runs its steps through torch.compile."""
        return device.type == "cuda" if self.compile is None else self.compile


# A time budget sets the number of steps at BUDGET_PROBE_STEPS, from the pace of the steps
# after the first BUDGET_WARMUP_STEPS (those are slow: allocations, kernel selection), and
# sets it again every BUDGET_REPACE_EVERY steps and at the planned last step from the pace so
# far: early steps can be several times slower than the steady ones (seen on the H200: 0.4 s
# against 0.07 s).
BUDGET_WARMUP_STEPS = 5
GROUP_ROWS = 256  # the length groups' rows under `group_by_length` with no context bucket
BUDGET_PROBE_STEPS = 20
BUDGET_REPACE_EVERY = 100


def _compiled(fn: Callable, compile: bool) -> Callable:
    """`fn` through torch.compile for the training steps (shapes marked dynamic where they
    change: a batch's context bucket), or as it is. Without autograd (the held-out
    sequences' validation, a few batches now and then) `fn` runs eagerly: compiling it
    again for them would cost more than it saves and upset the step's pacing."""
    if not compile:
        return fn
    compiled = torch.compile(fn, dynamic=None)
    return lambda *args: (compiled if torch.is_grad_enabled() else fn)(*args)


def _lr_factor(step: int, total: int, warmup: int) -> float:
    if step < warmup:
        return (step + 1) / warmup
    return 0.5 * (1 + math.cos(math.pi * min(1.0, (step - warmup) / max(1, total - warmup))))


class Trainer:
    """AdamW on the draft's parameters (the target's embedding and LM head stay frozen), bf16
    autocast on CUDA and plain fp32 elsewhere. With `token_ids` (a draft vocabulary, as it
    will be served under `--speculative-token-map`) the loss reads the LM head's rows of
    those tokens alone: its logits and softmax shrink by V / H."""

    def __init__(self, draft: DFlashDraftModel, embed: nn.Embedding, lm_head: torch.Tensor,
                 mask_token_id: int, cfg: TrainConfig, token_ids: torch.Tensor | None = None):
        self.draft, self.embed, self.lm_head = draft, embed, lm_head.detach()
        self.label_rows = None  # each token's row of the cut LM head, OFF_VOCAB if left out
        if token_ids is not None:
            token_ids = token_ids.to(self.lm_head.device)
            self.lm_head = self.lm_head[token_ids].contiguous()
            self.label_rows = torch.full((lm_head.shape[0],), OFF_VOCAB, dtype=torch.int64,
                                         device=token_ids.device)
            self.label_rows[token_ids] = torch.arange(len(token_ids), device=token_ids.device)
        self.mask_token_id, self.cfg = mask_token_id, cfg
        self.device = draft.fc.weight.device
        params = [p for p in draft.parameters() if p.requires_grad]
        groups = [{"params": [p for p in params if p.dim() >= 2]},
                  {"params": [p for p in params if p.dim() < 2], "weight_decay": 0.0}]
        self.opt = torch.optim.AdamW(groups, lr=cfg.lr, betas=(0.9, 0.95),
                                     weight_decay=cfg.weight_decay,
                                     **({"fused": True} if cfg.fused_adam else {}))
        # The schedule is set by hand each step, so a time budget can shorten it mid-run.
        self.total_steps = cfg.steps
        self.warmup = max(1, int(cfg.steps * cfg.warmup_frac))
        self.num_steps = 0
        self.weights = offset_weights(draft.dflash_config.draft_block_size, cfg.gamma, self.device)
        self.slice_rows = SLICE_ROWS  # logit rows the loss holds at a time
        # `cfg.compile`: the draft's forward and the loss's slices through torch.compile, so
        # the norms', RoPE's and the fp32 cross-entropy's elementwise work fuses
        self.block_hidden = self.step_function(draft_block_hidden)
        self.slice_loss = self.step_function(slice_cross_entropy)
        # every batch's sequences and anchors are drawn from it: its state is the data order
        self.generator = torch.Generator().manual_seed(cfg.seed)
        self.train_seconds = 0.0  # over every run of a resumed training
        self.stats: dict = {}  # the last log window's averages
        self.val_curve: list[dict] = []  # {"step", "loss", "accept"} of each validation
        # `keep_best`: the best validation's point and the draft's weights then
        # ({"point", "draft"}); copied only under it
        self.best: dict | None = None
        self.held_out_size = (0, 0)  # (sequences, prompts) held out of the last fit

    def step_function(self, fn: Callable) -> Callable:
        """`fn` as the training steps call it: through torch.compile under `cfg.compile`."""
        return _compiled(fn, self.cfg.compiles_on(self.device))

    def objective(self, batch: Batch, anchors: torch.Tensor) -> tuple[torch.Tensor, dict]:
        """The DFlash block loss of these blocks and its stats."""
        hidden = self.block_hidden(self.draft, self.embed, batch.aux, batch.ids, anchors,
                                   self.mask_token_id, grouped_kv_kernel_enabled(),
                                   self.context_rows(batch))
        labels = block_labels(batch, anchors, self.draft.dflash_config.draft_block_size)
        if self.label_rows is not None:
            labels = vocab_labels(labels, self.label_rows)
        return block_loss(hidden, self.lm_head, labels, self.weights, self.slice_rows,
                          self.slice_loss)

    def context_rows(self, batch: Batch) -> torch.Tensor | None:
        """The rows the draft's context pass projects: the sequences' own with
        `cfg.pack_context`, else all (None)."""
        return batch.rows if self.cfg.pack_context else None

    def step(self, batch: Batch, anchors: torch.Tensor) -> dict:
        """One optimizer step on these blocks; returns the step's loss and accuracy as device
        tensors (reading them is a host sync: `fit` does it once per log line)."""
        self.draft.train()
        # before the objective: its sliced loss hands some parameters their gradient inside it
        self.opt.zero_grad(set_to_none=True)
        with self._kernels():
            loss, stats = self.objective(batch, anchors)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(self.draft.parameters(), self.cfg.grad_clip)
        for group in self.opt.param_groups:
            group["lr"] = self.lr
        self.opt.step()
        self.num_steps += 1
        return stats

    def _kernels(self) -> ExitStack:
        """bf16 autocast on CUDA and the configured attention kernels, for a forward."""
        stack = ExitStack()
        stack.enter_context(torch.autocast("cuda", torch.bfloat16,
                                           enabled=self.device.type == "cuda"))
        backend = SDPA_BACKENDS[self.cfg.sdpa_backend]
        if backend is not None:
            stack.enter_context(sdpa_kernel(backend))
        return stack

    @torch.no_grad()
    def validate(self, data: SequenceSet, index: list[int]) -> dict:
        """The objective over sequences `index` (held out of training), in batches of the
        training's size with the same anchors every time (a generator of their own): the
        loss and the training accept length, averaged over the sequences, appended to
        `val_curve` and logged."""
        anchors_from = torch.Generator().manual_seed(self.cfg.seed + 1)
        self.draft.eval()
        loss = accept = 0.0
        for s in range(0, len(index), self.cfg.batch_size):
            part = index[s:s + self.cfg.batch_size]
            batch = data.batch(part, self.cfg.context_bucket)
            anchors = sample_anchors(batch, self.cfg.anchors_per_seq, anchors_from)
            with self._kernels():
                batch_loss, stats = self.objective(batch, anchors)
            loss += float(batch_loss) * len(part)
            accept += float(stats["accept"]) * len(part)
        self.draft.train()
        point = {"step": self.num_steps, "loss": round(loss / len(index), 4),
                 "accept": round(accept / len(index), 4)}
        self.val_curve.append(point)
        logger.info("held out (%d sequences) at step %d: loss %.4f accept %.3f", len(index),
                    point["step"], point["loss"], point["accept"])
        if self.cfg.keep_best and (self.best is None or _better(point, self.best["point"])):
            self.best = {"point": point, "draft": {k: v.detach().clone() for k, v in
                                                   self.draft.state_dict().items()}}
        return point

    def kept_point(self) -> dict | None:
        """The validation whose draft a finished training leaves (`keep_best`): the best one,
        or None without sequences held out or when `keep_best` is off (since a run began
        under it, when a resumed training turned it on)."""
        return self.best["point"] if self.cfg.keep_best and self.best else None

    @property
    def lr(self) -> float:
        """The learning rate of the next step."""
        return self.cfg.lr * _lr_factor(self.num_steps, self.total_steps, self.warmup)

    def state_dict(self) -> dict:
        """What a later run needs to continue as if never stopped: the draft's weights, the
        optimizer's moments, the schedule's position, the generator (the data order and the
        anchors: training draws nothing else), the seconds trained and the last stats."""
        return {"draft": self.draft.state_dict(), "optimizer": self.opt.state_dict(),
                "num_steps": self.num_steps, "total_steps": self.total_steps,
                "warmup": self.warmup, "generator": self.generator.get_state(),
                "train_seconds": self.train_seconds, "stats": self.stats,
                "val_curve": self.val_curve, "best": self.best}

    def load_state_dict(self, state: dict) -> None:
        self.draft.load_state_dict(state["draft"])
        self.opt.load_state_dict(state["optimizer"])
        self.num_steps, self.total_steps = state["num_steps"], state["total_steps"]
        self.warmup, self.train_seconds = state["warmup"], state["train_seconds"]
        self.generator.set_state(state["generator"])
        self.stats = state["stats"]
        self.val_curve = state.get("val_curve", [])  # (checkpoints written before it)
        self.best = state.get("best")

    def fit(self, data: SequenceSet, time_budget_s: float | None = None, *,
            checkpoint: Callable[[], None] | None = None, checkpoint_every: int = 0,
            max_run_steps: int | None = None, snapshot: Callable[[float], None] | None = None,
            snapshot_every_s: float = 0.0) -> dict:
        """Steps on random sequences and anchors from `num_steps` to `total_steps`.
        Without `checkpoint`, `time_budget_s` shortens the schedule to the steps it holds
        (paced over the first steps; the cosine then ends at the new last step). With it, a
        run is one of several: the schedule stays, `time_budget_s` or `max_run_steps` ends
        this run where it falls, and `checkpoint()` runs every `checkpoint_every` steps and at
        the end. `snapshot(seconds)` (the training's seconds so far, every run's) runs after the
        first step done `snapshot_every_s` seconds or more after the last snapshot (or the
        start). Returns the stats averaged over the last `log_every` steps, the steps done in
        every run so far, whether training is done and the seconds it took in every run."""
        start, window, first = time.perf_counter(), [], self.num_steps
        held_out = held_out_index(data.prompt_groups, self.cfg.val_samples, self.cfg.seed,
                                  self.cfg.val_among_prompts)
        self.held_out_size = (len(held_out), len({data.prompt_groups[i] for i in held_out}))
        pool = torch.tensor(sorted(set(range(len(data))) - set(held_out)), dtype=torch.long)
        draws = BatchDraws(data.lens, pool, self.cfg.batch_size,
                           (self.cfg.context_bucket or GROUP_ROWS) if self.cfg.group_by_length
                           else 0)
        paced_from = start  # set again after the warm-up steps
        profile = StepProfile(self.cfg.profile_steps, self.device, BUDGET_WARMUP_STEPS)
        copies = (torch.cuda.Stream(self.device)
                  if self.cfg.batch_stream and self.device.type == "cuda" else None)
        saved_at, snapped_at = None, start
        while self.num_steps < self.total_steps:
            ran = self.num_steps - first
            if checkpoint is not None and _run_ends(ran, time.perf_counter() - start,
                                                    time_budget_s, max_run_steps):
                break
            profile.before(ran)
            batch = data.batch(draws.draw(self.generator), self.cfg.context_bucket, copies)
            window.append(self.step(batch, sample_anchors(batch, self.cfg.anchors_per_seq,
                                                          self.generator)))
            ran += 1
            profile.after(ran, self.total_steps - first)
            if ran == BUDGET_WARMUP_STEPS:
                paced_from = time.perf_counter()
            if checkpoint is None and time_budget_s is not None:
                self._fit_to_budget(ran, start, paced_from, time_budget_s)
            if checkpoint is not None and checkpoint_every and \
                    self.num_steps % checkpoint_every == 0:
                checkpoint()
                saved_at = self.num_steps
            if self.num_steps % self.cfg.log_every == 0 or self.num_steps == self.total_steps:
                self._log(window, start)
                window = []
            if held_out and (self.num_steps % self.cfg.val_every == 0
                             or self.num_steps == self.total_steps):
                self.validate(data, held_out)
            if snapshot is not None and time.perf_counter() - snapped_at >= snapshot_every_s:
                snapshot(self.train_seconds + time.perf_counter() - start)
                snapped_at = time.perf_counter()
        if window:  # the run ended between log lines
            self._log(window, start)
        self.train_seconds += time.perf_counter() - start
        if checkpoint is not None and saved_at != self.num_steps:
            checkpoint()  # (the last step's weights: the optimizer's moments are theirs)
        kept = self.kept_point()
        if self.num_steps >= self.total_steps and kept and kept["step"] != self.num_steps:
            self.draft.load_state_dict(self.best["draft"])
            logger.info("kept the draft of step %d: held-out accept %.3f against the last "
                        "step's %.3f", kept["step"], kept["accept"],
                        self.val_curve[-1]["accept"])
        self.draft.eval()
        return {**self.stats, "steps": self.num_steps,
                "done": self.num_steps >= self.total_steps, "train_seconds": self.train_seconds}

    def _fit_to_budget(self, ran: int, start: float, paced_from: float,
                       time_budget_s: float) -> None:
        """After `ran` steps of a run started at `start`, at the probe step, every
        BUDGET_REPACE_EVERY steps and at the planned last one: the number of steps set to
        what the budget holds at the pace of the steps since `paced_from` (at most
        `cfg.steps` unless `cfg.fill_budget`)."""
        if ran < BUDGET_PROBE_STEPS or not (ran == BUDGET_PROBE_STEPS or ran % BUDGET_REPACE_EVERY
                                            == 0 or ran == self.total_steps):
            return
        now = time.perf_counter()
        pace = (now - paced_from) / (ran - BUDGET_WARMUP_STEPS)
        fits = ran + int((time_budget_s - (now - start)) / pace)
        self.total_steps = max(ran, fits if self.cfg.fill_budget else min(self.cfg.steps, fits))
        self.warmup = min(self.warmup, max(1, int(self.total_steps * self.cfg.warmup_frac)))
        if ran == BUDGET_PROBE_STEPS:
            logger.info("time budget %.0f s: %d steps", time_budget_s, self.total_steps)

    def _log(self, window: list[dict], start: float) -> None:
        self.stats = _mean_stats(window)
        extra = "".join(f" {k} {v:.3f}" for k, v in self.stats.items()
                        if k not in ("loss", "accept", "acc"))
        logger.info("step %d/%d loss %.4f accept %.3f%s lr %.2e acc/offset %s (%.0f s)",
                    self.num_steps, self.total_steps, self.stats["loss"], self.stats["accept"],
                    extra, self.lr, " ".join(f"{a:.2f}" for a in self.stats["acc"]),
                    time.perf_counter() - start)


def _better(point: dict, than: dict) -> bool:
    """A validation beats another on held-out accept length, then on loss."""
    return (point["accept"], -point["loss"]) > (than["accept"], -than["loss"])


def held_out_index(groups: list[int], val_samples: int, seed: int,
                   among: int | None = None) -> list[int]:
    """The sequences training never draws, sorted: whole prompts (`groups`: each sequence's
    prompt, `prompt_groups`), so that no continuation of a held-out prompt is trained on,
    taken in the order of a permutation of the seed's own until they hold `val_samples`
    sequences (the same in every run of a resumed training). `among`: drawn among the
    prompts numbered below it only (the same sequences whatever prompts follow them)."""
    if not val_samples:
        return []
    members: dict[int, list[int]] = {}
    for i, g in enumerate(groups):
        members.setdefault(g, []).append(i)
    keys = sorted(g for g in members if among is None or g < among)
    order = torch.randperm(len(keys), generator=torch.Generator().manual_seed(seed + 2))
    held: list[int] = []
    for g in order.tolist():
        if len(held) >= val_samples:
            break
        held += members[keys[g]]
    if len(held) >= len(groups):
        raise ValueError(f"val_samples {val_samples} leaves none of the {len(groups)} "
                         "sequences to train on")
    return sorted(held)


def _run_ends(ran: int, elapsed: float, time_budget_s: float | None,
              max_run_steps: int | None) -> bool:
    """Whether a run of several ends before its next step: after `max_run_steps`, or when one
    more step at this run's pace would pass `time_budget_s`."""
    if ran == max_run_steps:
        return True
    return time_budget_s is not None and elapsed + (elapsed / ran if ran else 0.0) > time_budget_s


def _mean_stats(window: list[dict]) -> dict:
    """Every stat averaged over the window, on the host: scalars as floats, the per-offset
    accuracy as a list (one host sync per stat)."""
    out = {}
    for k in window[0]:
        mean = torch.stack([torch.as_tensor(s[k], dtype=torch.float32) for s in window]).mean(0)
        out[k] = mean.tolist()
    return out
