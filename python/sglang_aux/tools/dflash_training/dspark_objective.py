"""DSpark's training objective (the paper's, as DeepSpec's trainer computes it) on the DFlash
training path.

The block `[anchor, MASK x (G - 1)]` sits at positions anchor..anchor + G - 1 and runs through
the draft's dense forward (`draft_block_hidden`, shared with DFlash). Row k is trained to
predict the token at anchor + k + 1 (SGLang's DSpark slots), its base logits corrected by the
Markov head of the true token before it (teacher forcing: the anchor for k = 0, the data
token at anchor + k after). Per row, weighted `exp(-k / decay)` over the rows the sequence
still covers and normalized by the weights' sum:
- 0.1 x cross-entropy to the data token;
- 0.9 x distribution matching: `||p_draft - p_target||_1`, twice the total variation between
  the draft's and the target's next-token distributions (`1 - TV` is the probability that
  rejection sampling accepts the draft's token, so this term raises acceptance directly; the
  paper's code uses this L1 distance, not a KL);
- 1.0 x binary cross-entropy of the confidence head's logit against that acceptance
  probability `1 - TV` (detached), so the head learns the chance the proposal survives.

The target's distribution at row k is its LM head on its final hidden state at anchor + k,
computed on the fly from the final hidden states kept beside the aux rows (`extract_aux(...,
final_hidden=True)`). Why not stored logits: for Qwen2.5-Coder-1.5B (H 1,536, V 151,936,
K = 5 aux layers, bf16) a token's aux rows take 15,360 bytes and its final hidden state 3,072
more (+20%: 3.1 GB per million training tokens), where its full logits would take 303,872
(304 GB per million tokens); stored top-k logits (64 x 6 bytes) would fit but drop the tail
mass the L1 term measures. On the fly costs one LM-head GEMM per step beside the draft's:
32 sequences x 16 blocks x 7 proposals = 3,584 rows, 1.7 TFLOP. Both distributions exist one
slice of blocks at a time (`sliced_loss`): whole, at 15 proposals they would take ~40 GB.
Over a draft vocabulary, `--target-logsumexp` keeps each token's whole-vocabulary logsumexp
beside its row, and the step's target product is the vocabulary's ids alone (`target_head`).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from sglang_aux.srt.models.dspark import DSparkDraftModel
from sglang_aux.tools.dflash_training.block_objective import IGNORE, vocab_labels
from sglang_aux.tools.dflash_training.draft_forward import grouped_kv_kernel_enabled
from sglang_aux.tools.dflash_training.sequence_set import Batch
from sglang_aux.tools.dflash_training.sliced_loss import loss_in_slices
from sglang_aux.tools.dflash_training.target_head import (
    head_logits,
    logsumexp_columns_count,
    read_logsumexp,
)
from sglang_aux.tools.dflash_training.trainer import TrainConfig, Trainer


@dataclass(frozen=True)
class DSparkLossWeights:
    """The paper's mix (DeepSpec's `ce_loss_alpha`, `l1_loss_alpha`, `confidence_head_alpha`)."""

    cross_entropy: float = 0.1
    distribution: float = 0.9
    confidence: float = 1.0


def dspark_labels(batch: Batch, anchors: torch.Tensor, num_proposals: int
                  ) -> tuple[torch.Tensor, torch.Tensor]:
    """Labels `[N, A, G]` (the token at anchor + k + 1, IGNORE past the sequence's end) and
    the teacher-forced previous tokens `[N, A, G]` (the token at anchor + k)."""
    k = torch.arange(num_proposals, device=anchors.device)
    at = anchors[:, :, None] + k  # [N, A, G]
    last = batch.ids.shape[1] - 1
    valid = at + 1 < batch.lens[:, None, None]
    labels = batch.ids.gather(1, (at + 1).clamp(max=last).flatten(1)).view(at.shape)
    prev = batch.ids.gather(1, at.clamp(max=last).flatten(1)).view(at.shape)
    return torch.where(valid, labels, IGNORE), prev


def row_weights(num_proposals: int, decay: float, device: torch.device) -> torch.Tensor:
    """`exp(-k / decay)` for rows k = 0..G-1: a proposal counts only when every one before it
    was accepted."""
    return torch.exp(-torch.arange(num_proposals, device=device, dtype=torch.float32) / decay)


def row_terms(logits: torch.Tensor, target_logits: torch.Tensor, labels: torch.Tensor,
              w: torch.Tensor, mix: DSparkLossWeights, token_ids: torch.Tensor | None = None,
              target_lse: torch.Tensor | None = None
              ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Rows `[..., V]` of Markov-corrected draft logits against their data labels and the
    target's logits, with weights `w` (zero on ignored rows): the weighted sum of the
    cross-entropy and distribution-matching terms (not normalized), whether the argmax is the
    label, and the acceptance probability `1 - TV` (detached).

    Over a draft vocabulary (`token_ids` `[M]`: the draft's logits `[..., M]` are those
    tokens', its labels their rows or OFF_VOCAB) the draft puts no mass off it, so the L1
    distance to the target's whole distribution is the rows' distance plus the target's mass
    off the map, and `1 - TV` is again the probability rejection sampling accepts what the
    draft proposes as it is served; an OFF_VOCAB label has no cross-entropy and is never
    right. With `target_lse` `[...]` (the target's logsumexp over its whole vocabulary,
    `target_head`), `target_logits` are already the draft vocabulary's `[..., M]` alone: the
    same distances from M of the target's logits a row instead of all of them."""
    ce_labels = torch.where(labels >= 0, labels, IGNORE)
    ce = F.cross_entropy(logits.flatten(0, -2).float(), ce_labels.flatten(),
                         ignore_index=IGNORE, reduction="none").view(labels.shape)
    p_draft = torch.softmax(logits.float(), -1)
    with torch.no_grad():
        off_map = None
        if target_lse is not None:
            # logits <= their logsumexp: the clamp only keeps a zero padding row finite
            p_target = torch.exp((target_logits.float() - target_lse[..., None]).clamp(max=0))
            off_map = (1 - p_target.sum(-1)).clamp(min=0.0)
        else:
            p_target = torch.softmax(target_logits.float(), -1)
            if token_ids is not None:
                p_target = p_target[..., token_ids]
                off_map = (1 - p_target.sum(-1)).clamp(min=0.0)
    l1 = (p_draft - p_target).abs().sum(-1)
    if off_map is not None:
        l1 = l1 + off_map
    with torch.no_grad():
        accept = (1 - 0.5 * l1).clamp(0.0, 1.0)
        correct = (logits.argmax(-1) == labels) & (labels >= 0)
    terms = mix.cross_entropy * (ce * w).sum() + mix.distribution * (l1 * w).sum()
    return terms, correct, accept


def slice_terms(h: torch.Tensor, e: torch.Tensor, labels: torch.Tensor, w: torch.Tensor,
                final: torch.Tensor, lm_head: torch.Tensor, markov_w2: nn.Linear,
                den: torch.Tensor, mix: DSparkLossWeights, target_head: torch.Tensor,
                token_ids: torch.Tensor | None, target_lse: torch.Tensor | None = None
                ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """One slice of blocks: the draft rows `h` through the LM head `lm_head`, corrected by the
    Markov head of their previous tokens' embeddings `e`, against `labels` and the target's
    distribution from its final hidden states `final` through its whole head `target_head`;
    `row_terms` normalized by `den`. Over a draft vocabulary `token_ids`, `lm_head` is its
    rows and markov_w2 is read at them alone (its other rows get no gradient); with
    `target_lse` (the rows' whole-vocabulary logsumexp), `target_head` is the target's head
    at those rows alone. (Its own function, so a compiled step fuses the two softmaxes and
    the L1 distance.)"""
    logits = head_logits(h, lm_head)
    bias = markov_w2(e) if token_ids is None else F.linear(
        e, markov_w2.weight.index_select(0, token_ids))
    logits = logits + bias.to(logits.dtype)
    with torch.no_grad():
        target_logits = head_logits(final, target_head)
    terms, correct, accept = row_terms(logits, target_logits, labels, w, mix,
                                       None if target_lse is not None else token_ids, target_lse)
    return terms / den, correct, accept


def finish_loss(loss: torch.Tensor, correct: torch.Tensor, accept: torch.Tensor,
                confidence_logits: torch.Tensor | None, labels: torch.Tensor,
                weights: torch.Tensor, mix: DSparkLossWeights) -> tuple[torch.Tensor, dict]:
    """The normalized row terms `loss` plus the confidence head's BCE against `accept`, and
    the stats (device tensors): per-row accuracy, the greedy accept length and the expected
    one under rejection sampling (`accept`, `expected_accept`), the confidence's mean
    absolute error."""
    valid = labels != IGNORE
    w = weights * valid
    conf_err = torch.full((), float("nan"), device=loss.device)
    if confidence_logits is not None:
        bce = F.binary_cross_entropy_with_logits(confidence_logits.float(), accept,
                                                 reduction="none")
        loss = loss + mix.confidence * (bce * w).sum() / w.sum()
        with torch.no_grad():
            conf_err = ((confidence_logits.float().sigmoid() - accept).abs() * valid).sum() \
                / valid.sum().clamp(min=1)
    with torch.no_grad():
        acc = correct.sum((0, 1)) / valid.sum((0, 1)).clamp(min=1)
        blocks = valid[..., 0]
        num_blocks = blocks.sum().clamp(min=1)  # masked means: boolean indexing would sync
        greedy = 1 + correct.int().cumprod(-1).sum(-1).float()
        expected = 1 + (accept * valid).cumprod(-1).sum(-1)
        stats = {"loss": loss.detach(), "acc": acc,
                 "accept": (greedy * blocks).sum() / num_blocks,
                 "expected_accept": (expected * blocks).sum() / num_blocks,
                 "confidence_error": conf_err}
    return loss, stats


class DSparkTrainer(Trainer):
    """The DFlash trainer's loop and schedule on DSpark's objective. Batches carry every
    token's row as `[K * H aux | H final]` (`extract_aux(..., final_hidden=True)`). With
    `token_ids` (a draft vocabulary, as it will be served) the draft's logits are those
    tokens' alone, base and Markov bias (`row_terms`); the target's distribution stays
    whole. With `target_logsumexp` too, the rows end with the target's logsumexp
    (`extract_aux(..., logsumexp_head=)`) and the target's logits are computed at the draft
    vocabulary's ids alone."""

    def __init__(self, draft: DSparkDraftModel, embed: nn.Embedding, lm_head: torch.Tensor,
                 mask_token_id: int, cfg: TrainConfig,
                 mix: DSparkLossWeights = DSparkLossWeights(),
                 token_ids: torch.Tensor | None = None, target_logsumexp: bool = False):
        if target_logsumexp and token_ids is None:
            raise ValueError("target_logsumexp reads the target at a draft vocabulary's ids: "
                             "pass token_ids")
        super().__init__(draft, embed, lm_head, mask_token_id, cfg, token_ids)
        self.token_ids = None if token_ids is None else token_ids.to(self.lm_head.device)
        self.target_logsumexp = target_logsumexp
        self.target_head = (lm_head.detach().index_select(0, self.token_ids)
                            if target_logsumexp else lm_head.detach())
        self.mix = mix
        self.weights = row_weights(draft.num_proposals, cfg.gamma, self.device)
        self.slice_terms = self.step_function(slice_terms)

    def objective(self, batch: Batch, anchors: torch.Tensor) -> tuple[torch.Tensor, dict]:
        draft, num_proposals = self.draft, self.draft.num_proposals
        width, final_width = draft.fc.in_features, self.target_head.shape[1]
        lse_cols = logsumexp_columns_count(batch.aux.dtype) if self.target_logsumexp else 0
        if batch.aux.shape[-1] != width + final_width + lse_cols:
            raise ValueError(
                f"DSpark training rows {tuple(batch.aux.shape)} must hold the aux states "
                f"({width}) and the final hidden state ({final_width}): extract_aux(..., "
                "final_hidden=True" + (f"), and the target's logsumexp ({lse_cols}): "
                                       "extract_aux(..., logsumexp_head=)" if lse_cols else ")"))
        aux, final = batch.aux[..., :width], batch.aux[..., width:]
        hidden = self.block_hidden(draft, self.embed, aux, batch.ids, anchors,
                                   self.mask_token_id, grouped_kv_kernel_enabled(),
                                   self.context_rows(batch))  # [N, A, G, H]
        labels, prev = dspark_labels(batch, anchors, num_proposals)
        if self.label_rows is not None:
            labels = vocab_labels(labels, self.label_rows)
        markov = draft.markov_head
        embed = markov.embed(prev)  # [N, A, G, r]
        at = (anchors[:, :, None] + torch.arange(num_proposals, device=anchors.device)).clamp(
            max=final.shape[1] - 1)  # [N, A, G]
        final_rows = final.gather(1, at.flatten(1)[..., None].expand(-1, -1, final.shape[-1]))
        n, a = labels.shape[:2]
        final_rows = final_rows.view(n * a, num_proposals, -1)
        targets = [final_rows]
        if lse_cols:
            targets = [final_rows[..., :final_width],
                       read_logsumexp(final_rows[..., final_width:])]
        w = self.weights * (labels != IGNORE)
        den = w.sum()

        def one_slice(h: torch.Tensor, e: torch.Tensor, lab: torch.Tensor, wt: torch.Tensor,
                      fin: torch.Tensor, lse: torch.Tensor | None = None):
            loss, correct, accept = self.slice_terms(h, e, lab, wt, fin, self.lm_head,
                                                     markov.markov_w2, den, self.mix,
                                                     self.target_head, self.token_ids, lse)
            return loss, {"correct": correct, "accept": accept}

        loss, parts = loss_in_slices(
            one_slice, [hidden.flatten(0, 1), embed.flatten(0, 1)],
            [labels.flatten(0, 1), w.flatten(0, 1), *targets],
            max(1, self.slice_rows // num_proposals))
        correct = parts["correct"].view(labels.shape)
        accept = parts["accept"].view(labels.shape)
        confidence = None
        if draft.confidence_head is not None:
            prev_embed = embed if draft.dspark_config.confidence_with_markov else None
            with torch.autocast(self.device.type, enabled=False):  # the head is fp32
                confidence = draft.confidence_head.raw(hidden.float(), prev_embed)
        return finish_loss(loss, correct, accept, confidence, labels, self.weights, self.mix)
