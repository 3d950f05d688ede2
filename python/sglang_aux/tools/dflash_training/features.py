"""The target's aux hidden states of every training sequence, as the DFlash worker sees them:
one EXTEND forward per sequence with the draft's `target_layer_ids` captured."""

from __future__ import annotations

import logging

import torch

from sglang_aux.srt.managers.schedule_batch import Req, build_extend_batch, release_kv
from sglang_aux.srt.model_executor.forward_batch_info import CaptureHiddenMode
from sglang_aux.srt.model_executor.model_runner import ModelRunner
from sglang_aux.srt.sampling.sampling_params import SamplingParams
from sglang_aux.tools.dflash_training.data import Sample

logger = logging.getLogger(__name__)


def _batches(samples: list[Sample], max_tokens: int, max_reqs: int) -> list[list[int]]:
    """Consecutive sample indices, at most `max_reqs` and `max_tokens` tokens per batch
    (a longer sample goes alone)."""
    out, cur, used = [], [], 0
    for i, s in enumerate(samples):
        n = len(s.ids)
        if cur and (used + n > max_tokens or len(cur) == max_reqs):
            out.append(cur)
            cur, used = [], 0
        cur.append(i)
        used += n
    return out + ([cur] if cur else [])


@torch.no_grad()
def extract_aux(runner: ModelRunner, samples: list[Sample], layer_ids: list[int],
                skip: int = 0) -> tuple[torch.Tensor, list[torch.Tensor]]:
    """The first sample's rows `[skip, K * H]` before position `skip` (the prefix every sample
    shares), and per sample its rows from `skip` on, `[len(ids) - skip, K * H]`: copies in the
    target's dtype on its device (a batch's whole output is not kept).

    Runs on `runner`'s own KV memory and request rows (everything is given back), so the
    runner of the data-generation Engine can do it once generation is over.
    """
    runner.model.set_dflash_layers_to_capture(layer_ids)
    pool, alloc = runner.req_to_token_pool, runner.token_to_kv_pool_allocator
    out: list[torch.Tensor] = []
    prefix = None
    for batch in _batches(samples, alloc.available_size(), pool.available_size()):
        reqs = [Req(f"aux-{i}", samples[i].ids, SamplingParams()) for i in batch]
        for r in reqs:
            r.req_pool_idx = pool.alloc()
        # FULL runs it eagerly: the runner's graphs were captured before these layers were set
        # to be captured, so they return no aux rows
        fb = build_extend_batch(runner, reqs, CaptureHiddenMode.FULL)
        rows = runner.forward(fb).aux_hidden_states.split([len(r.origin_input_ids) for r in reqs])
        if prefix is None:
            prefix = rows[0][:skip].clone()
        out += [a[skip:].clone() for a in rows]
        for r in reqs:
            release_kv(runner, r)
        if len(out) % 1024 < len(batch):
            logger.info("aux states for %d/%d sequences", len(out), len(samples))
    runner.model.set_dflash_layers_to_capture([])
    return prefix, out
