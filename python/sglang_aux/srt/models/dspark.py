"""DSpark draft (`DSparkDraftModel`): the DFlash draft plus a low-rank Markov head and a
confidence head, in SGLang's checkpoint layout.

The backbone is the DFlash draft unchanged, with SGLang's DSpark slot convention: the block is
`[anchor, MASK x (num_proposals - 1)]` and row k gives base logits for the token at anchor + k
+ 1, so one forward yields num_proposals proposals (verify width: num_proposals + 1). Proposals
are drawn row by row (`speculative/dspark_proposal.py`): row k's logits are its base logits
plus `markov_w2(markov_w1[token chosen at k - 1])` (the anchor for k = 0), a bias that makes
each proposal depend on the one before it. The confidence head estimates, per row, the
probability that the proposal is accepted: `sigmoid(proj([hidden; markov_w1[previous token]]) /
T)` in fp32 (T = 1 until calibrated, SGLang's `sts_temperatures`).

Checkpoint names: `markov_head.markov_w1.weight` `[V, r]`, `markov_head.markov_w2.weight`
`[V, r]`, `confidence_head.proj.weight` `[1, H (+ r)]`, `confidence_head.proj.bias` `[1]`,
beside the DFlash draft's.
"""

from __future__ import annotations

from collections.abc import Iterable
from types import SimpleNamespace

import torch
from torch import nn

from sglang_aux.srt.configs.dspark_config import DSparkConfig, dspark_field
from sglang_aux.srt.forward_state.forward_batch_info import ForwardBatch
from sglang_aux.srt.layers.logits_processor import LogitsProcessorOutput
from sglang_aux.srt.models.dflash import DFlashDraftModel

MARKOV_WEIGHTS = ("markov_head.markov_w1.weight", "markov_head.markov_w2.weight")
CONFIDENCE_PREFIX = "confidence_head."


BOUND_ROWS = 16384  # rows of markov_w2 a bound pass reads at once (a bounded fp32 copy)


def markov_bias_bounds(markov_w2: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Two fp32 bounds of `markov_w2` `[V, r]`: the largest row norm (0-dim) and each rank
    column's largest magnitude `[r]`. With them every token j's bias after token p,
    `|w1[p] . w2[j]|`, is at most `|w1[p]|_2` times the first, and at most `sum_c |w1[p, c]|`
    times the second's c-th: what lets `markov_topk_kernel` certify a proposal without reading
    the rest of `markov_w2`."""
    norm = torch.zeros((), dtype=torch.float32, device=markov_w2.device)
    col = torch.zeros(markov_w2.shape[1], dtype=torch.float32, device=markov_w2.device)
    for i in range(0, markov_w2.shape[0], BOUND_ROWS):
        rows = markov_w2[i:i + BOUND_ROWS].float()
        norm = torch.maximum(norm, rows.norm(dim=1).max())
        col = torch.maximum(col, rows.abs().amax(dim=0))
    return norm, col


class DSparkMarkovHead(nn.Module):
    """A bigram bias of rank r: `markov_w2(markov_w1[previous token])` `[..., V]`; over a draft
    vocabulary (`restrict`), `[..., H]`: markov_w2 keeps its tokens' rows alone (the previous
    token is still any token)."""

    def __init__(self, vocab_size: int, rank: int):
        super().__init__()
        self.markov_w1 = nn.Embedding(vocab_size, rank)
        self.markov_w2 = nn.Linear(rank, vocab_size, bias=False)
        self._bounds: tuple[torch.Tensor, torch.Tensor] | None = None
        self._bounds_of: tuple | None = None  # the weight (pointer, version) they were taken of
        self.restricted = False  # markov_w2 holds the draft vocabulary's rows alone

    def restrict(self, token_ids: torch.Tensor) -> None:
        """Score only these tokens from now on: markov_w2 becomes their rows `[H, r]`, which
        the proposals read instead of all V (Qwen2.5's 77.8 MB a proposal); the full weight is
        let go, so it neither stays resident nor can be restricted twice."""
        w = self.markov_w2.weight
        if self.restricted:
            raise RuntimeError("the Markov head is already restricted to a draft vocabulary "
                               f"of {w.shape[0]} tokens; restrict it once, after loading")
        rows = w.detach()[token_ids.to(w.device)].contiguous()
        self.markov_w2.weight = nn.Parameter(rows, requires_grad=w.requires_grad)
        self.markov_w2.out_features = rows.shape[0]
        self.restricted = True

    def bias_bounds(self) -> tuple[torch.Tensor, torch.Tensor]:
        """`markov_bias_bounds` of this head's markov_w2, kept until the weight changes. Taken
        when the model runner gets the model (`DSparkDraftModel.post_load_weights`): inside a
        CUDA graph's capture they would be captured too, a full read of markov_w2 every
        replay, so a stale or missing pair there is an error."""
        w = self.markov_w2.weight
        key = (w.data_ptr(), w._version)
        if self._bounds_of != key:
            if w.is_cuda and torch.cuda.is_current_stream_capturing():
                raise RuntimeError("the Markov head's bias bounds are taken before a CUDA graph "
                                   "captures (DSparkDraftModel.post_load_weights)")
            self._bounds, self._bounds_of = markov_bias_bounds(w), key
        return self._bounds

    def embed(self, prev_tokens: torch.Tensor) -> torch.Tensor:
        """`[...]` token ids -> `[..., r]`."""
        return self.markov_w1(prev_tokens)

    def bias(self, prev_tokens: torch.Tensor) -> torch.Tensor:
        """`[...]` token ids -> `[..., V]` logit bias (`[..., H]` over a draft vocabulary)."""
        return self.markov_w2(self.markov_w1(prev_tokens))


class DSparkConfidenceHead(nn.Module):
    """`Linear(H + r -> 1)` in fp32 whatever the draft's dtype: its output is a probability
    the verify scheduler multiplies along the block, where bf16 rounding would compound."""

    def __init__(self, hidden_size: int, markov_rank: int):
        super().__init__()
        self.proj = nn.Linear(hidden_size + markov_rank, 1, dtype=torch.float32)
        # an untrained head says 0.5, the same on every device (the constructor's draw is not)
        nn.init.zeros_(self.proj.bias)
        self.register_buffer("temperature", torch.ones((), dtype=torch.float32),
                             persistent=False)

    def raw(self, hidden: torch.Tensor, prev_embed: torch.Tensor | None) -> torch.Tensor:
        """Logits `[...]` from hidden `[..., H]` and, with the Markov input, `[..., r]`."""
        features = hidden if prev_embed is None else torch.cat(
            [hidden, prev_embed.to(hidden.dtype)], dim=-1)
        return self.proj(features.float()).squeeze(-1)

    def forward(self, hidden: torch.Tensor, prev_embed: torch.Tensor | None) -> torch.Tensor:
        return torch.sigmoid(self.raw(hidden, prev_embed) / self.temperature)


def _with_dspark_block(config: SimpleNamespace, num_proposals: int) -> SimpleNamespace:
    """A copy of `config` whose `dflash_config` carries the proposals as the backbone's block size
    (and a mask token given only under `dspark_config`), as the DFlash draft reads them."""
    dflash = dict(getattr(config, "dflash_config", None) or {}, block_size=num_proposals)
    mask = dspark_field(config, "mask_token_id")
    if mask is not None:
        dflash["mask_token_id"] = mask
    return SimpleNamespace(**{**vars(config), "dflash_config": dflash})


class DSparkDraftModel(DFlashDraftModel):
    def __init__(self, config: SimpleNamespace):
        dspark = DSparkConfig.from_hf_config(config)
        super().__init__(_with_dspark_block(config, dspark.num_proposals))
        self.dspark_config = dspark
        self.markov_head = DSparkMarkovHead(config.vocab_size, dspark.markov_rank)
        self.confidence_head = None
        if dspark.confidence_head:
            rank = dspark.markov_rank if dspark.confidence_with_markov else 0
            self.confidence_head = DSparkConfidenceHead(config.hidden_size, rank)

    @property
    def num_proposals(self) -> int:
        return self.dspark_config.num_proposals

    @torch.no_grad()
    def forward(self, input_ids: torch.Tensor, positions: torch.Tensor,
                forward_batch: ForwardBatch) -> LogitsProcessorOutput:
        """The DFlash draft's block logits `[bs * num_proposals, vocab]`, with every row's final
        hidden state `[bs * num_proposals, H]` kept: the confidence head reads them."""
        hidden = self.block_hidden(self.get_input_embeddings()(input_ids), positions,
                                   forward_batch)
        out = self.draft_logits(hidden, forward_batch)
        out.hidden_states = hidden
        return out

    def confidence(self, hidden: torch.Tensor, prev_tokens: torch.Tensor) -> torch.Tensor:
        """Acceptance probability `[...]` (fp32) of the proposal drawn at each row, from the
        row's draft hidden state `[..., H]` and the token before it `[...]`."""
        if self.confidence_head is None:
            raise RuntimeError("this DSpark draft has no confidence head "
                               "(enable_confidence_head is false)")
        embed = self.markov_head.embed(prev_tokens) if self.dspark_config.confidence_with_markov \
            else None
        return self.confidence_head(hidden, embed)

    def load_weights(self, weights: Iterable[tuple[str, torch.Tensor]]) -> None:
        """The DFlash draft's tensors plus the heads'. A checkpoint without the Markov head
        (a DFlash draft) or, when the config enables it, without the confidence head is
        refused, naming what it lacks; with the head disabled its tensors are skipped."""
        weights = [(n, t) for n, t in weights if self.confidence_head is not None
                   or not n.removeprefix("model.").startswith(CONFIDENCE_PREFIX)]
        names = {name.removeprefix("model.") for name, _ in weights}
        lacking = [n for n in MARKOV_WEIGHTS if n not in names]
        if lacking:
            raise ValueError(f"not a DSpark checkpoint: it has no Markov head (lacks "
                             f"{', '.join(lacking)}); a DFlash draft loads with "
                             "--speculative-algorithm DFLASH")
        if self.confidence_head is not None:
            wanted = [CONFIDENCE_PREFIX + n for n, _ in self.confidence_head.named_parameters()]
            lacking = [n for n in wanted if n not in names]
            if lacking:
                raise ValueError(f"the DSpark config enables the confidence head but the "
                                 f"checkpoint lacks {', '.join(lacking)} (set "
                                 "enable_confidence_head to false to load it without)")
        super().load_weights(weights)

    def set_target_modules(self, embed_tokens: nn.Embedding, lm_head_weight: torch.Tensor,
                           token_ids: torch.Tensor | None = None) -> None:
        """The DFlash draft's, and over a draft vocabulary the Markov head restricted to it."""
        super().set_target_modules(embed_tokens, lm_head_weight, token_ids)
        if token_ids is not None:
            self.markov_head.restrict(token_ids)

    def post_load_weights(self) -> None:
        """After the weights (checkpoint or dummy): the Markov head's bias bounds."""
        self.markov_head.bias_bounds()


class Qwen3DSparkModel(DSparkDraftModel):
    """The architecture name SGLang's published DSpark drafts carry."""


EntryClass = [DSparkDraftModel, Qwen3DSparkModel]
