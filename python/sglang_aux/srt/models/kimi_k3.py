"""Kimi-K3-style decoder (`KimiK3ForCausalLM`): Block Attention Residuals, GQA, dense MLP / MoE.

Block AttnRes replaces the residual stream. Layers are grouped in blocks of
`attn_res_block_size`. The *sources* a sublayer reads are the completed block summaries
(the token embedding first, then each completed block's sum of sublayer outputs) plus the
current block's partial sum once it is nonempty. Before attention and before the MLP, a
layer mixes its sources with a softmax over sources, scored by a learned pseudo-query
`[hidden]` dotted with the RMSNorm (own weight) of each source; its input norm
(`input_layernorm` / `post_attention_layernorm`) then applies to the mixture, and the
sublayer's output is added to the partial sum. After the last layer an output aggregation
mixes all sources; `model.norm` and `lm_head` follow.

Parameter names (HF-style):
    model.embed_tokens.weight
    model.layers.{i}.self_attn.{q,k,v,o}_proj.weight
    model.layers.{i}.input_layernorm.weight, model.layers.{i}.post_attention_layernorm.weight
    model.layers.{i}.attn_res_query_attn, model.layers.{i}.attn_res_norm_attn.weight
    model.layers.{i}.attn_res_query_mlp, model.layers.{i}.attn_res_norm_mlp.weight
    model.layers.{i}.mlp.{gate,up,down}_proj.weight              dense layers
    model.layers.{i}.mlp.gate.weight                             MoE router [num_experts, hidden]
    model.layers.{i}.mlp.experts.{e}.{gate,up,down}_proj.weight  routed experts
    model.layers.{i}.mlp.shared_experts.{gate,up,down}_proj.weight
    model.final_attn_res_query, model.final_attn_res_norm.weight
    model.norm.weight, lm_head.weight (absent with tie_word_embeddings)

Layers `i < first_k_dense_replace` (all of them when `num_experts == 0`) are dense.

DFlash/DSpark/EAGLE3 aux state for layer id l: the pre-norm AttnRes mixture that layer l + 1's
attention reads; for the last layer, the output aggregation (before `model.norm`). Ids name
layer outputs directly (no +1 shift). Captures come out in ascending id order, whatever the
order passed to `set_dflash_layers_to_capture`: column block j of the packed
`[tokens, K * hidden]` is the j-th smallest id.
"""

from __future__ import annotations

from types import SimpleNamespace

import torch
from torch import nn

from sglang_aux.srt.distributed.communication_op import tensor_model_parallel_all_reduce
from sglang_aux.srt.forward_state.forward_batch_info import ForwardBatch
from sglang_aux.srt.layers.aux_hidden_states import AuxHiddenStates
from sglang_aux.srt.layers.layernorm import RMSNorm
from sglang_aux.srt.layers.triton_ops.dispatch import use_triton
from sglang_aux.srt.layers.vocab_parallel_embedding import VocabParallelEmbedding
from sglang_aux.srt.models.llama import LlamaAttention, LlamaForCausalLM, LlamaMLP


def new_pseudo_query(hidden_size: int) -> nn.Parameter:
    # The paper starts from zero (uniform mixing) and training moves it. Our checkpoints are
    # random, so a std of 1/sqrt(hidden) gives unit-variance scores against RMS-normed keys:
    # a clearly non-uniform softmax that lets tests tell the sources apart.
    return nn.Parameter(torch.randn(hidden_size) * hidden_size**-0.5)


def attn_res_mix(sources: list[torch.Tensor], query: torch.Tensor, norm: RMSNorm) -> torch.Tensor:
    """Softmax-over-sources mixture of `sources` (each `[T, H]`) -> a new `[T, H]` tensor.

    Out of place: the sources are summaries and partial sums other code still holds.
    The score `<RMSNorm(v), q>` is computed as `rsqrt(mean(v^2) + eps) * <v, g * q>` (g the
    norm weight), one source at a time, so no `[S, T, H]` stack or normalized copy is ever
    materialized: in a decode graph the largest size's transients set the size of the graph
    memory pool every other size reuses. The Triton kernel (up to MAX_SOURCES sources) reads
    each source once with an online softmax; this loop is its torch twin.
    """
    if use_triton(sources[0]):
        from sglang_aux.srt.layers.triton_ops import attn_res_mix as fused

        if len(sources) <= fused.MAX_SOURCES:
            return fused.attn_res_mix(sources, query, norm.weight, norm.variance_epsilon)
    gq = norm.weight.float() * query.float()  # [H]
    scores = []
    for v in sources:
        vf = v.float()
        rms = torch.rsqrt(vf.pow(2).mean(-1) + norm.variance_epsilon)
        scores.append((vf @ gq) * rms)  # [T]
    weights = torch.stack(scores).softmax(dim=0)  # [S, T]
    mixed = torch.zeros(sources[0].shape, dtype=torch.float32, device=sources[0].device)
    for w, v in zip(weights, sources, strict=True):
        mixed.addcmul_(v, w.unsqueeze(-1))
    return mixed.to(sources[0].dtype)


def with_partial(blocks: list[torch.Tensor], partial: torch.Tensor | None) -> list[torch.Tensor]:
    """The sources: completed block summaries, plus the current block's partial sum if any."""
    return blocks if partial is None else [*blocks, partial]


class KimiK3MoE(nn.Module):
    """Softmax router, top-k with renormalized weights, routed experts plus shared experts.

    NOTE: every expert runs on every token, weighted by a dense `[T, E]` routing matrix that
    is zero off the top-k: fixed shapes and no data-dependent control flow, so a decode graph
    can capture it. Fine at test sizes; a grouped-GEMM kernel would replace it at scale.

    Tensor parallelism (SGLang's TP MoE, not expert parallelism): every rank holds every
    expert, each split along its intermediate dimension like a dense MLP; the router is
    replicated. The routed mixture and the shared experts are linear in the ranks' partial
    down projections, so they are summed locally and reduced once per layer.
    """

    def __init__(self, config: SimpleNamespace):
        super().__init__()
        h, inter = config.hidden_size, config.moe_intermediate_size
        self.top_k = config.num_experts_per_tok
        if not 0 < self.top_k <= config.num_experts:
            raise ValueError(
                f"num_experts_per_tok={self.top_k} must be in [1, num_experts={config.num_experts}]"
            )
        self.gate = nn.Linear(h, config.num_experts, bias=False)
        self.experts = nn.ModuleList([LlamaMLP(h, inter, reduce_results=False)
                                      for _ in range(config.num_experts)])
        n_shared = getattr(config, "n_shared_experts", 0) or 0
        self.shared_experts = (LlamaMLP(h, inter * n_shared, reduce_results=False)
                               if n_shared > 0 else None)

    def routing_weights(self, x: torch.Tensor) -> torch.Tensor:
        """`[T, E]` fp32 weights: renormalized top-k softmax probabilities, zero elsewhere."""
        probs = self.gate(x).float().softmax(dim=-1)
        top_w, top_i = probs.topk(self.top_k, dim=-1)  # [T, k] each
        top_w = top_w / top_w.sum(dim=-1, keepdim=True)
        return torch.zeros_like(probs).scatter(-1, top_i, top_w)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        weights = self.routing_weights(x)
        # One expert's output live at a time, summed in fp32: a stack of all of them [T, E, H]
        # (and its copies) was the K3-shaped chunk step's peak (docs/chunked_prefill.md).
        out = torch.zeros(x.shape, dtype=torch.float32, device=x.device)
        for e, expert in enumerate(self.experts):
            out.addcmul_(weights[:, e:e + 1], expert(x))
        if self.shared_experts is not None:
            out += self.shared_experts(x)
        return tensor_model_parallel_all_reduce(out.to(x.dtype))


class KimiK3DecoderLayer(nn.Module):
    def __init__(self, config: SimpleNamespace, layer_id: int):
        super().__init__()
        h, eps = config.hidden_size, config.rms_norm_eps
        self.self_attn = LlamaAttention(config, layer_id)
        dense = layer_id < getattr(config, "first_k_dense_replace", 0)
        if dense or not getattr(config, "num_experts", 0):
            self.mlp = LlamaMLP(h, config.intermediate_size)
        else:
            self.mlp = KimiK3MoE(config)
        self.input_layernorm = RMSNorm(h, eps)
        self.post_attention_layernorm = RMSNorm(h, eps)
        self.attn_res_query_attn = new_pseudo_query(h)
        self.attn_res_norm_attn = RMSNorm(h, eps)
        self.attn_res_query_mlp = new_pseudo_query(h)
        self.attn_res_norm_mlp = RMSNorm(h, eps)

    def forward(self, positions: torch.Tensor, blocks: list[torch.Tensor],
                partial: torch.Tensor | None,
                forward_batch: ForwardBatch) -> tuple[torch.Tensor, torch.Tensor]:
        """Returns (the pre-norm mixture attention read, the block's new partial sum).

        Neither `blocks` nor `partial` is written: the partial sum is rebound, never updated.
        """
        attn_in = attn_res_mix(with_partial(blocks, partial), self.attn_res_query_attn,
                               self.attn_res_norm_attn)
        out = self.self_attn(positions, self.input_layernorm(attn_in), forward_batch)
        partial = out if partial is None else partial + out
        mlp_in = attn_res_mix([*blocks, partial], self.attn_res_query_mlp, self.attn_res_norm_mlp)
        partial = partial + self.mlp(self.post_attention_layernorm(mlp_in))
        return attn_in, partial


class KimiK3Model(nn.Module):
    def __init__(self, config: SimpleNamespace):
        super().__init__()
        self.block_size = config.attn_res_block_size
        if self.block_size < 1:
            raise ValueError(f"attn_res_block_size must be >= 1, got {self.block_size}")
        h, eps = config.hidden_size, config.rms_norm_eps
        self.embed_tokens = VocabParallelEmbedding(config.vocab_size, h)
        self.layers = nn.ModuleList(
            [KimiK3DecoderLayer(config, i) for i in range(config.num_hidden_layers)]
        )
        self.final_attn_res_query = new_pseudo_query(h)
        self.final_attn_res_norm = RMSNorm(h, eps)
        self.norm = RMSNorm(h, eps)
        self.layers_to_capture: list[int] = []  # layer ids, ascending

    def forward(self, input_ids: torch.Tensor, positions: torch.Tensor,
                forward_batch: ForwardBatch, aux: AuxHiddenStates | None) -> torch.Tensor:
        capture = set(self.layers_to_capture) if aux is not None else set()
        blocks = [self.embed_tokens(input_ids)]  # completed block summaries, [T, H] each
        partial: torch.Tensor | None = None  # sum of the current block's sublayer outputs
        for i, layer in enumerate(self.layers):
            attn_in, partial = layer(positions, blocks, partial, forward_batch)
            if i - 1 in capture:
                # attn_in is a fresh tensor nobody writes afterwards, so the list may keep it.
                aux.capture(attn_in, owned=True)
            if (i + 1) % self.block_size == 0:
                blocks, partial = [*blocks, partial], None
        out = attn_res_mix(with_partial(blocks, partial), self.final_attn_res_query,
                           self.final_attn_res_norm)
        if len(self.layers) - 1 in capture:
            aux.capture(out, owned=True)
        return self.norm(out)


class KimiK3ForCausalLM(LlamaForCausalLM):
    """The Llama wrapper (LM head, aux path choice, weight loading) around the AttnRes decoder.

    Implements `SupportsSharedAuxHiddenStates`: with layers to capture on a single pipeline
    stage, captures land in `forward_batch.aux_hidden_states_buffer` when a graph runner
    provides one.
    """

    model_cls = KimiK3Model
    supports_staged_aux_projection = True

    def set_dflash_layers_to_capture(self, layer_ids: list[int]) -> None:
        num_layers = len(self.model.layers)
        bad = [i for i in layer_ids if not 0 <= i < num_layers]
        if bad:
            raise ValueError(f"layer ids {bad} out of range for {num_layers} layers")
        if len(set(layer_ids)) != len(layer_ids):
            raise ValueError(f"duplicate layer ids in {layer_ids}")
        # Ascending, because the forward meets the capture points in layer order.
        self.model.layers_to_capture = sorted(layer_ids)

    set_dspark_layers_to_capture = set_dflash_layers_to_capture
    set_eagle3_layers_to_capture = set_dflash_layers_to_capture


EntryClass = KimiK3ForCausalLM
