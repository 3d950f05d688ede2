"""DFlash draft (`DFlashDraftModel`): a few Qwen3-style layers drafting a block in parallel.

Context: the target's K aux states of a committed token, `[K * H_target]`, are projected once
by `fc` and `hidden_norm`; every draft layer turns that projection into K/V with its own k/v
weights (k_norm, RoPE at the token's position) and stores them in the draft KV cache at the
slot the target gave the token. Drafting: the block `[anchor, MASK x (B-1)]`, embedded by the
target's embedding, attends to the cached context and to the block (DRAFT_BLOCK mode) as each
layer's `layer_types` entry says (`dflash_layer_attention`: full layers see everything and are
non-causal inside the block, sliding layers are causal and windowed); block offset j predicts
the token at offset j through the target's LM head, so one forward proposes B-1 tokens.
"""

from __future__ import annotations

from collections.abc import Iterable
from types import SimpleNamespace

import torch
from torch import nn
from torch.nn import functional as F

from sglang_aux.srt.configs.decoder_config import LayerAttention, check_decoder_config
from sglang_aux.srt.configs.dflash_config import DFlashConfig, dflash_layer_attention
from sglang_aux.srt.forward_state.forward_batch_info import ForwardBatch
from sglang_aux.srt.layers.kv_store import KVStore
from sglang_aux.srt.layers.layernorm import RMSNorm
from sglang_aux.srt.layers.logits_processor import LogitsProcessor, LogitsProcessorOutput
from sglang_aux.srt.layers.quantization.mxfp8_linear import MXFP8Linear
from sglang_aux.srt.layers.quantization.staged_input import DeferredOutput, MXFP8InputAccumulator
from sglang_aux.srt.layers.quantization.streamed_projection import StreamedProjection
from sglang_aux.srt.mem_cache.memory_pool import MHATokenToKVPool
from sglang_aux.srt.models.llama import run_decoder_layers
from sglang_aux.srt.models.qwen3 import Qwen3Attention, Qwen3DecoderLayer
from sglang_aux.srt.models.weight_utils import load_named_weights

BORROWED_FROM_TARGET = ("embed_tokens", "lm_head")


class DFlashAttention(Qwen3Attention):
    @staticmethod
    def layer_attention(config: SimpleNamespace, layer_id: int) -> LayerAttention:
        return dflash_layer_attention(config)[layer_id]


class DFlashDecoderLayer(Qwen3DecoderLayer):
    attention_cls = DFlashAttention


class DFlashDraftModel(nn.Module):
    def __init__(self, config: SimpleNamespace):
        super().__init__()
        check_decoder_config(config)
        self.config = config
        self.dflash_config = DFlashConfig.from_hf_config(config)
        dc, h = self.dflash_config, config.hidden_size
        self.fc = nn.Linear(len(dc.target_layer_ids) * dc.target_hidden_size, h, bias=False)
        self.hidden_norm = RMSNorm(h, config.rms_norm_eps)
        self.layers = nn.ModuleList(
            [DFlashDecoderLayer(config, i) for i in range(config.num_hidden_layers)]
        )
        self.norm = RMSNorm(h, config.rms_norm_eps)
        self.logits_processor = LogitsProcessor()
        self.fc_mxfp8: MXFP8Linear | None = None
        # The target's embedding and LM head, borrowed (not parameters of the draft).
        self._target: dict[str, nn.Module | torch.Tensor] = {}
        self.token_ids: torch.Tensor | None = None  # the draft vocabulary; None: the target's
        # (weights' (data_ptr, version) key, stacked context k/v weight and bias)
        self._context_kv_cache: tuple[tuple, tuple[torch.Tensor, torch.Tensor | None]] | None = None

    def set_target_modules(self, embed_tokens: nn.Embedding, lm_head_weight: torch.Tensor,
                           token_ids: torch.Tensor | None = None) -> None:
        """The target's embedding and LM head; with a draft vocabulary (`token_ids` `[H]`,
        `speculative/token_map.py`) the head is its cut rows `[H, hidden]`, whole on every
        rank, and logits column j is token `token_ids[j]`."""
        if embed_tokens.embedding_dim != self.config.hidden_size:
            raise ValueError(
                f"target embedding width {embed_tokens.embedding_dim} != draft hidden size "
                f"{self.config.hidden_size}"
            )
        if token_ids is not None and tuple(lm_head_weight.shape) != (
                token_ids.numel(), self.config.hidden_size):
            raise ValueError(f"a draft vocabulary of {token_ids.numel()} ids needs its cut head "
                             f"({token_ids.numel()}, {self.config.hidden_size}), got "
                             f"{tuple(lm_head_weight.shape)}")
        self._target = {"embed": embed_tokens, "lm_head": lm_head_weight}
        self.token_ids = token_ids

    def _borrowed(self, name: str):
        if name not in self._target:
            raise RuntimeError("call set_target_modules(...) before running the draft")
        return self._target[name]

    def get_input_embeddings(self) -> nn.Embedding:
        """The target's embedding (borrowed), as a target model answers."""
        return self._borrowed("embed")

    @property
    def lm_head_weight(self) -> torch.Tensor:
        """The target's LM head (borrowed), as a target model answers; with a draft vocabulary,
        its rows (`token_ids`)."""
        return self._borrowed("lm_head")

    def draft_logits(self, hidden: torch.Tensor, forward_batch: ForwardBatch
                     ) -> LogitsProcessorOutput:
        """The LM head over the rows the batch asks for: `[rows, vocab]`, or `[rows, H]` over
        the draft vocabulary (no gather: its head is whole on every rank)."""
        return self.logits_processor(hidden, self.lm_head_weight, forward_batch,
                                     replicated=self.token_ids is not None)

    def quantize_fc_mxfp8(self) -> None:
        """Keep `fc` as MXFP8 (weights quantized once, here); every projection then runs the
        MXFP8 GEMM, from a concat of aux rows or from a staged input alike."""
        self.fc_mxfp8 = MXFP8Linear.from_float(self.fc.weight.detach(),
                                               out_dtype=self.fc.weight.dtype)

    @property
    def fc_is_mxfp8(self) -> bool:
        return self.fc_mxfp8 is not None

    def new_staged_projection(self, num_tokens: int, aux_dtype: torch.dtype
                              ) -> MXFP8InputAccumulator:
        """A staged MXFP8 input for `num_tokens` aux rows; its fc output `[T, H]` is allocated
        when the last slice arrives, after the target forward's own peak."""
        if self.fc_mxfp8 is None:
            raise RuntimeError("the staged projection needs an MXFP8 fc (quantize_fc_mxfp8)")
        dc = self.dflash_config
        out = DeferredOutput(num_tokens, self.fc.weight.dtype, self.fc.weight.device)
        return MXFP8InputAccumulator(self.fc_mxfp8, out, dc.target_hidden_size,
                                     len(dc.target_layer_ids), dtype=aux_dtype,
                                     candidate=self._fc_candidate(num_tokens))

    def new_streamed_projection(self, num_tokens: int, aux_dtype: torch.dtype,
                                acc: torch.Tensor | None = None) -> StreamedProjection:
        """A streamed fc projection of `num_tokens` aux rows into `acc` `[T, H]` fp32 (a
        caller's buffer, e.g. a graph runner's row slice; allocated when None)."""
        dc = self.dflash_config
        if acc is None:
            acc = torch.empty((num_tokens, self.fc.out_features), dtype=torch.float32,
                              device=self.fc.weight.device)
        weight = self.fc_mxfp8 if self.fc_mxfp8 is not None else self.fc.weight.detach()
        return StreamedProjection(weight, acc, dc.target_hidden_size, len(dc.target_layer_ids),
                                  dtype=aux_dtype, out_dtype=self.fc.weight.dtype,
                                  candidate=self._fc_candidate(num_tokens))

    def _fc_candidate(self, num_tokens: int) -> str | None:
        """The MXFP8 fc GEMM for `num_tokens` rows, the same for the staged, streamed and
        concat calls (`mxfp8_gemm_choice.sliced_choice`); None with a bf16 fc."""
        if self.fc_mxfp8 is None:
            return None
        from sglang_aux.srt.layers.quantization.mxfp8_gemm_choice import sliced_choice

        return sliced_choice(num_tokens, self.dflash_config.target_hidden_size)

    def fc_forward(self, aux: torch.Tensor) -> torch.Tensor:
        """`[N, K * H_target]` aux rows -> `[N, H]` fc output (before hidden_norm)."""
        if aux.shape[-1] != self.fc.in_features:
            raise ValueError(
                f"aux rows {tuple(aux.shape)} do not match the draft fc input width "
                f"{self.fc.in_features}"
            )
        if self.fc_mxfp8 is not None:
            return self.fc_mxfp8(aux, candidate=self._fc_candidate(aux.shape[0]))
        return self.fc(aux.to(self.fc.weight.dtype))

    def project_context(self, aux: torch.Tensor) -> torch.Tensor:
        """`[N, K * H_target]` aux rows -> `[N, H]` draft context."""
        return self.hidden_norm(self.fc_forward(aux))

    @torch.no_grad()
    def write_context_kv(self, aux: torch.Tensor, positions: torch.Tensor,
                         out_cache_loc: torch.Tensor, kv_pool: MHATokenToKVPool) -> None:
        """Store every draft layer's context K/V for committed tokens at their slots."""
        self.write_projected_context_kv(self.fc_forward(aux), positions, out_cache_loc, kv_pool)

    @torch.no_grad()
    def write_projected_context_kv(self, fc_out: torch.Tensor, positions: torch.Tensor,
                                   out_cache_loc: torch.Tensor, kv_pool: MHATokenToKVPool
                                   ) -> None:
        """As `write_context_kv`, from the fc output (a staged or streamed projection's result).

        One GEMM for every layer's k/v, then per layer one fused k_norm + RoPE + store."""
        rows = self._context_kv_rows(self.hidden_norm(fc_out))
        for i, (layer, (k, v)) in enumerate(zip(self.layers, rows, strict=True)):
            attn = layer.self_attn
            attn.rotary_emb.forward_and_store(positions, None, k, v,
                                              KVStore(kv_pool, i, out_cache_loc),
                                              k_norm=attn.k_norm)

    def context_kv(self, ctx: torch.Tensor, positions: torch.Tensor
                   ) -> list[tuple[torch.Tensor, torch.Tensor]]:
        """Per draft layer, the context `(k, v)` `[N, KVH, D]` of projected context `ctx`
        `[N, H]` at `positions` `[N]`: the layer's k/v weights, k_norm, RoPE on k. Training
        calls this too, so inference and training share one definition."""
        out = []
        for layer, (k, v) in zip(self.layers, self._context_kv_rows(ctx), strict=True):
            attn = layer.self_attn
            _, k = attn.rotary_emb(positions, None, k, k_norm=attn.k_norm)
            shape = (-1, attn.num_kv_heads, attn.head_dim)
            out.append((k.view(shape), v.view(shape)))
        return out

    def _context_kv_rows(self, ctx: torch.Tensor) -> list[tuple[torch.Tensor, torch.Tensor]]:
        """Per layer `(k, v)` `[N, KVH * D]`: views of one `[N, L * 2 * KVH * D]` GEMM."""
        weight, bias = self._context_kv_params()
        kv = F.linear(ctx, weight, bias)
        chunks = kv.chunk(2 * len(self.layers), dim=-1)
        return [(chunks[2 * i], chunks[2 * i + 1]) for i in range(len(self.layers))]

    def _context_kv_params(self) -> tuple[torch.Tensor, torch.Tensor | None]:
        """Every layer's k and v rows of `qkv_proj`, stacked layer-major `[L * 2 * KVH * D, H]`
        (and the bias alike). Without autograd the stack is kept and rebuilt only when a
        layer's weights change (their version counters); with it, it is rebuilt each call
        so gradients reach the layers' own weights."""
        projs = [layer.self_attn.qkv_proj for layer in self.layers]
        key = tuple((p.weight.data_ptr(), p.weight._version) for p in projs)
        cache = self._context_kv_cache
        if not torch.is_grad_enabled() and cache is not None and cache[0] == key:
            return cache[1]

        def stack(name: str) -> torch.Tensor | None:
            if getattr(projs[0], name) is None:
                return None
            return torch.cat([p.shard_param(s, name) for p in projs for s in ("k_proj", "v_proj")])

        params = stack("weight"), stack("bias")
        if not torch.is_grad_enabled():
            self._context_kv_cache = (key, params)
        return params

    def block_hidden(self, x: torch.Tensor, positions: torch.Tensor,
                     forward_batch: ForwardBatch) -> torch.Tensor:
        """Block embeddings `x` `[T, H]` through the draft layers and the final norm."""
        return run_decoder_layers(self.layers, positions, x, forward_batch, self.norm)

    @torch.no_grad()
    def forward(self, input_ids: torch.Tensor, positions: torch.Tensor,
                forward_batch: ForwardBatch) -> LogitsProcessorOutput:
        """Logits `[bs * B, vocab]` (`[bs * B, H]` over a draft vocabulary) for every block
        position (DRAFT_BLOCK batches)."""
        hidden = self.block_hidden(self.get_input_embeddings()(input_ids), positions,
                                   forward_batch)
        return self.draft_logits(hidden, forward_batch)

    def load_weights(self, weights: Iterable[tuple[str, torch.Tensor]]) -> None:
        """Published drafts name tensors without the `model.` prefix (stripped when present);
        an embedding or LM head in the checkpoint is skipped (the target's are used)."""
        def renamed():
            for name, tensor in weights:
                name = name.removeprefix("model.")
                if name.split(".")[0] not in BORROWED_FROM_TARGET:
                    yield name, tensor

        load_named_weights(self, renamed())
        # Stack the context k/v weights now, not on a first call inside a graph capture.
        with torch.no_grad():
            self._context_kv_params()


EntryClass = DFlashDraftModel
