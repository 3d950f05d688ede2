"""A training run's sequences on the device and the batches drawn from them: token ids, the
target's aux rows (on the device while it has room, the rest in pinned host memory, copied in
with their batch) and each batch's random block anchors."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from sglang_aux.srt.model_executor.runner_utils.host_transfer import tensor_to_device
from sglang_aux.tools.dflash_training.data import Sample, prompt_groups
from sglang_aux.tools.dflash_training.features import TRAIN_RESERVE_BYTES, has_room
from sglang_aux.tools.dflash_training.mxfp8_rows import MXFP8Rows


@dataclass
class Batch:
    aux: torch.Tensor  # [N, T, K * H_target], zero-padded
    ids: torch.Tensor  # [N, T]
    prompt_lens: torch.Tensor  # [N]
    lens: torch.Tensor  # [N]
    # [R]: the flat indices (into N * T) of every sequence's own rows, made on the host, so a
    # packed context pass (`--pack-context`) skips the padding without a sync
    rows: torch.Tensor | None = None


class SequenceSet:
    """Training sequences on one device: token ids, aux rows and where the continuation
    starts. Sequences with fewer than two continuation tokens teach nothing and are dropped.

    Every sequence starts with the same `prefix_aux` rows `[P, K * H]` (the k-shot prefix,
    kept once); `aux[i]` holds sample i's rows from position P on. With several prefixes
    (a list: one per source of prompts), sample i starts with `prefix_aux[prefix_of[i]]`.
    With `prompt_owner` (`data.prompt_owners`), a sample j whose owner o is not itself has
    only its continuation's rows in `aux[j]` and reads its prompt's from `aux[o]` (views: a
    prompt's rows are kept once for all its continuations).
    Host rows move to the device while it keeps `reserve_bytes` free; the rest stay on the
    host and are copied in with their batch. With `codec`, the rows are kept encoded
    (`mxfp8_rows`) and a batch decodes them once on its device, after the gather."""

    def __init__(self, samples: list[Sample], aux: list[torch.Tensor], device: torch.device,
                 prefix_aux: torch.Tensor | list[torch.Tensor] | None = None,
                 reserve_bytes: int = TRAIN_RESERVE_BYTES, *,
                 prefix_of: list[int] | None = None, codec: MXFP8Rows | None = None,
                 prompt_owner: list[int] | None = None):
        keep = self.trainable(samples)
        if not keep:
            raise ValueError(f"none of {len(samples)} samples has two continuation tokens")
        width = aux[0].shape[-1]
        self.codec = codec
        prefixes = prefix_aux if isinstance(prefix_aux, list) else [
            prefix_aux if prefix_aux is not None else aux[0].new_zeros((0, width))]
        self.prefixes = [p.to(device) for p in prefixes]
        prefix_of = [0] * len(samples) if prefix_of is None else prefix_of
        owner = list(range(len(samples))) if prompt_owner is None else prompt_owner
        for i in keep:
            p = len(self.prefixes[prefix_of[i]])
            o, s = owner[i], samples[i]
            borrowed = 0 if o == i else len(s.prompt_ids) - p
            if o != i and (samples[o].prompt_ids != s.prompt_ids or prefix_of[o] != prefix_of[i]
                           or len(aux[o]) < borrowed):
                raise ValueError(f"sample {i}: its prompt owner {o} has another prompt, "
                                 f"prefix or fewer than {borrowed} rows")
            if len(aux[i]) + p + borrowed != len(s.ids) or len(s.prompt_ids) < p:
                lent = f", {borrowed} of its prompt owner's" if borrowed else ""
                raise ValueError(f"sample {i}: {len(s.ids)} tokens (prompt "
                                 f"{len(s.prompt_ids)}), but {p} shared{lent} and "
                                 f"{len(aux[i])} own aux rows")
        self.prefix_of = [prefix_of[i] for i in keep]
        self.prompt_groups = prompt_groups([samples[i] for i in keep])
        self.ids = [torch.tensor(samples[i].ids, device=device) for i in keep]
        placed: dict[int, torch.Tensor] = {}  # each sample's rows where the set keeps them

        def place(j: int) -> torch.Tensor:
            if j not in placed:
                a = aux[j]
                placed[j] = a if a.device == device or not has_room(
                    device, a.nbytes, reserve_bytes) else a.to(device)
            return placed[j]

        self.aux = [place(i) for i in keep]
        # a borrowed prompt is a view of its owner's rows, wherever they are kept
        self.prompt_aux = [None if owner[i] == i else place(owner[i])[
            : len(samples[i].prompt_ids) - len(self.prefixes[prefix_of[i]])] for i in keep]
        # lengths stay on the host: a batch gathers them there and sends them without a sync
        self.prompt_lens = torch.tensor([len(samples[i].prompt_ids) for i in keep])
        self.lens = torch.tensor([len(samples[i].ids) for i in keep])
        self.num_tokens = int(self.lens.sum())

    @staticmethod
    def trainable(samples: list[Sample]) -> list[int]:
        """The samples a set keeps: those of two continuation tokens or more."""
        return [i for i, s in enumerate(samples) if len(s.output_ids) >= 2]

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
            if t is not None:
                t.record_stream(current)
        return batch

    def _batch(self, index: list[int], bucket: int) -> Batch:
        # Each tensor is one cat into its padded layout (prefix, own rows, padding, next
        # sequence...): one batched copy kernel where a cat and a padding copy a sequence took
        # two (70 small copies a step of 32 sequences, 7% of a compiled step's device time).
        dev = self.prefixes[0].device
        lens = self.lens[index]
        longest = int(lens.max())
        width = longest + (-longest % bucket if bucket else 0)
        pads = [width - n for n in lens.tolist()]
        first = self.aux[index[0]]
        zero_rows = torch.zeros((max(pads), first.shape[-1]), dtype=first.dtype, device=dev)
        zero_ids = self.ids[index[0]].new_zeros(max(pads))
        aux, ids = [], []
        for i, pad in zip(index, pads, strict=True):
            aux.append(self.prefixes[self.prefix_of[i]])
            if self.prompt_aux[i] is not None:
                aux.append(tensor_to_device(self.prompt_aux[i], dev))
            aux += [tensor_to_device(self.aux[i], dev), zero_rows[:pad]]
            ids += [self.ids[i], zero_ids[:pad]]
        rows = torch.cat([torch.arange(n) + i * width for i, n in enumerate(lens.tolist())])
        gathered = torch.cat(aux).view(len(index), width, -1)
        return Batch(gathered if self.codec is None else self.codec.decode(gathered),
                     torch.cat(ids).view(len(index), width),
                     tensor_to_device(self.prompt_lens[index], dev), tensor_to_device(lens, dev),
                     tensor_to_device(rows, dev))


class BatchDraws:
    """Which sequences each training batch holds: `batch_size` of `pool` drawn uniformly with
    replacement. With `group_rows`, from one length group at a time (sequences whose length
    rounds up to the same multiple of it: on the mix, GSM8K's long k-shot sequences apart
    from the short code and chat ones), the group drawn in proportion to its size, so each
    sequence is still drawn with probability 1 / len(pool) while a batch pads to its own
    group's length: on the mix's samples 79% of a 256-row bucketed batch's rows are the
    sequences' own against 52% drawn from all (the context pass, its K/V and the attention's
    keys shrink with them). Batches then hold one kind of prompt at a time."""

    def __init__(self, lens: torch.Tensor, pool: torch.Tensor, batch_size: int,
                 group_rows: int = 0):
        self.pool, self.batch_size = pool, batch_size
        self.groups: list[torch.Tensor] = []
        if group_rows:
            keys = (lens[pool] + group_rows - 1) // group_rows
            self.groups = [pool[keys == k] for k in keys.unique().tolist()]
            self.sizes = torch.tensor([len(g) for g in self.groups], dtype=torch.float64)

    def draw(self, generator: torch.Generator) -> list[int]:
        members = self.pool
        if self.groups:
            members = self.groups[int(torch.multinomial(self.sizes, 1, generator=generator))]
        return members[torch.randint(len(members), (self.batch_size,),
                                     generator=generator)].tolist()


def sample_anchors(batch: Batch, num: int, generator: torch.Generator) -> torch.Tensor:
    """`[N, num]` anchors uniform over each continuation's positions that have a next token:
    `prompt_len <= anchor <= len - 2` (the first anchor is the first generated token, whose
    context is the whole prompt, as after a prefill)."""
    u = tensor_to_device(torch.rand(len(batch.lens), num, generator=generator), batch.lens.device)
    span = (batch.lens - 1 - batch.prompt_lens)[:, None]
    return batch.prompt_lens[:, None] + (u * span).long().clamp(max=span - 1)
