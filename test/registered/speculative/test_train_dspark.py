"""DSpark draft training on CPU (`train_dflash --algorithm dspark`): the rows' labels and
teacher-forced previous tokens (slot k predicts anchor + k + 1), the paper's loss on known
distributions (0.1 CE + 0.9 L1 to the target + confidence BCE against 1 - TV), the target's
final hidden states kept beside the aux rows give its own logits, the target distribution
each row is matched to, overfitting a fixed batch, and a smoke run of the whole tool whose
draft loads as a DSparkDraftModel."""

import dataclasses
import json
import math
import sys
from pathlib import Path

import pytest
import torch
from test_train_dflash import _assert_lossless, draft_block_logits

from sglang_aux.srt.configs.model_config import ModelConfig
from sglang_aux.srt.configs.presets import MASK_TOKEN_ID, PRESETS
from sglang_aux.srt.entrypoints.engine import Engine
from sglang_aux.srt.managers.schedule_batch import release_kv
from sglang_aux.srt.model_loader import builtin
from sglang_aux.srt.model_loader.loader import get_model
from sglang_aux.srt.models.dspark import DSparkDraftModel
from sglang_aux.srt.models.weight_utils import (
    checkpoint_tensors,
    init_random_weights,
    safetensors_weights_iterator,
)
from sglang_aux.test.ci.ci_register import register_cpu_ci
from sglang_aux.test.gsm8k_data import local_path_or_skip
from sglang_aux.test.runtime_utils import make_runner, prefill, tiny_checkpoint
from sglang_aux.tools import train_dflash
from sglang_aux.tools.dflash_training import dspark_objective, train_args
from sglang_aux.tools.dflash_training.block_objective import IGNORE, OFF_VOCAB
from sglang_aux.tools.dflash_training.data import Sample, common_prefix_len
from sglang_aux.tools.dflash_training.dspark_objective import (
    DSparkLossWeights,
    DSparkTrainer,
    dspark_labels,
    finish_loss,
    row_terms,
    row_weights,
)
from sglang_aux.tools.dflash_training.export import (
    TRAINING_RECORD,
    dspark_draft_config,
    new_draft,
)
from sglang_aux.tools.dflash_training.features import extract_aux
from sglang_aux.tools.dflash_training.recipes import MIX
from sglang_aux.tools.dflash_training.sequence_set import Batch, SequenceSet, sample_anchors
from sglang_aux.tools.dflash_training.target_head import (
    LOGSUMEXP_CHUNK_ROWS,
    logsumexp_columns,
    logsumexp_columns_count,
    read_logsumexp,
    target_logsumexp,
)
from sglang_aux.tools.dflash_training.trainer import TrainConfig

register_cpu_ci(est_time=30, suite="default")

GAMMA = 3
HIDDEN = PRESETS["tiny-llama"]["hidden_size"]


@pytest.fixture(scope="module")
def target(tmp_path_factory):
    return tiny_checkpoint("tiny-llama", tmp_path_factory.mktemp("ckpt"))


def test_labels_and_teacher_forced_previous_tokens():
    ids = torch.arange(100, 110)[None].repeat(2, 1)  # tokens 100..109
    batch = Batch(torch.zeros(2, 10, 1), ids, torch.tensor([3, 6]), torch.tensor([10, 8]))
    labels, prev = dspark_labels(batch, torch.tensor([[3, 7], [6, 5]]), GAMMA)
    assert labels[0, 0].tolist() == [104, 105, 106]
    assert prev[0, 0].tolist() == [103, 104, 105]  # the anchor, then the data tokens
    assert labels[0, 1].tolist() == [108, 109, IGNORE]  # past the end
    assert labels[1, 0].tolist() == [107, IGNORE, IGNORE]  # this sequence has 8 tokens
    assert labels[1, 1].tolist() == [106, 107, IGNORE]
    torch.testing.assert_close(row_weights(3, 4.0, torch.device("cpu")),
                               torch.tensor([1.0, math.exp(-0.25), math.exp(-0.5)]))


def dspark_loss(logits, target_logits, labels, confidence_logits, weights, mix):
    """The objective's loss in one slice: its row terms normalized, plus the confidence BCE."""
    w = weights * (labels != IGNORE)
    terms, correct, accept = row_terms(logits, target_logits, labels, w, mix)
    return finish_loss(terms / w.sum(), correct, accept, confidence_logits, labels, weights,
                       mix)


def test_loss_on_known_distributions():
    """Two rows over a 3-token vocabulary, by hand: TV, acceptance, CE, BCE and weights."""
    p_draft = torch.tensor([[0.5, 0.3, 0.2], [0.1, 0.1, 0.8]])
    p_target = torch.tensor([[0.2, 0.6, 0.2], [0.1, 0.1, 0.8]])
    logits, target = p_draft.log()[None, None], p_target.log()[None, None]  # [1, 1, 2, 3]
    labels = torch.tensor([[[1, 2]]])
    conf = torch.tensor([[[0.0, 2.0]]])
    w = torch.tensor([1.0, 0.5])
    loss, stats = dspark_loss(logits, target, labels, conf, w, DSparkLossWeights())
    l1 = torch.tensor([0.6, 0.0])  # |.5-.2| + |.3-.6| + 0, identical rows
    accept = 1 - l1 / 2  # 0.7, 1.0
    ce = -torch.tensor([math.log(0.3), math.log(0.8)])
    sig = torch.sigmoid(conf[0, 0])
    bce = -(accept * sig.log() + (1 - accept) * (1 - sig).log())
    expected = ((0.1 * ce + 0.9 * l1 + 1.0 * bce) * w).sum() / w.sum()
    torch.testing.assert_close(loss, expected)
    assert stats["acc"].tolist() == [0.0, 1.0]  # row 0's argmax is token 0, not 1
    assert stats["accept"].item() == 1.0  # greedy: the first row already misses
    assert stats["expected_accept"].item() == pytest.approx(1 + 0.7 + 0.7)
    assert stats["confidence_error"].item() == pytest.approx(
        ((sig - accept).abs().mean()).item())
    # an ignored row weighs nothing
    loss_one, _ = dspark_loss(logits, target, torch.tensor([[[1, IGNORE]]]), conf, w,
                              DSparkLossWeights())
    torch.testing.assert_close(loss_one, 0.1 * ce[0] + 0.9 * l1[0] + bce[0])


def test_row_terms_over_a_draft_vocabulary_are_the_whole_ones_with_no_mass_off_it():
    """Over a draft vocabulary the L1 distance is the whole vocabulary's with the draft's
    probability zero off the map (its logits there -inf): the map's rows plus the target's
    mass off it; so are the acceptance and, for labels on the map, the cross-entropy and
    which rows are right. A label off the map has no cross-entropy and is never right."""
    g = torch.Generator().manual_seed(0)
    vocab, ids = 12, torch.tensor([7, 2, 9, 0, 4])
    logits = torch.randn(2, 3, vocab, generator=g)
    target = torch.randn(2, 3, vocab, generator=g) * 2
    labels = ids[torch.randint(len(ids), (2, 3), generator=g)]
    labels[1, 2] = IGNORE
    w, mix = torch.rand(2, 3, generator=g), DSparkLossWeights()
    masked = torch.full_like(logits, float("-inf"))
    masked[..., ids] = logits[..., ids]
    rows = torch.full((vocab,), OFF_VOCAB)
    rows[ids] = torch.arange(len(ids))
    cut = torch.where(labels == IGNORE, IGNORE, rows[labels.clamp(min=0)])
    whole = row_terms(masked, target, labels, w, mix)
    over_map = row_terms(logits[..., ids], target, cut, w, mix, ids)
    for a, b in zip(over_map, whole, strict=True):
        torch.testing.assert_close(a, b)
    p_target = target.softmax(-1)
    off = 1 - p_target[..., ids].sum(-1)
    assert (off > 0.05).all() and (over_map[2] < 1 - 0.5 * off + 1e-6).all()
    # a data token the map leaves out: the distance stays, the cross-entropy goes
    ce = torch.nn.functional.cross_entropy(logits[0, 0, ids][None], cut[0, 0][None])
    cut[0, 0] = OFF_VOCAB
    terms, correct, accept = row_terms(logits[..., ids], target, cut, w, mix, ids)
    assert not correct[0, 0] and torch.equal(accept, over_map[2])
    torch.testing.assert_close(terms, over_map[0] - mix.cross_entropy * w[0, 0] * ce)


def _objective_and_grads(trainer: DSparkTrainer, batch: Batch, anchors: torch.Tensor):
    """The objective's loss and stats on a batch, and every parameter's gradient."""
    trainer.opt.zero_grad(set_to_none=True)
    loss, stats = trainer.objective(batch, anchors)
    loss.backward()
    return loss.detach(), stats, {n: p.grad.clone() for n, p in
                                  trainer.draft.named_parameters() if p.grad is not None}


def _assert_same_objective(expected, got, rtol: float = 1e-5):
    """Two `_objective_and_grads` results equal to float rounding (sums in another order)."""
    (loss, stats, grads), (g_loss, g_stats, g_grads) = expected, got
    torch.testing.assert_close(g_loss, loss, rtol=rtol, atol=1e-6)
    for k, v in stats.items():
        torch.testing.assert_close(g_stats[k], v, rtol=1e-5, atol=1e-6, equal_nan=True)
    assert set(g_grads) == set(grads)
    for n, g in grads.items():
        torch.testing.assert_close(g_grads[n], g, rtol=1e-4, atol=1e-6, msg=n)


def test_a_trainer_over_every_id_gives_the_whole_vocabularys_objective(target):
    """A DSpark trainer over a draft vocabulary of every id, shuffled, gives the whole
    vocabulary's loss, stats and gradients (the same sums in another order), and trains the
    Markov head's rows of the map alone when the map is smaller."""
    _, data, trainer = _trainer(target)
    batch = data.batch([0, 1, 2])
    anchors = sample_anchors(batch, 3, torch.Generator().manual_seed(4))
    vocab = trainer.target_head.shape[0]
    start = {k: v.detach().clone() for k, v in trainer.draft.state_dict().items()}
    results = []
    for token_ids in (None, torch.randperm(vocab, generator=torch.Generator().manual_seed(1))):
        trainer.draft.load_state_dict(start)
        mapped = DSparkTrainer(trainer.draft, trainer.embed, trainer.target_head,
                               MASK_TOKEN_ID, trainer.cfg, token_ids=token_ids)
        mapped.slice_rows = 2 * GAMMA
        results.append(_objective_and_grads(mapped, batch, anchors))
    _assert_same_objective(*results)
    ids = torch.tensor([5, 1, 17, 3])
    mapped = DSparkTrainer(trainer.draft, trainer.embed, trainer.target_head, MASK_TOKEN_ID,
                           trainer.cfg, token_ids=ids)
    mapped.opt.zero_grad(set_to_none=True)
    mapped.objective(batch, anchors)[0].backward()
    w2 = trainer.draft.markov_head.markov_w2.weight.grad
    off = torch.ones(vocab, dtype=torch.bool)
    off[ids] = False
    assert w2[ids].abs().sum() > 0 and not w2[off].any()


def _rows(target_path: str, layer_ids: list[int], seed: int = 3):
    tr = make_runner(target_path, aux_layer_ids=layer_ids, max_total_tokens=2048,
                     max_running_requests=4)
    g = torch.Generator().manual_seed(seed)
    shots = torch.randint(0, 256, (11,), generator=g).tolist()
    samples = [Sample(shots + torch.randint(0, 256, (n,), generator=g).tolist(),
                      torch.randint(0, 256, (m,), generator=g).tolist())
               for n, m in [(5, 19), (3, 12), (8, 16)]]
    return tr, samples


def test_final_hidden_columns_give_the_targets_logits(target):
    """extract_aux(..., final_hidden=True) keeps the aux columns as before and adds the
    final hidden state, whose product with the LM head is the target's own next-token
    logits (checked at every sequence's last token against a plain prefill)."""
    config = dspark_draft_config(PRESETS["tiny-llama"], markov_rank=8, num_layers=1,
                                 num_aux_layers=2, block_size=GAMMA, mask_token_id=MASK_TOKEN_ID)
    layer_ids = config["dflash_config"]["target_layer_ids"]
    tr, samples = _rows(target, layer_ids)
    skip = common_prefix_len(samples)
    prefix, rows = extract_aux(tr, samples, layer_ids, skip=skip)
    prefix_f, rows_f = extract_aux(tr, samples, layer_ids, skip=skip, final_hidden=True)
    width = prefix.shape[-1]
    assert prefix_f.shape[-1] == width + HIDDEN
    torch.testing.assert_close(prefix_f[:, :width], prefix)
    for s, a, f in zip(samples, rows, rows_f, strict=True):
        torch.testing.assert_close(f[:, :width], a)
        reqs, out = prefill(tr, [s.ids])
        release_kv(tr, reqs[0])
        torch.testing.assert_close(f[-1, width:] @ tr.model.lm_head_weight.t(),
                                   out.next_token_logits[0], rtol=1e-4, atol=1e-4)


def _trainer(target_path: str, steps: int = 40, token_ids: torch.Tensor | None = None,
             target_logsumexp: bool = False, **cfg):
    config = dspark_draft_config(PRESETS["tiny-llama"], markov_rank=8, num_layers=1,
                                 num_aux_layers=2, block_size=GAMMA, mask_token_id=MASK_TOKEN_ID)
    layer_ids = config["dflash_config"]["target_layer_ids"]
    tr, samples = _rows(target_path, layer_ids)
    prefix, rows = extract_aux(
        tr, samples, layer_ids, skip=common_prefix_len(samples), final_hidden=True,
        logsumexp_head=tr.model.lm_head_weight if target_logsumexp else None)
    draft = new_draft(config, torch.device("cpu"), seed=0)
    assert isinstance(draft, DSparkDraftModel)
    init_random_weights(draft, seed=1)
    data = SequenceSet(samples, rows, torch.device("cpu"), prefix)
    trainer = DSparkTrainer(draft, tr.model.get_input_embeddings(), tr.model.lm_head_weight,
                            MASK_TOKEN_ID,
                            TrainConfig(steps=steps, lr=3e-3, warmup_frac=0.0, **cfg),
                            token_ids=token_ids, target_logsumexp=target_logsumexp)
    return tr, data, trainer


def test_logsumexp_columns_hold_the_targets_whole_vocabulary_logsumexp(target):
    """extract_aux(..., logsumexp_head=) ends every row with the logsumexp of its final
    hidden state's logits over the whole vocabulary, as float bytes in the rows' dtype (the
    bf16 rows' two columns give the fp32 back bit for bit); the columns before are
    final_hidden's."""
    config = dspark_draft_config(PRESETS["tiny-llama"], markov_rank=8, num_layers=1,
                                 num_aux_layers=2, block_size=GAMMA, mask_token_id=MASK_TOKEN_ID)
    layer_ids = config["dflash_config"]["target_layer_ids"]
    tr, samples = _rows(target, layer_ids)
    skip = common_prefix_len(samples)
    head = tr.model.lm_head_weight
    prefix, rows = extract_aux(tr, samples, layer_ids, skip=skip, final_hidden=True)
    prefix_l, rows_l = extract_aux(tr, samples, layer_ids, skip=skip, final_hidden=True,
                                   logsumexp_head=head)
    width = prefix.shape[-1]
    assert prefix_l.shape[-1] == width + logsumexp_columns_count(prefix.dtype)
    for plain, kept in zip([prefix, *rows], [prefix_l, *rows_l], strict=True):
        torch.testing.assert_close(kept[:, :width], plain)
        final = kept[:, width - HIDDEN:width]
        expected = torch.logsumexp((final @ head.t()).float(), -1)
        torch.testing.assert_close(read_logsumexp(kept[:, width:]), expected)
    lse = torch.randn(7, dtype=torch.float32) * 30
    for dtype, cols in ((torch.bfloat16, 2), (torch.float16, 2), (torch.float32, 1)):
        packed = logsumexp_columns(lse, dtype)
        assert packed.shape == (7, cols) and packed.dtype == dtype
        moved = torch.cat([torch.zeros(7, 3, dtype=dtype), packed], -1)[:, 3:]
        assert torch.equal(read_logsumexp(moved), lse)
    many = torch.randn(LOGSUMEXP_CHUNK_ROWS + 5, HIDDEN)  # more rows than a chunk
    torch.testing.assert_close(target_logsumexp(many, head),
                               torch.logsumexp(many @ head.t(), -1))


def test_row_terms_from_the_logsumexp_are_those_of_the_whole_softmax():
    """`row_terms` with the target's logsumexp and its logits at the draft vocabulary's ids
    alone gives what the whole vocabulary's logits give over that vocabulary."""
    g = torch.Generator().manual_seed(2)
    vocab, ids = 12, torch.tensor([7, 2, 9, 0, 4])
    logits = torch.randn(2, 3, len(ids), generator=g)
    target = torch.randn(2, 3, vocab, generator=g) * 2
    labels = torch.randint(len(ids), (2, 3), generator=g)
    labels[1, 2] = IGNORE
    w, mix = torch.rand(2, 3, generator=g), DSparkLossWeights()
    whole = row_terms(logits, target, labels, w, mix, ids)
    lse = torch.logsumexp(target, -1)
    from_lse = row_terms(logits, target[..., ids], labels, w, mix, target_lse=lse)
    for a, b in zip(from_lse, whole, strict=True):
        torch.testing.assert_close(a, b)
    assert whole[2].min() < 0.9  # the distances are not all zero


def test_a_trainer_reading_the_logsumexp_gives_the_same_objective(target):
    """`target_logsumexp`: the objective over a draft vocabulary, the target's logits taken at
    its ids alone beside the kept logsumexp, gives the loss, stats and gradients of the same
    trainer computing the target's whole softmax (float rounding), over a batch with padding
    and odd slices; without a draft vocabulary it is refused."""
    vocab = PRESETS["tiny-llama"]["vocab_size"]
    ids = torch.randperm(vocab, generator=torch.Generator().manual_seed(3))[: vocab // 3]
    results = []
    for keep in (False, True):
        _, data, trainer = _trainer(target, token_ids=ids, target_logsumexp=keep)
        assert trainer.target_head.shape[0] == (len(ids) if keep else vocab)
        trainer.slice_rows = 2 * GAMMA
        batch = data.batch([0, 1, 2], bucket=16)
        anchors = sample_anchors(batch, 3, torch.Generator().manual_seed(4))
        results.append(_objective_and_grads(trainer, batch, anchors))
    _assert_same_objective(*results)
    assert "markov_head.markov_w2.weight" in results[0][2]
    with pytest.raises(ValueError, match="pass token_ids"):
        DSparkTrainer(trainer.draft, trainer.embed, trainer.lm_head, MASK_TOKEN_ID,
                      trainer.cfg, target_logsumexp=True)
    batch.aux = batch.aux[..., :-1]
    with pytest.raises(ValueError, match=r"and the target's logsumexp \(1\)"):
        _trainer(target, token_ids=ids, target_logsumexp=True)[2].objective(batch, anchors)


def test_rows_are_matched_to_the_targets_distribution_at_their_position(target, monkeypatch):
    """Row k of the block anchored at a is matched to the target's distribution after token
    a + k (its LM head on the stored final hidden state there), its logits are the base
    logits plus the Markov bias of the data token at a + k."""
    tr, data, trainer = _trainer(target)
    parts = []

    def spy(logits, target_logits, labels, w, mix, *rest):
        parts.append((logits, target_logits, labels))
        return row_terms(logits, target_logits, labels, w, mix, *rest)

    monkeypatch.setattr(dspark_objective, "row_terms", spy)
    trainer.slice_rows = GAMMA  # one block a slice: the rows below come from 4 slices
    batch = data.batch([0, 2])
    anchors = torch.tensor([[17, 25], [20, 30]])
    with torch.no_grad():
        trainer.objective(batch, anchors)
    assert len(parts) == 4
    seen = {k: torch.cat([p[i] for p in parts]).view(2, 2, GAMMA, *parts[0][i].shape[2:])
            for i, k in enumerate(("logits", "target", "labels"))}
    width = trainer.draft.fc.in_features
    lm_head = tr.model.lm_head_weight
    markov = trainer.draft.markov_head
    for n in range(2):
        for a in range(2):
            for k in range(GAMMA):
                pos = int(anchors[n, a]) + k
                expected = batch.aux[n, pos, width:] @ lm_head.t()
                torch.testing.assert_close(seen["target"][n, a, k], expected)
                assert seen["labels"][n, a, k] == batch.ids[n, pos + 1]
    # the Markov bias is the data token's: undo it and the rows are the backbone's argmax
    prev = batch.ids.gather(1, (anchors[:, :, None] + torch.arange(GAMMA)).flatten(1))
    base = seen["logits"] - markov.bias(prev).view(2, 2, GAMMA, -1)
    with torch.no_grad():
        backbone = draft_block_logits(trainer.draft, tr.model.get_input_embeddings(), lm_head,
                                      batch.aux[..., :width], batch.ids, anchors,
                                      MASK_TOKEN_ID)
    torch.testing.assert_close(base, backbone, rtol=1e-4, atol=1e-4)


def test_loss_decreases_on_a_fixed_batch(target):
    _, data, trainer = _trainer(target)
    batch = data.batch([0, 1])
    anchors = sample_anchors(batch, 8, torch.Generator().manual_seed(0))
    first = trainer.step(batch, anchors)
    for _ in range(38):
        trainer.step(batch, anchors)
    last = trainer.step(batch, anchors)
    assert last["loss"] < 0.5 * first["loss"], (first, last)
    assert last["confidence_error"] < first["confidence_error"]
    assert last["expected_accept"] > first["expected_accept"]


def test_sliced_loss_equals_the_whole_batch_loss(target):
    """The objective over slices of one block gives the loss, stats and every parameter's
    gradient of one slice holding the whole batch (fp32; the Markov head's gradient is summed
    over slices in another order, hence the tolerance)."""
    _, data, trainer = _trainer(target)
    batch = data.batch([0, 1, 2])
    anchors = sample_anchors(batch, 3, torch.Generator().manual_seed(4))
    results = []
    for rows in (10_000, GAMMA):
        trainer.slice_rows = rows
        trainer.opt.zero_grad(set_to_none=True)
        loss, stats = trainer.objective(batch, anchors)
        loss.backward()
        grads = {n: p.grad.clone() for n, p in trainer.draft.named_parameters()
                 if p.grad is not None}
        results.append((loss.detach(), stats, grads))
    (whole, s_whole, g_whole), (sliced, s_sliced, g_sliced) = results
    torch.testing.assert_close(sliced, whole)
    for k in s_whole:
        torch.testing.assert_close(s_sliced[k], s_whole[k], equal_nan=True)
    assert set(g_sliced) == set(g_whole) and "markov_head.markov_w2.weight" in g_whole
    for n in g_whole:
        torch.testing.assert_close(g_sliced[n], g_whole[n], rtol=1e-5, atol=1e-6, msg=n)


def test_a_compiled_objective_gives_the_eager_ones_loss_and_gradients(target):
    """`TrainConfig(compile=True)`: DSpark's loss slices (`slice_terms`: the LM head, the
    Markov bias, both softmaxes and their L1 distance) run through torch.compile beside the
    draft's forward and give the eager objective's loss, stats and every parameter's gradient
    to float rounding, over batches whose last slice is smaller and of another length (a new
    shape compiles again, not fails). (Weights after AdamW steps are no test: it scales a
    near-zero gradient's rounding up to the learning rate.)"""
    results = {}
    for compiled in (False, True):
        _, data, trainer = _trainer(target, compile=compiled)
        assert (trainer.slice_terms is dspark_objective.slice_terms) is not compiled
        trainer.slice_rows = 2 * GAMMA  # two blocks a slice: 9 blocks, 6, 4 (odd last slices)
        results[compiled] = []
        for i, (index, per_seq) in enumerate((([0, 1, 2], 3), ([2, 0], 3), ([1, 2], 2))):
            batch = data.batch(index)
            anchors = sample_anchors(batch, per_seq, torch.Generator().manual_seed(i))
            trainer.opt.zero_grad(set_to_none=True)
            loss, stats = trainer.objective(batch, anchors)
            loss.backward()
            results[compiled].append((loss.detach(), stats, {
                n: p.grad.clone() for n, p in trainer.draft.named_parameters()
                if p.grad is not None}))
    for (loss, stats, grads), (eager_loss, eager_stats, eager_grads) in zip(
            results[True], results[False], strict=True):
        torch.testing.assert_close(loss, eager_loss, rtol=1e-5, atol=0)
        for k, v in eager_stats.items():
            torch.testing.assert_close(stats[k], v, rtol=1e-5, atol=1e-6, equal_nan=True)
        assert set(grads) == set(eager_grads) and "markov_head.markov_w2.weight" in grads
        for n, g in eager_grads.items():
            torch.testing.assert_close(grads[n], g, rtol=1e-4, atol=1e-6, msg=n)


def test_a_packed_context_pass_gives_the_same_objective(target):
    """`pack_context` on DSpark's objective (its rows hold the final hidden state beside the
    aux states): the padding's context rows skipped, the same loss and gradients."""
    _, data, trainer = _trainer(target)
    batch = data.batch([0, 1, 2], bucket=64)
    assert len(batch.rows) < batch.ids.numel()  # the bucket padded
    anchors = sample_anchors(batch, 3, torch.Generator().manual_seed(4))
    results = []
    for pack in (False, True):
        trainer.cfg = dataclasses.replace(trainer.cfg, pack_context=pack)
        trainer.opt.zero_grad(set_to_none=True)
        loss, _ = trainer.objective(batch, anchors)
        loss.backward()
        results.append([loss.detach()] + [p.grad.clone() for p in trainer.draft.parameters()
                                          if p.grad is not None])
    for a, b in zip(*results, strict=True):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6)


def test_a_step_updates_the_markov_head_inside_the_sliced_loss(target):
    """The Markov head's `markov_w2` gets its gradient inside the objective's slices, so the
    step zeroes gradients before the objective, not after it."""
    _, data, trainer = _trainer(target)
    batch = data.batch([0, 1])
    anchors = sample_anchors(batch, 4, torch.Generator().manual_seed(1))
    w2 = trainer.draft.markov_head.markov_w2.weight
    before = w2.detach().clone()
    trainer.slice_rows = GAMMA
    trainer.step(batch, anchors)
    assert not torch.equal(w2.detach(), before)


def test_rows_without_final_hidden_are_refused(target):
    _, data, trainer = _trainer(target)
    batch = data.batch([0])
    batch.aux = batch.aux[..., :trainer.draft.fc.in_features]
    with pytest.raises(ValueError, match=r"must hold the aux states \(128\) and the final "
                                         r"hidden state \(64\)"):
        trainer.objective(batch, torch.tensor([[17]]))


def test_dspark_defaults():
    args = train_args.parse_args(["--algorithm", "dspark", "--block-size", "7"])
    assert args.out.endswith("smollm2-135m-instruct-dspark-b7")
    assert args.markov_rank == 256


def test_recipe_is_the_dflash_recipe_as_dspark(tmp_path, monkeypatch):
    monkeypatch.setenv("SGLANG_AUX_CACHE", str(tmp_path))
    name = "qwen2.5-coder-1.5b-instruct-dspark-b15-gsm8k"
    with pytest.raises(FileNotFoundError, match=f"train_dflash --recipe {name}"):
        builtin.resolve_model_path(name)
    dspark = train_args.parse_args(["--recipe", name])
    dflash = train_args.parse_args(["--recipe", "qwen2.5-coder-1.5b-instruct-dflash-b16-gsm8k"])
    differ = {k for k in vars(dspark) if getattr(dspark, k) != getattr(dflash, k)}
    assert differ == {"algorithm", "block_size", "recipe", "out", "command"}
    assert (dspark.algorithm, dspark.block_size) == ("dspark", 15)
    assert dspark.out == str(tmp_path / "drafts" / name)


def test_the_mix_recipe_as_dspark_trains_over_the_mix_vocabulary():
    """`qwen2.5-coder-1.5b-instruct-dspark-b15`: the DFlash mix recipe's samples, draft
    vocabulary, held-out prompts and schedule, as DSpark verifying the same 16 tokens."""
    dflash = vars(train_args.parse_args(["--recipe", MIX, "--out", "d"]))
    dspark = vars(train_args.parse_args(["--recipe", "qwen2.5-coder-1.5b-instruct-dspark-b15",
                                         "--out", "d"]))
    differ = {k for k in dflash if dflash[k] != dspark[k]}
    assert differ == {"recipe", "command", "algorithm", "block_size"}, differ
    assert (dspark["algorithm"], dspark["block_size"] + 1) == ("dspark", dflash["block_size"])
    assert dspark["train_over_token_map"] and dspark["keep_best"] and dspark["val_samples"]


def test_smollm2_recipe_matches_its_shipped_dflash_draft(tmp_path, monkeypatch):
    """The SmolLM2 DSpark recipe trains on the shipped DFlash draft's data and shape: the same
    questions and passes, layers, target layers and verified tokens per request."""
    monkeypatch.setenv("SGLANG_AUX_CACHE", str(tmp_path))
    name = "smollm2-135m-instruct-dspark-b7"
    with pytest.raises(FileNotFoundError, match=f"train_dflash --recipe {name}"):
        builtin.resolve_model_path(name)
    args = train_args.parse_args(["--recipe", name])
    shipped = json.loads((Path(builtin.resolve_model_path("smollm2-135m-instruct-dflash-b8"))
                          / "config.json").read_text())
    card = (Path(builtin.resolve_model_path("smollm2-135m-instruct-dflash-b8"))
            / "README.md").read_text()
    assert (args.target, args.algorithm) == ("smollm2-135m-instruct", "dspark")
    assert args.num_layers == shipped["num_hidden_layers"]
    assert args.num_aux_layers == len(shipped["dflash_config"]["target_layer_ids"])
    assert args.block_size + 1 == shipped["dflash_config"]["block_size"]
    assert f"{args.steps} steps" in card and f"loss decay gamma {args.gamma}" in card
    assert args.holdout == 200 and "The last 200 train questions are held out" in card
    assert args.sampled_passes == 2 and "two seeded passes" in card
    assert args.out == str(tmp_path / "drafts" / name)


def test_smoke_run_writes_a_draft_that_loads_as_dspark(target, tmp_path):
    """The tool trains a DSpark draft that loads as one, and `--eval` measures its held-out
    accept length with the DSpark worker (written into the card)."""
    local_path_or_skip("train")
    local_path_or_skip("test")
    out = tmp_path / "draft"
    train_dflash.main(["--smoke", "--algorithm", "dspark", "--target", target, "--out",
                       str(out), "--num-samples", "4", "--steps", "8", "--block-size",
                       str(GAMMA), "--eval"])
    config = json.loads((out / "config.json").read_text())
    assert config["architectures"] == ["DSparkDraftModel"]
    assert (config["markov_rank"], config["markov_head_type"]) == (16, "vanilla")
    assert config["dflash_config"]["block_size"] == GAMMA
    draft = get_model(ModelConfig.from_pretrained(out), "cpu")
    assert isinstance(draft, DSparkDraftModel) and draft.num_proposals == GAMMA
    written = dict(safetensors_weights_iterator(out))
    loaded = checkpoint_tensors(draft)
    assert set(written) == set(loaded)
    for name, tensor in written.items():
        assert torch.equal(loaded[name], tensor), name
    card = (out / "README.md").read_text()
    assert "DSpark draft for" in card and "Markov rank 16" in card
    assert "--speculative-algorithm DSPARK" in card
    assert "Held-out accept length: not measured" not in card
    assert "held-out GSM8K prompts" in card


def test_a_draft_trained_over_its_vocabulary_is_served_with_it(target, tmp_path):
    """`--algorithm dspark --train-over-token-map`: the config names the map, the DSpark
    server reads it (the LM head and `markov_w2` cut to its 64 rows) and stays lossless; the
    Markov rows off the map stay the initial ones but for the weight decay."""
    local_path_or_skip("train")
    out, first = tmp_path / "draft", tmp_path / "first"
    common = ["--smoke", "--algorithm", "dspark", "--target", target, "--num-samples", "4",
              "--block-size", str(GAMMA), "--token-map-size", "64", "--train-over-token-map"]
    train_dflash.main([*common, "--out", str(out), "--steps", "6"])
    train_dflash.main([*common, "--out", str(first), "--steps", "1", "--lr", "1e-12"])
    config = json.loads((out / "config.json").read_text())
    assert config["dflash_config"]["token_map"] == "freq_64.pt"
    assert "The draft was trained over it" in (out / "README.md").read_text()
    ids = torch.load(out / "freq_64.pt")
    w2 = dict(safetensors_weights_iterator(out))["markov_head.markov_w2.weight"]
    init = dict(safetensors_weights_iterator(first))["markov_head.markov_w2.weight"]
    off = torch.ones(len(w2), dtype=torch.bool)
    off[ids] = False
    # off the map only AdamW's weight decay moves them
    torch.testing.assert_close(w2[off], init[off], rtol=1e-3, atol=0)
    assert not torch.allclose(w2[ids], init[ids], rtol=1e-3, atol=0)
    draft = Engine(model_path=target, speculative_algorithm="DSPARK",
                   speculative_draft_model_path=str(out), device="cpu", max_total_tokens=2048,
                   max_running_requests=2).worker.draft_runner.model
    assert draft.markov_head.restricted
    assert torch.equal(draft.markov_head.markov_w2.weight, w2[ids])
    _assert_lossless(target, out, algorithm="DSPARK")


def test_the_target_logsumexp_flag_trains_the_same_objective(target, tmp_path):
    """`--target-logsumexp` (DSpark over its draft vocabulary alone): a run's first step has
    the loss and accept of the same run computing the target's whole softmax; the flag is
    refused for DFlash and without `--train-over-token-map`."""
    local_path_or_skip("train")
    common = ["--smoke", "--algorithm", "dspark", "--target", target, "--num-samples", "4",
              "--block-size", str(GAMMA), "--token-map-size", "64", "--train-over-token-map",
              "--steps", "1", "--lr", "1e-12", "--log-every", "1"]
    records = []
    for flags in ([], ["--target-logsumexp"]):
        out = tmp_path / f"draft{len(flags)}"
        train_dflash.main([*common, *flags, "--out", str(out)])
        records.append(json.loads((out / TRAINING_RECORD).read_text()))
    plain, kept = records
    assert kept["steps"] == plain["steps"] == 1
    assert kept["loss"] == pytest.approx(plain["loss"], rel=1e-4)
    assert kept["accept"] == plain["accept"]
    for bad in (["--algorithm", "dflash", "--train-over-token-map"],
                ["--algorithm", "dspark", "--no-train-over-token-map"]):
        with pytest.raises(SystemExit):
            train_args.parse_args([*bad, "--target-logsumexp"])


if __name__ == "__main__":
    sys.exit(pytest.main([__file__, "-q"]))
