"""The draft's block forward for training: dense attention instead of the paged KV cache.

It runs the draft's own decoder layers (`DFlashDraftModel.layers`) on `[anchor, MASK x (B-1)]`
blocks; their `RadixAttention` hands the work to `forward_batch.attn_backend`, which here is
`DenseBlockAttention`: block queries see the context K/V of every position before their anchor
(made exactly as `write_projected_context_kv` makes the cached ones) and their whole block,
as the paged DRAFT_BLOCK backend does at inference. So training and inference are one
function (test_train_dflash checks them equal).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from sglang_aux.srt.configs.decoder_config import FULL_CONTEXT
from sglang_aux.srt.models.dflash import DFlashDraftModel


class DenseBlockAttention:
    """Attention backend (and stand-in ForwardBatch: `RadixAttention` reads only
    `forward_batch.attn_backend`) for `N` sequences with `Q = A * B` block queries each.

    `ctx_kv[l]` is layer l's context `(k, v)`, each `[N, T, KVH, D]`; `mask` `[N, Q, T + Q]`
    says which context and block keys every query sees.
    """

    def __init__(self, ctx_kv: list[tuple[torch.Tensor, torch.Tensor]], mask: torch.Tensor,
                 grouped_kv: bool):
        self.ctx_kv = ctx_kv
        self.mask = mask
        self.attn_backend = self
        self.gqa = grouped_kv

    def forward(self, q, k, v, layer, forward_batch, save_kv_cache: bool = True) -> torch.Tensor:
        del forward_batch, save_kv_cache  # nothing is cached in training
        if layer.is_causal or layer.sliding_window_size != FULL_CONTEXT:
            raise NotImplementedError(f"training draft layer {layer.layer_id}: only full, "
                                      "bidirectional layers (no sliding_attention)")
        n, num_q = self.mask.shape[:2]
        ctx_k, ctx_v = self.ctx_kv[layer.layer_id]
        keys = torch.cat([ctx_k, k.view(n, num_q, *ctx_k.shape[2:]).to(ctx_k.dtype)], dim=1)
        vals = torch.cat([ctx_v, v.view(n, num_q, *ctx_v.shape[2:]).to(ctx_v.dtype)], dim=1)
        q = q.view(n, num_q, layer.tp_q_head_num, layer.head_dim)
        gqa = self.gqa
        if not gqa:  # one K/V head per query head, as the memory-efficient kernel reads them
            keys, vals = (x.repeat_interleave(layer.tp_q_head_num // x.shape[2], dim=2)
                          for x in (keys, vals))
        out = F.scaled_dot_product_attention(
            q.transpose(1, 2), keys.to(q.dtype).transpose(1, 2), vals.to(q.dtype).transpose(1, 2),
            attn_mask=self.mask[:, None], scale=layer.scaling, enable_gqa=gqa,
        )  # [N, H, Q, D]
        return out.transpose(1, 2).reshape(n * num_q, -1)


def grouped_kv_kernel_enabled() -> bool:
    """Whether an enabled SDPA kernel takes grouped K/V heads (`enable_gqa`): the
    memory-efficient one, alone under `sdpa_kernel` (`--sdpa-backend efficient`), does not."""
    b = torch.backends.cuda
    return b.flash_sdp_enabled() or b.cudnn_sdp_enabled() or b.math_sdp_enabled()


def context_kv(draft: DFlashDraftModel, aux: torch.Tensor, rows: torch.Tensor | None = None
               ) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """Per draft layer, the context `(k, v)` `[N, T, KVH, D]` of aux rows `[N, T, K * H_t]` at
    positions 0..T-1 (fc -> hidden_norm -> k/v proj, k_norm, RoPE on k). With `rows` (the
    flat indices of the sequences' own rows, `Batch.rows`) only those are projected and the
    padding's K/V are zeros: no query sees them, so the block outputs are the same."""
    n, t = aux.shape[:2]
    positions = torch.arange(t, device=aux.device).repeat(n)
    if rows is None:
        kv = draft.context_kv(draft.project_context(aux.flatten(0, 1)), positions)
    else:
        own = draft.context_kv(draft.project_context(aux.flatten(0, 1).index_select(0, rows)),
                               positions.index_select(0, rows))
        kv = [tuple(x.new_zeros(n * t, *x.shape[1:]).index_copy(0, rows, x) for x in pair)
              for pair in own]
    return [(k.view(n, t, *k.shape[1:]), v.view(n, t, *v.shape[1:])) for k, v in kv]


def block_mask(anchors: torch.Tensor, context_len: int, block_size: int) -> torch.Tensor:
    """`[N, A*B, T + A*B]`: a query of block a sees context positions `< anchors[:, a]` and
    every position of its own block (non-causal inside the block), nothing else."""
    n, num_blocks = anchors.shape
    dev = anchors.device
    q_anchor = anchors.repeat_interleave(block_size, dim=1)  # [N, Q]
    ctx = torch.arange(context_len, device=dev)[None, None, :] < q_anchor[:, :, None]
    blk = torch.arange(num_blocks, device=dev).repeat_interleave(block_size)  # [Q]
    own = (blk[:, None] == blk[None, :]).expand(n, -1, -1)
    return torch.cat([ctx, own], dim=2)


def block_inputs(input_ids: torch.Tensor, anchors: torch.Tensor, block_size: int,
                 mask_token_id: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Block token ids `[N, A*B]` (`[anchor token, MASK x (B-1)]` per block) and positions."""
    n, num_blocks = anchors.shape
    ids = torch.full((n, num_blocks, block_size), mask_token_id, dtype=input_ids.dtype,
                     device=input_ids.device)
    ids[:, :, 0] = input_ids.gather(1, anchors)
    offsets = torch.arange(block_size, device=anchors.device)
    positions = anchors[:, :, None] + offsets  # [N, A, B]
    return ids.flatten(1), positions.flatten(1)


def draft_block_hidden(draft: DFlashDraftModel, embed: nn.Embedding, aux: torch.Tensor,
                       input_ids: torch.Tensor, anchors: torch.Tensor, mask_token_id: int,
                       grouped_kv: bool | None = None, context_rows: torch.Tensor | None = None
                       ) -> torch.Tensor:
    """Final draft hidden states `[N, A, B, H]` of every block position.

    aux `[N, T, K * H_t]` and input_ids `[N, T]` are padded sequences; anchors `[N, A]` are
    positions with `1 <= anchor < T`. Rows past a sequence's end are never read, because no
    query sees a context position at or after its anchor. `grouped_kv`: whether the enabled
    SDPA kernels take grouped K/V heads (None: asked here; a compiled caller passes it, as
    the question cannot be traced). `context_rows`: project only these context rows
    (`context_kv`).
    """
    b = draft.dflash_config.draft_block_size
    n, t = input_ids.shape
    ids, positions = block_inputs(input_ids, anchors, b, mask_token_id)
    if grouped_kv is None:
        grouped_kv = grouped_kv_kernel_enabled()
    backend = DenseBlockAttention(context_kv(draft, aux, context_rows),
                                  block_mask(anchors, t, b), grouped_kv)
    # The residual stream in the draft's parameter dtype (fp32 master weights in training).
    x = embed(ids.flatten()).to(draft.fc.weight.dtype)
    return draft.block_hidden(x, positions.flatten(), backend).view(n, anchors.shape[1], b, -1)
