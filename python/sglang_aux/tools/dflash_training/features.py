"""The target's aux hidden states of every training sequence, as the DFlash worker sees them:
EXTEND forwards with the draft's `target_layer_ids` captured, the shared k-shot prefix cached;
for DSpark's distribution matching also the target's final hidden states (what its LM head
reads), kept as `H` more columns of every row."""

from __future__ import annotations

import logging

import torch

from sglang_aux.srt.forward_state.forward_batch_info import CaptureHiddenMode
from sglang_aux.srt.layers.logits_processor import LogitsProcessorOutput
from sglang_aux.srt.managers.schedule_batch import (
    Req,
    extend_inputs,
    map_cached_prefix,
    release_kv,
)
from sglang_aux.srt.model_executor.model_runner import ModelRunner
from sglang_aux.srt.sampling.sampling_params import SamplingParams
from sglang_aux.tools.dflash_training.data import (
    BadInputError,
    Sample,
    by_source,
    common_prefix_len,
    prompt_owners,
)
from sglang_aux.tools.dflash_training.mxfp8_rows import MXFP8Rows
from sglang_aux.tools.dflash_training.target_head import logsumexp_columns, target_logsumexp

logger = logging.getLogger(__name__)


# Tokens per forward at most: bounds the activations (MLP intermediate, captured aux rows)
# beside the features already kept on the device.
MAX_FORWARD_TOKENS = 16384
# Device memory the features leave free for training: the step's activations and its loss
# (one slice of logits at a time since `sliced_loss`), and the context of a batch of long
# sequences. Measured on the H200 with Qwen2.5-Coder-1.5B before the loss was sliced (the
# whole step's 1.25 G logits at once): 24 GiB ran out of memory at step ~200, 40 GiB trained
# 6,120 steps. Rows past that wait in pinned host memory and travel with their batch
# (`SequenceSet`).
TRAIN_RESERVE_BYTES = 40 << 30
HOST_CHUNK_BYTES = 1 << 30
# Host memory pinned rows leave to everything else: past it the kernel kills the process
# without a word (DSpark's rows of the 43,608 GSM8K continuations need about 143 GB, beyond
# an H100 machine's 80 GB of device and 128 GiB of host memory together with the reserve).
# Small, since the mix's DFlash rows (145 GB) trained on such a machine: its spill came close.
HOST_MARGIN_BYTES = 2 << 30


def host_available_bytes() -> int | None:
    """The kernel's estimate of memory available without swapping (`MemAvailable`), or None
    where /proc/meminfo does not say."""
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return None


def has_room(device: torch.device, nbytes: int, reserve_bytes: int) -> bool:
    """Whether `device` still keeps `reserve_bytes` free after `nbytes` more (the driver's
    free memory plus torch's cached, unallocated blocks); the host always does."""
    if device.type != "cuda":
        return True
    free, _ = torch.cuda.mem_get_info(device)
    room = free + torch.cuda.memory_reserved(device) - torch.cuda.memory_allocated(device)
    return room >= reserve_bytes + nbytes


def rows_to_keep(samples: list[Sample], share_prompts: bool) -> int:
    """The aux rows `extract_by_source` keeps for `samples`: each source's shared prefix once,
    then every sample's rows past it (with `share_prompts`, a prompt's once)."""
    total = 0
    for index in by_source(samples).values():
        group = [samples[i] for i in index]
        skip = common_prefix_len(group)
        owner = prompt_owners(group) if share_prompts else list(range(len(group)))
        total += skip + sum(len(s.ids) - skip if owner[j] == j else len(s.output_ids)
                            for j, s in enumerate(group))
    return total


def check_rows_fit(rows: int, row_bytes: int, device: torch.device, reserve_bytes: int) -> str:
    """Where `rows` rows of `row_bytes` will be kept (the device past `reserve_bytes`, then
    pinned host memory), as a line for the log; `BadInputError` before the features start
    when the two together cannot hold them (else the host would run out minutes later)."""
    need = rows * row_bytes
    on_device = 0
    if device.type == "cuda":
        free, _ = torch.cuda.mem_get_info(device)
        room = free + torch.cuda.memory_reserved(device) - torch.cuda.memory_allocated(device)
        on_device = max(0, room - reserve_bytes)
    available = host_available_bytes()
    if available is None:  # the host does not say: no check
        return f"aux rows: {rows} of {row_bytes} bytes, {need / 1e9:.1f} GB"
    host = max(0, available - HOST_MARGIN_BYTES - HOST_CHUNK_BYTES)  # a chunk's slack
    if need > on_device + host:
        raise BadInputError(
            f"the target's aux rows need {need / 1e9:.1f} GB ({rows} rows of {row_bytes} "
            f"bytes), past {on_device / 1e9:.1f} GB on the device (beside "
            f"--device-reserve-gb) and {host / 1e9:.1f} GB of host memory: train on fewer "
            "samples (--sample-fraction), keep the rows as MXFP8 (--mxfp8-rows) or use a "
            "machine with more memory")
    kept = min(need, on_device)
    return (f"aux rows: {rows} of {row_bytes} bytes, {need / 1e9:.1f} GB: about "
            f"{kept / 1e9:.1f} on the device, {(need - kept) / 1e9:.1f} in host memory")


class HostRows:
    """Pinned host memory for aux rows the device has no room for, packed into chunks of
    `HOST_CHUNK_BYTES`: torch's pinned allocator rounds every block up to a power of two,
    which would waste up to half of ~60 GB of rows allocated one forward at a time."""

    def __init__(self) -> None:
        self.chunk: torch.Tensor | None = None
        self.used = 0
        self.pinned = 0  # bytes of every chunk and large copy so far

    def _reserve(self, nbytes: int) -> None:
        """Stop, in one line, before pinning `nbytes` would leave the host less than
        `HOST_MARGIN_BYTES` available."""
        available = host_available_bytes()
        if not self.pinned:
            logger.info("aux rows spill to pinned host memory (%s GB available)",
                        "?" if available is None else f"{available / 1e9:.1f}")
        if available is not None and available - nbytes < HOST_MARGIN_BYTES:
            raise MemoryError(
                f"the target's aux states need more host memory: {self.pinned / 1e9:.1f} GB "
                f"pinned, {available / 1e9:.1f} GB available, {nbytes / 1e9:.1f} GB more would "
                f"leave less than {HOST_MARGIN_BYTES >> 30} GiB: train on fewer samples "
                "(--num-samples) or on a machine with more memory")
        self.pinned += nbytes

    def copy(self, rows: torch.Tensor) -> torch.Tensor:
        """A pinned host copy of `rows`."""
        n = rows.nbytes
        if n > HOST_CHUNK_BYTES:
            self._reserve(n)
            return rows.to("cpu").pin_memory()
        if self.chunk is None or self.used + n > HOST_CHUNK_BYTES:
            self._reserve(HOST_CHUNK_BYTES)
            self.chunk = torch.empty(HOST_CHUNK_BYTES, dtype=torch.uint8, pin_memory=True)
            self.used = 0
        out = self.chunk[self.used:self.used + n].view(rows.dtype).view(rows.shape)
        out.copy_(rows)
        self.used += -(-n // 64) * 64  # the next row starts aligned for any dtype
        return out


def keep_rows(rows: list[torch.Tensor], reserve_bytes: int, host: HostRows
              ) -> list[torch.Tensor]:
    """Copies of `rows` (views of one forward's output), on their device while it keeps
    `reserve_bytes` free after them, else in `host`'s pinned memory (a batch copies them in
    without a sync, `host_transfer.tensor_to_device`)."""
    if not rows or has_room(rows[0].device, sum(r.nbytes for r in rows), reserve_bytes):
        return [r.clone() for r in rows]
    return [host.copy(r) for r in rows]


def _batches(new_tokens: list[int], max_tokens: int, max_reqs: int) -> list[list[int]]:
    """Consecutive positions of `new_tokens` (each request's tokens to compute), at most
    `max_reqs` requests and `max_tokens` tokens per batch (a longer request goes alone)."""
    out, cur, used = [], [], 0
    for i, n in enumerate(new_tokens):
        if cur and (used + n > max_tokens or len(cur) == max_reqs):
            out.append(cur)
            cur, used = [], 0
        cur.append(i)
        used += n
    return out + ([cur] if cur else [])


def _rows(out: LogitsProcessorOutput, final_hidden: bool,
          logsumexp_head: torch.Tensor | None = None, codec: MXFP8Rows | None = None
          ) -> torch.Tensor:
    """A forward's per-token rows: aux `[T, K * H]`, with `final_hidden` `[T, K * H + H]`,
    and with `logsumexp_head` the logsumexp of the final rows through it after them
    (`target_head.logsumexp_columns`); encoded by `codec` when given."""
    if not final_hidden:
        rows = out.aux_hidden_states
    else:
        dtype = out.aux_hidden_states.dtype
        final = out.hidden_states.to(dtype)
        parts = [out.aux_hidden_states, final]
        if logsumexp_head is not None:
            parts.append(logsumexp_columns(target_logsumexp(final, logsumexp_head), dtype))
        rows = torch.cat(parts, dim=-1)
    return rows if codec is None else codec.encode(rows)


@torch.no_grad()
def extract_aux(runner: ModelRunner, samples: list[Sample], layer_ids: list[int],
                skip: int = 0, final_hidden: bool = False,
                reserve_bytes: int = TRAIN_RESERVE_BYTES,
                logsumexp_head: torch.Tensor | None = None, codec: MXFP8Rows | None = None,
                share_prompts: bool = False) -> tuple[torch.Tensor, list[torch.Tensor]]:
    """The first sample's rows `[skip, K * H]` before position `skip` (the prefix every sample
    shares), and per sample its rows from `skip` on, `[len(ids) - skip, K * H]`; with
    `share_prompts`, a sample whose prompt an earlier one has (`prompt_owners`) runs over that
    one's K/V (held until its continuations have run, right after its own batch) and keeps
    only its continuation's rows, `[len(output_ids), K * H]`, borrowing the prompt's from it
    (`SequenceSet(..., prompt_owner=)`: a prompt continued four times is computed and kept
    once, about a fifth of the mix's rows). Copies in the
    target's dtype on its device (a batch's whole output is not kept), in host memory once
    the device would keep less than `reserve_bytes` free.

    The shared prefix runs once: its K/V stays in the slots of the first forward and every
    later sequence reads it as a cached prefix, as the server's prefix cache serves the
    k-shot prompt, so only the `len(ids) - skip` own tokens of a sequence are computed.
    With `final_hidden`, every row is `[K * H aux | H final]`: the target's logits at a token
    are its final columns times the LM head; with `logsumexp_head` too (the target's LM
    head), each row ends with the logsumexp of those logits over the whole vocabulary
    (`target_head`: what DSpark reads over a draft vocabulary). With `codec`, every row is
    kept encoded (`mxfp8_rows`: its bytes, not its dtype).
    Runs on `runner`'s own KV memory and request rows (everything is given back), so the
    runner of the data-generation Engine can do it once generation is over.
    """
    runner.model.set_dflash_layers_to_capture(layer_ids)
    owner = prompt_owners(samples) if share_prompts else list(range(len(samples)))
    members: dict[int, list[int]] = {}  # an owner's later continuations
    for i, o in enumerate(owner):
        if o != i:
            members.setdefault(o, []).append(i)
    pool, alloc = runner.req_to_token_pool, runner.token_to_kv_pool_allocator
    host = HostRows()
    out: list[torch.Tensor | None] = [None] * len(samples)
    kept_slots: dict[int, torch.Tensor] = {}  # slots a sample keeps for the next ones to read

    def forward(index: list[int], reads: list[torch.Tensor]) -> None:
        """One EXTEND forward of these samples, each past the slots it `reads` (the shared
        prefix, or its owner's prompt), their rows kept; every slot is given back but those
        later forwards read: the first sample's prefix, an owner's prompt."""
        nonlocal prefix
        reqs = [Req(f"aux-{i}", samples[i].ids, SamplingParams()) for i in index]
        for r, slots in zip(reqs, reads, strict=True):
            r.req_pool_idx = pool.alloc()
            map_cached_prefix(runner, r, slots)
        # FULL runs it eagerly: the runner's graphs were captured before these layers were
        # set to be captured, so they return no aux rows
        rows = _rows(runner.forward(runner.prepare(extend_inputs(
            runner, reqs, CaptureHiddenMode.FULL))), final_hidden, logsumexp_head, codec)
        rows = list(rows.split([len(r.origin_input_ids) - r.cached_tokens for r in reqs]))
        if index == [0]:  # the prefix, kept once: every later sample reads its slots
            prefix = rows[0][:skip].clone()
            rows[0] = rows[0][skip:]
        for i, r in zip(index, keep_rows(rows, reserve_bytes, host), strict=True):
            out[i] = r
        for i, r in zip(index, reqs, strict=True):
            keep = len(samples[i].prompt_ids) if i in members or owner[i] != i else skip
            if i in members or i == 0:
                kept_slots[i] = pool.req_to_token[r.req_pool_idx, :keep].clone()
            release_kv(runner, r, keep=keep)

    def run(index: list[int]) -> None:
        """These samples in forwards of at most `budget` new tokens each."""
        nonlocal done
        reads = [kept_slots[owner[i]] if owner[i] != i else prefix_slots for i in index]
        for batch in _batches([len(samples[i].ids) - len(slots)
                               for i, slots in zip(index, reads, strict=True)],
                              budget, pool.available_size()):
            forward([index[b] for b in batch], [reads[b] for b in batch])
            done += len(batch)
            if done % 1024 < len(batch):
                logger.info("aux states for %d/%d sequences", done, len(samples))

    prefix = None
    done = 1  # sequences whose rows are kept
    forward([0], [pool.req_to_token.new_empty(0)])
    prefix_slots = kept_slots[0][:skip]
    budget = min(MAX_FORWARD_TOKENS, alloc.available_size() // 2)
    owners = [i for i in range(1, len(samples)) if owner[i] == i]
    chunks = [[owners[b] for b in batch] for batch in _batches(
        [len(samples[i].ids) - skip for i in owners], budget, pool.available_size())]
    # an owner's continuations run right after its own forward's batch, while its prompt's
    # slots are held (a batch's worth at most), then those slots are given back
    for chunk in [[]] + chunks:
        run(chunk)
        pending = [o for o in ([0] if not chunk else chunk) if o in members]
        run([m for o in pending for m in members[o]])
        for o in pending:
            alloc.free(kept_slots.pop(o)[skip:])
    alloc.free(prefix_slots)
    runner.model.set_dflash_layers_to_capture([])
    shared = sum(len(s.prompt_ids) - skip for i, s in enumerate(samples) if owner[i] != i)
    if shared:
        logger.info("prompts computed and kept once for all their continuations: %d rows "
                    "fewer (%.1f%%)", shared,
                    100 * shared / (shared + sum(len(a) for a in out)))
    spilled = sum(a.device != prefix.device for a in out)
    if spilled:
        logger.info("aux states of %d/%d sequences in host memory (%.1f GB)", spilled, len(out),
                    sum(a.nbytes for a in out if a.device != prefix.device) / 1e9)
    return prefix, out


def extract_by_source(runner: ModelRunner, samples: list[Sample], layer_ids: list[int],
                      final_hidden: bool, reserve_bytes: int = TRAIN_RESERVE_BYTES,
                      logsumexp_head: torch.Tensor | None = None, codec: MXFP8Rows | None = None,
                      share_prompts: bool = False
                      ) -> tuple[list[torch.Tensor], list[int], list[torch.Tensor]]:
    """Each source's shared prefix rows (kept once), which prefix each sample starts with,
    and each sample's own rows, in file order (`extract_aux`'s `reserve_bytes`,
    `logsumexp_head`, `codec` and `share_prompts`: the owners are then
    `prompt_owners(samples)`)."""
    prefixes, prefix_of, aux = [], [0] * len(samples), [None] * len(samples)
    for index in by_source(samples).values():
        group = [samples[i] for i in index]
        prefix, rows = extract_aux(runner, group, layer_ids, skip=common_prefix_len(group),
                                   final_hidden=final_hidden, reserve_bytes=reserve_bytes,
                                   logsumexp_head=logsumexp_head, codec=codec,
                                   share_prompts=share_prompts)
        for i, r in zip(index, rows, strict=True):
            aux[i], prefix_of[i] = r, len(prefixes)
        prefixes.append(prefix)
    return prefixes, prefix_of, aux
