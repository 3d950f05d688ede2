"""The DFlash block objective and its optimization loop.

A training example is a block at a random anchor inside the target's continuation: the
context is the aux rows of every token before the anchor, the block `[anchor, MASK x (B-1)]`
sits at positions anchor..anchor+B-1, and offset j is trained to predict the true token at
anchor + j (j = 1..B-1) with cross-entropy weighted `exp(-(j - 1) / gamma)`: early offsets
matter most, since a draft token only counts when every one before it was accepted.
"""

from __future__ import annotations

import logging
import math
import time
from collections.abc import Callable
from contextlib import ExitStack
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn
from torch.autograd import DeviceType
from torch.nn.attention import SDPBackend, sdpa_kernel
from torch.nn.utils.rnn import pad_sequence

from sglang_aux.srt.model_executor.runner_utils.host_transfer import tensor_to_device
from sglang_aux.srt.models.dflash import DFlashDraftModel
from sglang_aux.tools.dflash_training.data import Sample
from sglang_aux.tools.dflash_training.draft_forward import (
    draft_block_hidden,
    grouped_kv_kernel_enabled,
)
from sglang_aux.tools.dflash_training.features import TRAIN_RESERVE_BYTES, has_room
from sglang_aux.tools.dflash_training.sliced_loss import SLICE_ROWS, loss_in_slices

logger = logging.getLogger(__name__)

IGNORE = -100  # label of positions past a sequence's end and of offset 0 (the anchor)
OFF_VOCAB = -1  # label of a token the draft vocabulary leaves out: never trained, never right


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
    # before, instead of in line with the steps: 60.4 against 63.5 ms a step on an H100
    # with every row in pinned host memory, as most of the whole mix's are (docs/training.md)
    batch_stream: bool = True
    # the draft's forward and the loss through torch.compile (a candidate, off until timed)
    compile: bool = False
    # sequences held out of training (drawn once from the seed), their objective measured
    # every `val_every` steps and at the end: whether more steps over the same data still
    # generalize
    val_samples: int = 0
    val_every: int = 1000

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


@dataclass
class Batch:
    aux: torch.Tensor  # [N, T, K * H_target], zero-padded
    ids: torch.Tensor  # [N, T]
    prompt_lens: torch.Tensor  # [N]
    lens: torch.Tensor  # [N]


class SequenceSet:
    """Training sequences on one device: token ids, aux rows and where the continuation
    starts. Sequences with fewer than two continuation tokens teach nothing and are dropped.

    Every sequence starts with the same `prefix_aux` rows `[P, K * H]` (the k-shot prefix,
    kept once); `aux[i]` holds sample i's rows from position P on. With several prefixes
    (a list: one per source of prompts), sample i starts with `prefix_aux[prefix_of[i]]`.
    Host rows move to the device while it keeps `reserve_bytes` free; the rest stay on the
    host and are copied in with their batch."""

    def __init__(self, samples: list[Sample], aux: list[torch.Tensor], device: torch.device,
                 prefix_aux: torch.Tensor | list[torch.Tensor] | None = None,
                 reserve_bytes: int = TRAIN_RESERVE_BYTES, *,
                 prefix_of: list[int] | None = None):
        keep = [i for i, s in enumerate(samples) if len(s.output_ids) >= 2]
        if not keep:
            raise ValueError(f"none of {len(samples)} samples has two continuation tokens")
        width = aux[0].shape[-1]
        prefixes = prefix_aux if isinstance(prefix_aux, list) else [
            prefix_aux if prefix_aux is not None else aux[0].new_zeros((0, width))]
        self.prefixes = [p.to(device) for p in prefixes]
        prefix_of = [0] * len(samples) if prefix_of is None else prefix_of
        for i in keep:
            p = len(self.prefixes[prefix_of[i]])
            if len(aux[i]) + p != len(samples[i].ids) or len(samples[i].prompt_ids) < p:
                raise ValueError(f"sample {i}: {len(samples[i].ids)} tokens (prompt "
                                 f"{len(samples[i].prompt_ids)}), but {p} shared and "
                                 f"{len(aux[i])} own aux rows")
        self.prefix_of = [prefix_of[i] for i in keep]
        self.ids = [torch.tensor(samples[i].ids, device=device) for i in keep]
        self.aux = [aux[i] if aux[i].device == device
                    or not has_room(device, aux[i].nbytes, reserve_bytes)
                    else aux[i].to(device) for i in keep]
        # lengths stay on the host: a batch gathers them there and sends them without a sync
        self.prompt_lens = torch.tensor([len(samples[i].prompt_ids) for i in keep])
        self.lens = torch.tensor([len(samples[i].ids) for i in keep])
        self.num_tokens = int(self.lens.sum())

    def __len__(self) -> int:
        return len(self.ids)

    def batch(self, index: list[int], bucket: int = 0,
              stream: torch.cuda.Stream | None = None) -> Batch:
        """These sequences, zero-padded to the longest one's length, rounded up to a multiple
        of `bucket` when it is set (the rows past a sequence's end are never attended). With
        a CUDA `stream`, the host rows' copies and the padding run there, beside what the
        current stream still computes, and the current stream waits for them."""
        if stream is None:
            return self._batch(index, bucket)
        current = torch.cuda.current_stream(stream.device)
        with torch.cuda.stream(stream):
            batch = self._batch(index, bucket)
        current.wait_stream(stream)
        for t in vars(batch).values():  # made on `stream`, freed after `current` reads them
            t.record_stream(current)
        return batch

    def _batch(self, index: list[int], bucket: int) -> Batch:
        dev = self.prefixes[0].device
        aux = [torch.cat([self.prefixes[self.prefix_of[i]], tensor_to_device(self.aux[i], dev)])
               for i in index]
        ids = [self.ids[i] for i in index]
        if bucket:
            longest = max(len(x) for x in ids)
            pad = -longest % bucket
            aux[0] = F.pad(aux[0], (0, 0, 0, longest + pad - len(aux[0])))
            ids[0] = F.pad(ids[0], (0, longest + pad - len(ids[0])))
        return Batch(pad_sequence(aux, batch_first=True), pad_sequence(ids, batch_first=True),
                     tensor_to_device(self.prompt_lens[index], dev),
                     tensor_to_device(self.lens[index], dev))


def sample_anchors(batch: Batch, num: int, generator: torch.Generator) -> torch.Tensor:
    """`[N, num]` anchors uniform over each continuation's positions that have a next token:
    `prompt_len <= anchor <= len - 2` (the first anchor is the first generated token, whose
    context is the whole prompt, as after a prefill)."""
    u = tensor_to_device(torch.rand(len(batch.lens), num, generator=generator), batch.lens.device)
    span = (batch.lens - 1 - batch.prompt_lens)[:, None]
    return batch.prompt_lens[:, None] + (u * span).long().clamp(max=span - 1)


def block_labels(batch: Batch, anchors: torch.Tensor, block_size: int) -> torch.Tensor:
    """`[N, A, B]`: the true token at anchor + j for j >= 1, IGNORE past the end and at j = 0."""
    pos = anchors[:, :, None] + torch.arange(block_size, device=anchors.device)
    valid = pos < batch.lens[:, None, None]
    labels = batch.ids.gather(1, pos.clamp(max=batch.ids.shape[1] - 1).flatten(1))
    labels = torch.where(valid, labels.view(pos.shape), IGNORE)
    labels[:, :, 0] = IGNORE
    return labels


def offset_weights(block_size: int, gamma: float, device: torch.device) -> torch.Tensor:
    j = torch.arange(block_size, device=device, dtype=torch.float32)
    w = torch.exp(-(j - 1) / gamma)
    w[0] = 0.0
    return w


def vocab_labels(labels: torch.Tensor, label_rows: torch.Tensor) -> torch.Tensor:
    """Token labels as rows of an LM head cut to a draft vocabulary (`label_rows` `[V]`: each
    token's row, OFF_VOCAB for the tokens left out); IGNORE stays."""
    return torch.where(labels == IGNORE, IGNORE, label_rows[labels.clamp(min=0)])


def slice_cross_entropy(h: torch.Tensor, lm_head: torch.Tensor, labels: torch.Tensor,
                        weights: torch.Tensor, den: torch.Tensor
                        ) -> tuple[torch.Tensor, torch.Tensor]:
    """One slice of `block_loss`: hidden rows `[S, B, H]` through the LM head, their fp32
    cross-entropy weighted and divided by `den`, and which offsets the argmax gets right."""
    logits = h @ lm_head.t().to(h.dtype)
    hit = labels >= 0
    ce = F.cross_entropy(logits.flatten(0, 1).float(),
                         torch.where(hit, labels, IGNORE).flatten(), ignore_index=IGNORE,
                         reduction="none").view(labels.shape)
    with torch.no_grad():
        correct = (logits.argmax(-1) == labels) & hit
    return (ce * weights).sum() / den, correct


def block_loss(hidden: torch.Tensor, lm_head: torch.Tensor, labels: torch.Tensor,
               weights: torch.Tensor, slice_rows: int = SLICE_ROWS,
               slice_loss: Callable = slice_cross_entropy) -> tuple[torch.Tensor, dict]:
    """Weighted cross-entropy over valid block offsets of the draft's hidden states
    `[N, A, B, H]` through the (frozen) LM head, `slice_rows` logit rows at a time
    (`loss_in_slices`), plus per-offset accuracy and the accept length greedy verification
    would give (1 + the run of correct offsets from 1). Stats stay on the device. Over a
    draft vocabulary (`vocab_labels`) an OFF_VOCAB offset is left out of the loss and counts
    as wrong, as the draft can never propose it."""
    b = labels.shape[-1]
    valid = labels != IGNORE
    trained = labels >= 0
    w = weights * trained
    den = w.sum()

    def one_slice(h: torch.Tensor, lab: torch.Tensor, wt: torch.Tensor):
        loss, correct = slice_loss(h, lm_head, lab, wt, den)
        return loss, {"correct": correct}

    loss, parts = loss_in_slices(one_slice, [hidden.flatten(0, 1)],
                                 [labels.flatten(0, 1), w.flatten(0, 1)],
                                 max(1, slice_rows // b))
    with torch.no_grad():
        correct = parts["correct"]
        acc = correct.sum(0) / valid.flatten(0, 1).sum(0).clamp(min=1)
        accept = 1 + correct[:, 1:].int().cumprod(-1).sum(-1).float().mean()
    return loss, {"loss": loss.detach(), "acc": acc[1:], "accept": accept}


# A time budget sets the number of steps at BUDGET_PROBE_STEPS, from the pace of the steps
# after the first BUDGET_WARMUP_STEPS (those are slow: allocations, kernel selection), and
# sets it again every BUDGET_REPACE_EVERY steps and at the planned last step from the pace so
# far: early steps can be several times slower than the steady ones (seen on the H200: 0.4 s
# against 0.07 s).
BUDGET_WARMUP_STEPS = 5
BUDGET_PROBE_STEPS = 20
BUDGET_REPACE_EVERY = 100


def _compiled(fn: Callable, compile: bool) -> Callable:
    """`fn` through torch.compile (shapes marked dynamic where they change: a batch's context
    bucket, a slice's blocks), or as it is."""
    return torch.compile(fn, dynamic=None) if compile else fn


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
                                     weight_decay=cfg.weight_decay)
        # The schedule is set by hand each step, so a time budget can shorten it mid-run.
        self.total_steps = cfg.steps
        self.warmup = max(1, int(cfg.steps * cfg.warmup_frac))
        self.num_steps = 0
        self.weights = offset_weights(draft.dflash_config.draft_block_size, cfg.gamma, self.device)
        self.slice_rows = SLICE_ROWS  # logit rows the loss holds at a time
        # `cfg.compile`: the draft's forward and the loss's slices through torch.compile, so
        # the norms', RoPE's and the fp32 cross-entropy's elementwise work fuses
        self.block_hidden = _compiled(draft_block_hidden, cfg.compile)
        self.slice_loss = _compiled(slice_cross_entropy, cfg.compile)
        # every batch's sequences and anchors are drawn from it: its state is the data order
        self.generator = torch.Generator().manual_seed(cfg.seed)
        self.train_seconds = 0.0  # over every run of a resumed training
        self.stats: dict = {}  # the last log window's averages
        self.val_curve: list[dict] = []  # {"step", "loss", "accept"} of each validation

    def objective(self, batch: Batch, anchors: torch.Tensor) -> tuple[torch.Tensor, dict]:
        """The DFlash block loss of these blocks and its stats."""
        hidden = self.block_hidden(self.draft, self.embed, batch.aux, batch.ids, anchors,
                                   self.mask_token_id, grouped_kv_kernel_enabled())
        labels = block_labels(batch, anchors, self.draft.dflash_config.draft_block_size)
        if self.label_rows is not None:
            labels = vocab_labels(labels, self.label_rows)
        return block_loss(hidden, self.lm_head, labels, self.weights, self.slice_rows,
                          self.slice_loss)

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
        return point

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
                "val_curve": self.val_curve}

    def load_state_dict(self, state: dict) -> None:
        self.draft.load_state_dict(state["draft"])
        self.opt.load_state_dict(state["optimizer"])
        self.num_steps, self.total_steps = state["num_steps"], state["total_steps"]
        self.warmup, self.train_seconds = state["warmup"], state["train_seconds"]
        self.generator.set_state(state["generator"])
        self.stats = state["stats"]
        self.val_curve = state.get("val_curve", [])  # (checkpoints written before it)

    def fit(self, data: SequenceSet, time_budget_s: float | None = None, *,
            checkpoint: Callable[[], None] | None = None, checkpoint_every: int = 0,
            max_run_steps: int | None = None) -> dict:
        """Steps on random sequences and anchors from `num_steps` to `total_steps`.
        Without `checkpoint`, `time_budget_s` shortens the schedule to the steps it holds
        (paced over the first steps; the cosine then ends at the new last step). With it, a
        run is one of several: the schedule stays, `time_budget_s` or `max_run_steps` ends
        this run where it falls, and `checkpoint()` runs every `checkpoint_every` steps and at
        the end. Returns the stats averaged over the last `log_every` steps, the steps done in
        every run so far, whether training is done and the seconds it took in every run."""
        start, window, first = time.perf_counter(), [], self.num_steps
        held_out = held_out_index(len(data), self.cfg.val_samples, self.cfg.seed)
        pool = torch.tensor(sorted(set(range(len(data))) - set(held_out)), dtype=torch.long)
        paced_from = start  # set again after the warm-up steps
        profile = StepProfile(self.cfg.profile_steps, self.device)
        copies = (torch.cuda.Stream(self.device)
                  if self.cfg.batch_stream and self.device.type == "cuda" else None)
        saved_at = None
        while self.num_steps < self.total_steps:
            ran = self.num_steps - first
            if checkpoint is not None and _run_ends(ran, time.perf_counter() - start,
                                                    time_budget_s, max_run_steps):
                break
            profile.before(ran)
            index = pool[torch.randint(len(pool), (self.cfg.batch_size,),
                                       generator=self.generator)]
            batch = data.batch(index.tolist(), self.cfg.context_bucket, copies)
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
        if window:  # the run ended between log lines
            self._log(window, start)
        self.train_seconds += time.perf_counter() - start
        if checkpoint is not None and saved_at != self.num_steps:
            checkpoint()
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


def held_out_index(num_sequences: int, val_samples: int, seed: int) -> list[int]:
    """The `val_samples` sequences of `num_sequences` that training never draws, sorted:
    a permutation of the seed's own (the same in every run of a resumed training)."""
    if val_samples >= num_sequences:
        raise ValueError(f"val_samples {val_samples} leaves none of the {num_sequences} "
                         "sequences to train on")
    if not val_samples:
        return []
    order = torch.randperm(num_sequences, generator=torch.Generator().manual_seed(seed + 2))
    return sorted(order[:val_samples].tolist())


def _run_ends(ran: int, elapsed: float, time_budget_s: float | None,
              max_run_steps: int | None) -> bool:
    """Whether a run of several ends before its next step: after `max_run_steps`, or when one
    more step at this run's pace would pass `time_budget_s`."""
    if ran == max_run_steps:
        return True
    return time_budget_s is not None and elapsed + (elapsed / ran if ran else 0.0) > time_budget_s


class StepProfile:
    """torch.profiler over `num_steps` training steps from `BUDGET_WARMUP_STEPS` on: when
    they end, logs the wall time a step took, the device's busy time within it (the sum of
    its kernels') and the ops that took the most self time, device first."""

    def __init__(self, num_steps: int, device: torch.device):
        self.first, self.last = BUDGET_WARMUP_STEPS, BUDGET_WARMUP_STEPS + num_steps
        self.num_steps, self.device = num_steps, device
        self.prof: torch.profiler.profile | None = None
        self.started = 0.0

    def before(self, step: int) -> None:
        if self.num_steps and step == self.first:
            activities = [torch.profiler.ProfilerActivity.CPU]
            if self.device.type == "cuda":
                activities.append(torch.profiler.ProfilerActivity.CUDA)
                torch.cuda.synchronize(self.device)
            self.prof = torch.profiler.profile(activities=activities)
            self.prof.__enter__()
            self.started = time.perf_counter()

    def after(self, step: int, total: int) -> None:
        """After `step` of `total` (a run shorter than the profile ends it early)."""
        if self.prof is None or step < min(self.last, total):
            return
        self.num_steps = step - self.first
        cuda = self.device.type == "cuda"
        if cuda:
            torch.cuda.synchronize(self.device)
        wall = (time.perf_counter() - self.started) / self.num_steps
        self.prof.__exit__(None, None, None)
        events = self.prof.key_averages()
        busy = device_busy_us(events) / 1e3 / self.num_steps if cuda else float("nan")
        logger.info("profile of %d steps: %.1f ms a step, the device busy %.1f ms of it\n%s",
                    self.num_steps, wall * 1e3, busy, events.table(
                        sort_by="self_cuda_time_total" if cuda else "self_cpu_time_total",
                        row_limit=30))
        self.prof = None


def device_busy_us(events) -> float:
    """Microseconds the device spent in kernels, from profiler events: each kernel counted
    once, by its own device event (an op's self device time repeats its kernels', so summing
    every event counts a kernel twice)."""
    return sum(e.self_device_time_total for e in events
               if e.device_type != DeviceType.CPU and not e.is_user_annotation)


def _mean_stats(window: list[dict]) -> dict:
    """Every stat averaged over the window, on the host: scalars as floats, the per-offset
    accuracy as a list (one host sync per stat)."""
    out = {}
    for k in window[0]:
        mean = torch.stack([torch.as_tensor(s[k], dtype=torch.float32) for s in window]).mean(0)
        out[k] = mean.tolist()
    return out
