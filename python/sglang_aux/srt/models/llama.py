"""Llama-family decoder (`LlamaForCausalLM`), HF weight names.

DFlash/EAGLE3 aux state for HF layer id l: the residual stream (`hidden + residual`) entering
layer l + 1, as SGLang captures it. An id of the last layer captures the stream after it,
before the final norm.
"""

from __future__ import annotations

from collections.abc import Collection, Iterable
from types import SimpleNamespace

import torch
from torch import nn

from sglang_aux.srt.configs.decoder_config import (
    LayerAttention,
    check_decoder_config,
    full_attention_layers,
)
from sglang_aux.srt.distributed.parallel_state import (
    divide,
    get_pp_group,
    get_tensor_model_parallel_rank,
    get_tensor_model_parallel_world_size,
    kv_heads_per_rank,
)
from sglang_aux.srt.forward_state.forward_batch_info import ForwardBatch
from sglang_aux.srt.layers.activation import SiluAndMul
from sglang_aux.srt.layers.aux_hidden_states import (
    AuxHiddenStateList,
    AuxHiddenStatePacker,
    AuxHiddenStates,
    ProjectedAuxCapture,
    finish_aux_hidden_states,
)
from sglang_aux.srt.layers.decode_gemv import norm_linear, norm_qkv_store
from sglang_aux.srt.layers.layernorm import RMSNorm, add_norm
from sglang_aux.srt.layers.linear import MergedColumnLinear, RowParallelLinear, column_shards
from sglang_aux.srt.layers.logits_processor import LogitsProcessor, LogitsProcessorOutput
from sglang_aux.srt.layers.quantization.staged_input import MXFP8InputAccumulator
from sglang_aux.srt.layers.radix_attention import RadixAttention
from sglang_aux.srt.layers.rope_scaling import RopeScaling
from sglang_aux.srt.layers.rotary_embedding import RotaryEmbedding
from sglang_aux.srt.layers.vocab_parallel_embedding import (
    ParallelLMHead,
    VocabParallelEmbedding,
)
from sglang_aux.srt.models.weight_utils import load_named_weights


def head_dim_of(config: SimpleNamespace) -> int:
    return getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads


def qkv_shards(num_heads: int, num_kv_heads: int, head_dim: int
               ) -> tuple[dict[str, int], dict[str, tuple[int, int]]]:
    """This rank's q/k/v rows and where they start in the checkpoint: query heads split over
    ranks; KV heads split too, or, fewer than ranks, each rank holds the one its query heads
    read (replicated over `tp / num_kv_heads` ranks)."""
    tp, rank = get_tensor_model_parallel_world_size(), get_tensor_model_parallel_rank()
    q = divide(num_heads, tp, "the number of attention heads")
    kv = kv_heads_per_rank(num_kv_heads, tp)
    kv_start = rank * kv if num_kv_heads >= tp else rank * num_kv_heads // tp
    d = head_dim
    sizes = {"q_proj": q * d, "k_proj": kv * d, "v_proj": kv * d}
    slices = {"q_proj": (rank * q * d, num_heads * d),
              "k_proj": (kv_start * d, num_kv_heads * d),
              "v_proj": (kv_start * d, num_kv_heads * d)}
    return sizes, slices


class LlamaAttention(nn.Module):
    """Self-attention with one merged `qkv_proj` GEMM; per-head q/k norm (Qwen3 sets
    `q_norm`/`k_norm`), RoPE and the K/V store run as one fused step after it. Under tensor
    parallelism each rank runs its heads (`qkv_shards`) and `o_proj` sums the ranks'."""

    def __init__(self, config: SimpleNamespace, layer_id: int):
        super().__init__()
        self.head_dim = d = head_dim_of(config)
        sizes, slices = qkv_shards(config.num_attention_heads, config.num_key_value_heads, d)
        self.num_heads = sizes["q_proj"] // d  # this rank's
        self.num_kv_heads = sizes["k_proj"] // d
        qkv_bias, o_bias = self.projection_biases(config)
        h = config.hidden_size
        self.qkv_proj = MergedColumnLinear(h, sizes, bias=qkv_bias, shard_slices=slices)
        self.o_proj = RowParallelLinear(config.num_attention_heads * d, h, bias=o_bias)
        self.rotary_emb = RotaryEmbedding(d, config.max_position_embeddings,
                                          RopeScaling.from_hf_config(config))
        pattern = self.layer_attention(config, layer_id)
        self.attn = RadixAttention(self.num_heads, d, d**-0.5, self.num_kv_heads, layer_id,
                                   pattern.sliding_window_size, pattern.attn_type)
        self.q_norm: RMSNorm | None = None
        self.k_norm: RMSNorm | None = None

    @staticmethod
    def projection_biases(config: SimpleNamespace) -> tuple[bool, bool]:
        """(q/k/v bias, o_proj bias): HF Llama's `attention_bias` covers all four; Qwen2
        overrides (q/k/v biases, none on o_proj)."""
        bias = getattr(config, "attention_bias", False)
        return bias, bias

    @staticmethod
    def layer_attention(config: SimpleNamespace, layer_id: int) -> LayerAttention:
        """Which keys this layer's queries see, read as transformers reads the model type:
        Llama has no sliding windows; Qwen2 / Qwen3 and the DFlash draft override."""
        return full_attention_layers(config)[layer_id]

    def forward(self, positions: torch.Tensor, x: torch.Tensor,
                forward_batch: ForwardBatch) -> torch.Tensor:
        return self.attend(positions, self.qkv_proj(x), forward_batch)

    def attend(self, positions: torch.Tensor, qkv: torch.Tensor,
               forward_batch: ForwardBatch) -> torch.Tensor:
        """Attention and `o_proj` from the merged projection's output `[T, (H + 2 KVH) D]`."""
        q, k, v = self.qkv_proj.split(qkv)
        store = self.attn.kv_store(forward_batch)
        if store is None:  # an attention stand-in without a KV pool (DFlash training)
            q, k = self.rotary_emb(positions, q, k, self.q_norm, self.k_norm)
            return self.o_proj(self.attn(q, k, v, forward_batch))
        q = self.rotary_emb.forward_and_store(positions, q, k, v, store, self.q_norm,
                                              self.k_norm)
        return self.attend_stored(q, forward_batch)

    def attend_stored(self, q: torch.Tensor, forward_batch: ForwardBatch) -> torch.Tensor:
        """Attention and `o_proj` of rotated q `[T, H D]` whose k and v are in the pool."""
        return self.o_proj(self.attn(q, None, None, forward_batch, save_kv_cache=False))

    def norm_attend(self, norm: RMSNorm, positions: torch.Tensor, hidden: torch.Tensor,
                    residual: torch.Tensor | None, forward_batch: ForwardBatch,
                    aux: AuxHiddenStates | None) -> tuple[torch.Tensor, torch.Tensor]:
        """`(attention output, stream)` of the stream `hidden + residual` through `norm`;
        `aux` captures the stream. At one decode token on the row GEMV, the norm, qkv, RoPE
        and K/V store are one kernel (`norm_qkv_store`), else the norm and qkv are
        (`norm_linear`)."""
        stored = None
        if self.q_norm is None:
            stored = norm_qkv_store(norm, self.qkv_proj, self.rotary_emb, self.attn, positions,
                                    hidden, residual, forward_batch)
        if stored is None:
            qkv, stream = norm_linear(norm, self.qkv_proj, hidden, residual)
        else:
            q, stream = stored
        if aux is not None:
            aux.capture(stream, owned=True)
        if stored is None:
            return self.attend(positions, qkv, forward_batch), stream
        return self.attend_stored(q, forward_batch), stream


class LlamaMLP(nn.Module):
    """Gate/up column-parallel, down row-parallel: one all-reduce, or none with
    `reduce_results=False` (the MoE sums its experts first)."""

    def __init__(self, hidden_size: int, intermediate_size: int, reduce_results: bool = True):
        super().__init__()
        sizes, slices = column_shards({"gate_proj": intermediate_size,
                                       "up_proj": intermediate_size})
        self.gate_up_proj = MergedColumnLinear(hidden_size, sizes, shard_slices=slices)
        self.act_fn = SiluAndMul()
        self.down_proj = RowParallelLinear(intermediate_size, hidden_size, bias=False,
                                           reduce_results=reduce_results)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down_proj(self.act_fn(self.gate_up_proj(x)))


class LlamaDecoderLayer(nn.Module):
    attention_cls = LlamaAttention

    def __init__(self, config: SimpleNamespace, layer_id: int):
        super().__init__()
        self.self_attn = self.attention_cls(config, layer_id)
        self.mlp = LlamaMLP(config.hidden_size, config.intermediate_size)
        self.input_layernorm = RMSNorm(config.hidden_size, config.rms_norm_eps)
        self.post_attention_layernorm = RMSNorm(config.hidden_size, config.rms_norm_eps)

    def forward(self, positions: torch.Tensor, hidden: torch.Tensor,
                residual: torch.Tensor | None, forward_batch: ForwardBatch,
                aux: AuxHiddenStates | None = None) -> tuple[torch.Tensor, torch.Tensor]:
        """The residual stream entering is `hidden + residual` (`hidden` alone when residual
        is None); returns `(hidden, residual)` that sum to the stream after this layer. Each
        add is fused into the RMSNorm after it. With `aux`, the stream entering is captured:
        the fused add produces it anyway, as a fresh tensor no kernel writes later (owned).
        Each norm also runs with the projection after it (one decode GEMV kernel at one
        token: `LlamaAttention.norm_attend`, `norm_linear`), the MLP's SiLU-mul with its
        gate | up projection."""
        hidden, residual = self.self_attn.norm_attend(self.input_layernorm, positions, hidden,
                                                      residual, forward_batch, aux)
        mlp = self.mlp
        act, residual = norm_linear(self.post_attention_layernorm, mlp.gate_up_proj, hidden,
                                    residual, mlp.act_fn)
        return mlp.down_proj(act), residual


def run_decoder_layers(layers: nn.ModuleList, positions: torch.Tensor, hidden: torch.Tensor,
                       forward_batch: ForwardBatch, final_norm: RMSNorm,
                       aux: AuxHiddenStates | None = None,
                       layers_to_capture: Collection[int] = ()) -> torch.Tensor:
    """The decoder stack from embeddings `hidden` `[T, H]` to `final_norm(stream)`.

    For each i in `layers_to_capture`, `aux` captures the residual stream entering layer i
    (i == len(layers): the stream before the final norm), at no extra kernel.
    """
    residual: torch.Tensor | None = None
    for i, layer in enumerate(layers):
        wants = aux is not None and i in layers_to_capture
        hidden, residual = layer(positions, hidden, residual, forward_batch,
                                 aux if wants else None)
    out, stream = add_norm(final_norm, hidden, residual)
    if aux is not None and len(layers) in layers_to_capture:
        aux.capture(stream, owned=True)
    return out


class LlamaModel(nn.Module):
    layer_cls = LlamaDecoderLayer

    def __init__(self, config: SimpleNamespace):
        super().__init__()
        self.embed_tokens = VocabParallelEmbedding(config.vocab_size, config.hidden_size)
        self.layers = nn.ModuleList(
            [self.layer_cls(config, i) for i in range(config.num_hidden_layers)]
        )
        self.norm = RMSNorm(config.hidden_size, config.rms_norm_eps)
        self.layers_to_capture: list[int] = []

    def forward(self, input_ids: torch.Tensor, positions: torch.Tensor,
                forward_batch: ForwardBatch,
                aux: AuxHiddenStates | None) -> torch.Tensor:
        return run_decoder_layers(self.layers, positions, self.embed_tokens(input_ids),
                                  forward_batch, self.norm, aux, self.layers_to_capture)


class LlamaForCausalLM(nn.Module):
    model_cls = LlamaModel

    def __init__(self, config: SimpleNamespace):
        super().__init__()
        check_decoder_config(config)
        self.config = config
        self.model = self.model_cls(config)
        self.tie_word_embeddings = getattr(config, "tie_word_embeddings", False)
        if not self.tie_word_embeddings:
            self.lm_head = ParallelLMHead(config.vocab_size, config.hidden_size)
        self.logits_processor = LogitsProcessor()

    @property
    def lm_head_weight(self) -> torch.Tensor:
        """This rank's vocabulary rows `[V / tp, H]` (all of them on one rank)."""
        return self.model.embed_tokens.weight if self.tie_word_embeddings else self.lm_head.weight

    def get_input_embeddings(self) -> nn.Embedding:
        return self.model.embed_tokens

    def set_dflash_layers_to_capture(self, layer_ids: list[int]) -> None:
        self.model.layers_to_capture = [i + 1 for i in layer_ids]

    set_eagle3_layers_to_capture = set_dflash_layers_to_capture
    set_dspark_layers_to_capture = set_dflash_layers_to_capture

    @property
    def packs_aux_hidden_states(self) -> bool:
        # Pipeline stages receive earlier captures already concatenated: list path there.
        return bool(self.model.layers_to_capture) and get_pp_group().world_size == 1

    # Whether captures can go into a staged MXFP8 input (ForwardBatch.aux_projection); any model
    # that packs can feed a streamed projection.
    supports_staged_aux_projection = False

    def get_packed_aux_hidden_size(self) -> int:
        """SupportsSharedAuxHiddenStates: the packed width `K * hidden`, 0 when the model does
        not pack (nothing to capture, or a pipeline stage).

        NOTE: upstream SGLang keeps the Llama family on the list path. We opt in because the
        DFlash worker consumes a step's aux rows (draft KV materialization) before the next
        target forward; test_dflash_worker.py poisons the buffer right after consumption to
        hold it to that.
        """
        if not self.packs_aux_hidden_states:
            return 0
        return len(self.model.layers_to_capture) * self.config.hidden_size

    def get_aux_hidden_states_width(self) -> int:
        """SGLang 0.5.23's name for `get_packed_aux_hidden_size`."""
        return self.get_packed_aux_hidden_size()

    def _new_aux(self, forward_batch: ForwardBatch) -> AuxHiddenStates | None:
        num = len(self.model.layers_to_capture)
        if num == 0:
            return None
        projection = forward_batch.aux_projection
        if isinstance(projection, MXFP8InputAccumulator) and (
                not self.supports_staged_aux_projection or forward_batch.is_capturing):
            raise ValueError(f"{type(self).__name__} cannot stage aux states here "
                             "(graph capture, or a model on the list path)")
        if projection is not None:
            # A streamed projection needs the captures as ordered [T, H] slices: one stage.
            if not self.packs_aux_hidden_states:
                raise ValueError(f"{type(self).__name__} cannot project aux states as tapped "
                                 f"(pipeline stage of {get_pp_group().world_size})")
            return ProjectedAuxCapture(projection)
        if self.packs_aux_hidden_states:
            return AuxHiddenStatePacker.for_batch(forward_batch, num)
        return AuxHiddenStateList()

    @torch.no_grad()
    def forward(self, input_ids: torch.Tensor, positions: torch.Tensor,
                forward_batch: ForwardBatch) -> LogitsProcessorOutput:
        aux = self._new_aux(forward_batch)
        hidden = self.model(input_ids, positions, forward_batch, aux)
        packed = finish_aux_hidden_states(aux) if aux is not None else None
        return self.logits_processor(hidden, self.lm_head_weight, forward_batch, packed)

    def load_weights(self, weights: Iterable[tuple[str, torch.Tensor]]) -> None:
        skip = {"lm_head.weight"} if self.tie_word_embeddings else set()
        load_named_weights(self, weights, skip=skip)


EntryClass = LlamaForCausalLM
