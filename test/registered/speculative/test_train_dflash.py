"""DFlash draft training on CPU: the dense training forward is the paged inference forward
(same logits), the block objective's anchors and labels, overfitting one fixed batch, and a
smoke run of the whole tool whose draft folder our Engine runs losslessly."""

import hashlib
import itertools
import json
import logging
import re
import sys
import time
from collections import Counter
from pathlib import Path

import pytest
import tokenizers
import torch
import torch.nn.functional as F
from tokenizers import models, pre_tokenizers

from sglang_aux.srt.configs.acceptance_profile import DRAFT_PROFILE
from sglang_aux.srt.configs.model_config import ModelConfig
from sglang_aux.srt.configs.presets import MASK_TOKEN_ID, PRESETS
from sglang_aux.srt.entrypoints.engine import Engine
from sglang_aux.srt.forward_state.forward_batch_info import ForwardMode
from sglang_aux.srt.managers.schedule_batch import release_kv
from sglang_aux.srt.model_executor.model_runner import ModelRunner
from sglang_aux.srt.model_loader import builtin
from sglang_aux.srt.model_loader.tokenizer import Tokenizer
from sglang_aux.srt.models.weight_utils import (
    checkpoint_tensors,
    init_random_weights,
    load_named_weights,
    safetensors_weights_iterator,
)
from sglang_aux.srt.server_args import ServerArgs
from sglang_aux.srt.speculative.token_map import load_token_map
from sglang_aux.test.ci.ci_register import register_cpu_ci
from sglang_aux.test.few_shot_gsm8k import build_prompt, read_jsonl
from sglang_aux.test.gsm8k_data import local_path_or_skip
from sglang_aux.test.hf_checkpoints import save_tiny_qwen2
from sglang_aux.test.runtime_utils import (
    build_fixed_batch,
    eager_forward,
    make_runner,
    prefill,
    tiny_checkpoint,
)
from sglang_aux.tools import train_dflash
from sglang_aux.tools.build_token_map import coverage, hot_ids
from sglang_aux.tools.dflash_training import features, run_prompts, train_args
from sglang_aux.tools.dflash_training import trainer as trainer_module
from sglang_aux.tools.dflash_training.block_objective import (
    IGNORE,
    block_labels,
    offset_weights,
    slice_cross_entropy,
)
from sglang_aux.tools.dflash_training.code_tasks import MORE_TASKS_FILE, TASKS_FILE
from sglang_aux.tools.dflash_training.data import (
    BadInputError,
    Sample,
    common_prefix_len,
    describe_data,
    generate_samples,
    keep_prompt_fraction,
    load_samples,
    new_prompts_only,
    prompt_groups,
    prompt_owners,
    save_samples,
)
from sglang_aux.tools.dflash_training.draft_forward import draft_block_hidden
from sglang_aux.tools.dflash_training.export import (
    EVAL_LINE,
    SHARD_INDEX,
    TRAINING_RECORD,
    draft_config,
    new_draft,
    write_draft,
)
from sglang_aux.tools.dflash_training.features import extract_aux
from sglang_aux.tools.dflash_training.recipes import (
    GSM8K,
    MIX,
    MIX_MORE,
    RECIPES,
    SMOKE_DEFAULTS,
    shipped_samples,
)
from sglang_aux.tools.dflash_training.sequence_set import (
    Batch,
    BatchDraws,
    SequenceSet,
    sample_anchors,
)
from sglang_aux.tools.dflash_training.step_profile import device_busy_us
from sglang_aux.tools.dflash_training.target_head import head_logits
from sglang_aux.tools.dflash_training.trainer import (
    BUDGET_PROBE_STEPS,
    BUDGET_WARMUP_STEPS,
    TrainConfig,
    Trainer,
    held_out_index,
)

register_cpu_ci(est_time=90, suite="default")


def draft_block_logits(draft, embed, lm_head: torch.Tensor, aux: torch.Tensor,
                       input_ids: torch.Tensor, anchors: torch.Tensor,
                       mask_token_id: int) -> torch.Tensor:
    """Logits `[N, A, B, vocab]` of every block position of the training forward
    (`draft_block_hidden`), through the target's frozen LM head: offset j predicts token
    anchor + j (offset 0 is the anchor)."""
    hidden = draft_block_hidden(draft, embed, aux, input_ids, anchors, mask_token_id)
    return hidden @ lm_head.t().to(hidden.dtype)


BLOCK = 4
SEQ_LENS = [40, 57]
ANCHORS = [[1, 17, 39], [30, 5, 56]]  # incl. the first position with context and the last


@pytest.fixture(scope="module")
def target(tmp_path_factory):
    return tiny_checkpoint("tiny-llama", tmp_path_factory.mktemp("ckpt"))


def _setup(target_path: str, num_layers: int = 2):
    """Target runner capturing the draft's layers, a random draft (gain-2 init, so every
    weight matters) on a draft runner sharing the target's rows and slots, and the
    sequences' aux rows from one target prefill."""
    config = draft_config(PRESETS["tiny-llama"], num_layers=num_layers, num_aux_layers=2,
                          block_size=BLOCK, mask_token_id=MASK_TOKEN_ID)
    tr = make_runner(target_path, aux_layer_ids=config["dflash_config"]["target_layer_ids"],
                     max_total_tokens=2048, max_running_requests=4)
    draft = new_draft(config, torch.device("cpu"), seed=0)
    init_random_weights(draft, seed=1)
    dr = ModelRunner(ModelConfig.from_dict(config, "draft"), ServerArgs(device="cpu"),
                     is_draft_worker=True, req_to_token_pool=tr.req_to_token_pool,
                     token_to_kv_pool_allocator=tr.token_to_kv_pool_allocator, model=draft)
    draft.set_target_modules(tr.model.get_input_embeddings(), tr.model.lm_head_weight)
    g = torch.Generator().manual_seed(0)
    seqs = [torch.randint(0, 256, (n,), generator=g).tolist() for n in SEQ_LENS]
    reqs, out = prefill(tr, seqs)
    return tr, dr, draft, reqs, out.aux_hidden_states.split(SEQ_LENS)


def _sequence_set(reqs, aux) -> SequenceSet:
    """The prefilled requests as training sequences on the CPU: 10 prompt tokens each, the rest
    their continuation."""
    samples = [Sample(r.origin_input_ids[:10], r.origin_input_ids[10:]) for r in reqs]
    return SequenceSet(samples, list(aux), torch.device("cpu"))


def test_training_forward_equals_paged_inference(target):
    tr, dr, draft, reqs, aux = _setup(target)
    for r, a in zip(reqs, aux, strict=True):  # every token's draft context K/V, as the worker
        slots = tr.req_to_token_pool.req_to_token[r.req_pool_idx, : r.kv_len].clone()
        draft.write_context_kv(a, torch.arange(r.kv_len), slots, dr.token_to_kv_pool)
    paged = []
    for i in range(len(ANCHORS[0])):  # both sequences in one DRAFT_BLOCK batch per anchor
        anchors = [ANCHORS[s][i] for s in range(len(reqs))]
        rows = [tr.req_to_token_pool.req_to_token[r.req_pool_idx].clone() for r in reqs]
        locs = tr.token_to_kv_pool_allocator.alloc(BLOCK * len(reqs))
        for s, (r, a) in enumerate(zip(reqs, anchors, strict=True)):
            tr.req_to_token_pool.write(r.req_pool_idx, a, locs[s * BLOCK:(s + 1) * BLOCK])
        ids = [t for r, a in zip(reqs, anchors, strict=True)
               for t in [r.origin_input_ids[a]] + [MASK_TOKEN_ID] * (BLOCK - 1)]
        fb = build_fixed_batch(dr, reqs, ForwardMode.DRAFT_BLOCK, ids, locs, anchors)
        paged.append(eager_forward(dr, fb).next_token_logits.view(len(reqs), BLOCK, -1))
        for r, row in zip(reqs, rows, strict=True):  # the context mapping back
            tr.req_to_token_pool.req_to_token[r.req_pool_idx] = row
        tr.token_to_kv_pool_allocator.free(locs)
    paged = torch.stack(paged, dim=1)  # [N, A, B, vocab]
    pad = torch.nn.utils.rnn.pad_sequence
    ids = pad([torch.tensor(r.origin_input_ids) for r in reqs], batch_first=True)
    with torch.no_grad():
        dense = draft_block_logits(draft, tr.model.get_input_embeddings(),
                                   tr.model.lm_head_weight, pad(list(aux), batch_first=True),
                                   ids, torch.tensor(ANCHORS), MASK_TOKEN_ID)
    assert dense.shape == paged.shape
    torch.testing.assert_close(dense, paged, rtol=1e-5, atol=1e-4)
    # context is causal: changing the aux rows from position 17 on leaves the block anchored
    # at 17 alone and moves the one anchored at 39
    moved = pad(list(aux), batch_first=True).clone()
    moved[0, 17:] += 1.0
    with torch.no_grad():
        again = draft_block_logits(draft, tr.model.get_input_embeddings(),
                                   tr.model.lm_head_weight, moved, ids, torch.tensor(ANCHORS),
                                   MASK_TOKEN_ID)
    torch.testing.assert_close(again[0, 1], dense[0, 1])
    assert not torch.allclose(again[0, 2], dense[0, 2], atol=1e-3)


def test_anchors_and_labels():
    ids = torch.arange(100, 110)[None].repeat(2, 1)  # tokens 100..109
    batch = Batch(torch.zeros(2, 10, 1), ids, torch.tensor([3, 6]), torch.tensor([10, 8]))
    anchors = sample_anchors(batch, 500, torch.Generator().manual_seed(0))
    for row, lo, hi in zip(anchors, (3, 6), (8, 6), strict=True):
        assert set(row.tolist()) == set(range(lo, hi + 1))  # prompt_len .. len - 2, all hit
    labels = block_labels(batch, torch.tensor([[3, 8], [6, 6]]), block_size=4)
    assert labels[0, 0].tolist() == [IGNORE, 104, 105, 106]
    assert labels[0, 1].tolist() == [IGNORE, 109, IGNORE, IGNORE]  # past the end
    assert labels[1, 0].tolist() == [IGNORE, 107, IGNORE, IGNORE]


def test_loss_decreases_on_a_fixed_batch(target):
    tr, _, draft, reqs, aux = _setup(target, num_layers=1)
    data = _sequence_set(reqs, aux)
    trainer = Trainer(draft, tr.model.get_input_embeddings(), tr.model.lm_head_weight,
                      MASK_TOKEN_ID, TrainConfig(steps=40, lr=3e-3, warmup_frac=0.0))
    batch = data.batch([0, 1])
    anchors = sample_anchors(batch, 8, torch.Generator().manual_seed(0))
    losses = [trainer.step(batch, anchors)["loss"] for _ in range(40)]
    assert losses[-1] < 0.3 * losses[0], losses


def test_a_context_bucket_pads_the_batch_and_trains_the_same(target):
    """`context_bucket` rounds a batch's padded length up to its multiple; the rows it adds
    are never attended, so the objective and every gradient match the unpadded batch's."""
    tr, _, draft, reqs, aux = _setup(target, num_layers=1)
    data = _sequence_set(reqs, aux)
    tight, bucketed = data.batch([1, 0]), data.batch([1, 0], bucket=16)
    assert tight.ids.shape[1] == max(SEQ_LENS) and bucketed.ids.shape[1] == 64
    assert bucketed.aux.shape[:2] == bucketed.ids.shape
    assert torch.equal(bucketed.ids[:, :57], tight.ids) and not bucketed.ids[:, 57:].any()
    assert torch.equal(bucketed.lens, tight.lens)
    anchors = sample_anchors(tight, 6, torch.Generator().manual_seed(3))
    trainer = Trainer(draft, tr.model.get_input_embeddings(), tr.model.lm_head_weight,
                      MASK_TOKEN_ID, TrainConfig())
    grads = []
    for batch in (tight, bucketed):
        draft.zero_grad(set_to_none=True)
        loss, stats = trainer.objective(batch, anchors)
        loss.backward()
        grads.append([p.grad.clone() for p in draft.parameters() if p.grad is not None])
        grads[-1].insert(0, loss.detach())
    assert len(grads[0]) == len(grads[1]) > 1
    for a, b in zip(*grads, strict=True):
        torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-5)  # the sums' order only
    with pytest.raises(ValueError, match="context_bucket must be >= 0, got -8"):
        TrainConfig(context_bucket=-8)


def test_a_packed_context_pass_skips_the_padding_and_trains_the_same(target, monkeypatch):
    """`pack_context`: a batch's `rows` index exactly its sequences' own rows (the padding's
    aux rows are zeros), and projecting those alone gives the objective and every gradient of
    the whole padded pass, bucketed (most rows padding) or not; DSpark's objective reads it
    too (its own test file)."""
    tr, _, draft, reqs, aux = _setup(target, num_layers=2)
    data = _sequence_set(reqs, aux)
    projected, real = [], draft.project_context
    monkeypatch.setattr(draft, "project_context", lambda x: projected.append(len(x)) or real(x))
    for bucket in (0, 256):
        batch = data.batch([1, 0], bucket)
        n, t = batch.ids.shape
        own = torch.arange(t)[None, :] < batch.lens[:, None]
        assert torch.equal(batch.rows, own.flatten().nonzero().flatten())
        assert not batch.aux.flatten(0, 1)[~own.flatten()].any()  # the padding: zeros
        anchors = sample_anchors(batch, 6, torch.Generator().manual_seed(3))
        results, projected[:] = [], []
        for pack in (False, True):
            trainer = Trainer(draft, tr.model.get_input_embeddings(),
                              tr.model.lm_head_weight, MASK_TOKEN_ID,
                              TrainConfig(pack_context=pack))
            assert (trainer.context_rows(batch) is batch.rows) is pack
            draft.zero_grad(set_to_none=True)
            loss, _ = trainer.objective(batch, anchors)
            loss.backward()
            results.append([loss.detach()] + [p.grad.clone() for p in draft.parameters()
                                              if p.grad is not None])
        assert projected == [n * t, int(batch.lens.sum())]  # the padding skipped
        assert len(results[0]) == len(results[1]) > 2
        for a, b in zip(*results, strict=True):
            torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6)


def test_the_sdpa_backend_choice_trains_the_same_and_a_bad_one_is_named(target, monkeypatch):
    """`sdpa_backend` picks the draft attention's kernels for a step (forward and backward);
    torch's math kernels give the objective torch's own choice gives."""
    tr, _, draft, reqs, aux = _setup(target, num_layers=1)
    batch = _sequence_set(reqs, aux).batch([0, 1])
    anchors = sample_anchors(batch, 6, torch.Generator().manual_seed(3))
    losses, start = [], {k: v.clone() for k, v in draft.state_dict().items()}
    for backend in ("auto", "math"):
        draft.load_state_dict(start)
        trainer = Trainer(draft, tr.model.get_input_embeddings(), tr.model.lm_head_weight,
                          MASK_TOKEN_ID, TrainConfig(sdpa_backend=backend))
        losses.append([float(trainer.step(batch, anchors)["loss"]) for _ in range(2)])
    torch.testing.assert_close(losses[0], losses[1], rtol=1e-5, atol=1e-6)
    # where no enabled kernel takes grouped K/V heads (the memory-efficient one alone), each
    # query head gets its own copy of its group's K/V: the same objective
    draft.load_state_dict(start)
    trainer = Trainer(draft, tr.model.get_input_embeddings(), tr.model.lm_head_weight,
                      MASK_TOKEN_ID, TrainConfig())
    grouped = trainer.objective(batch, anchors)[0]
    monkeypatch.setattr(trainer_module, "grouped_kv_kernel_enabled", lambda: False)
    seen = []
    real = F.scaled_dot_product_attention
    monkeypatch.setattr(F, "scaled_dot_product_attention",
                        lambda q, k, *a, **kw: seen.append((k.shape[1], kw["enable_gqa"]))
                        or real(q, k, *a, **kw))
    torch.testing.assert_close(trainer.objective(batch, anchors)[0], grouped, rtol=1e-5,
                               atol=1e-6)
    heads = PRESETS["tiny-llama"]["num_attention_heads"]
    assert seen and all(s == (heads, False) for s in seen)
    monkeypatch.undo()
    with pytest.raises(RuntimeError, match="No viable backend"):  # the choice is applied:
        Trainer(draft, tr.model.get_input_embeddings(), tr.model.lm_head_weight,  # CUDA only
                MASK_TOKEN_ID, TrainConfig(sdpa_backend="efficient")).step(batch, anchors)
    with pytest.raises(ValueError, match="sdpa_backend must be one of auto, cudnn, "):
        TrainConfig(sdpa_backend="fast")


def test_steps_compile_by_default_on_cuda_alone():
    """TrainConfig's `compile` None (the default, `--compile`/`--no-compile` unset) compiles
    on CUDA (1.9x the eager steps a second on an H100) and not on the CPU; either flag
    decides on both."""
    cuda, cpu = torch.device("cuda"), torch.device("cpu")
    assert TrainConfig().compiles_on(cuda) and not TrainConfig().compiles_on(cpu)
    argv = ["--smoke", "--out", "draft"]
    assert train_args.parse_args(argv).compile is None
    for flag, want in (("--compile", True), ("--no-compile", False)):
        cfg = TrainConfig(compile=train_args.parse_args([*argv, flag]).compile)
        assert cfg.compiles_on(cuda) is want and cfg.compiles_on(cpu) is want, flag


def test_a_compiled_step_trains_as_the_eager_one(target):
    """`TrainConfig(compile=True)`: the draft's forward and the loss's slices through
    torch.compile (Inductor on the CPU) train the weights the eager step trains, to float
    rounding, over steps at two context lengths and two counts of own rows (a new shape
    compiles again, not fails), with the whole context pass and with a packed one."""
    tr, _, draft, reqs, aux = _setup(target, num_layers=1)
    data = _sequence_set(reqs, aux)
    start = {k: v.clone() for k, v in draft.state_dict().items()}
    trained, losses = {}, {}
    for compiled, packed in ((False, False), (True, False), (True, True)):
        draft.load_state_dict(start)
        trainer = Trainer(draft, tr.model.get_input_embeddings(), tr.model.lm_head_weight,
                          MASK_TOKEN_ID, TrainConfig(compile=compiled, pack_context=packed))
        assert (trainer.block_hidden is draft_block_hidden) is not compiled
        losses[compiled, packed] = []
        for i, (index, bucket) in enumerate((([0, 1], 0), ([1, 0], 0), ([0, 0], 256))):
            batch = data.batch(index, bucket)
            anchors = sample_anchors(batch, 6, torch.Generator().manual_seed(i))
            losses[compiled, packed].append(float(trainer.step(batch, anchors)["loss"]))
        trained[compiled, packed] = {k: v.clone() for k, v in draft.state_dict().items()}
    eager = (False, False)
    assert any(not torch.equal(trained[eager][k], start[k]) for k in start)  # it trained
    for variant in ((True, False), (True, True)):
        torch.testing.assert_close(losses[variant], losses[eager], rtol=1e-5, atol=0)
        for k in start:
            torch.testing.assert_close(trained[variant][k], trained[eager][k], rtol=1e-4,
                                       atol=1e-6)


def test_validation_runs_eagerly_beside_compiled_steps(target, monkeypatch):
    """With `compile`, the steps run the compiled functions and the held-out validation (no
    autograd, a few batches now and then) the eager ones: no second compile for it."""
    tr, _, draft, reqs, aux = _setup(target, num_layers=1)
    data = _sequence_set(reqs, aux)
    calls = []
    monkeypatch.setattr(torch, "compile", lambda fn, **kw: lambda *a: calls.append(
        fn.__name__) or fn(*a))
    trainer = Trainer(draft, tr.model.get_input_embeddings(), tr.model.lm_head_weight,
                      MASK_TOKEN_ID, TrainConfig(steps=1, batch_size=1, anchors_per_seq=4,
                                                 val_samples=1, compile=True))
    trainer.fit(data)
    assert calls == ["draft_block_hidden", "slice_cross_entropy"]  # the step's alone
    assert [p["step"] for p in trainer.val_curve] == [1]


def test_fused_adamw_trains_as_the_foreach_one(target):
    """`fused_adam`: AdamW's fused kernels step the draft as its foreach ones do, to float
    rounding, and a checkpoint of either resumes under the other (the same state)."""
    tr, _, draft, reqs, aux = _setup(target, num_layers=1)
    data = _sequence_set(reqs, aux)
    embed, head = tr.model.get_input_embeddings(), tr.model.lm_head_weight
    start = {k: v.clone() for k, v in draft.state_dict().items()}
    trained = {}
    for fused, resumed_fused in ((False, False), (True, True), (False, True)):
        draft.load_state_dict(start)
        cfg = dict(steps=6, batch_size=2, anchors_per_seq=4)
        first = Trainer(draft, embed, head, MASK_TOKEN_ID, TrainConfig(**cfg, fused_adam=fused))
        assert first.opt.defaults["fused"] is (True if fused else None)
        state = {}
        first.fit(data, checkpoint=lambda t=first, s=state: s.update(t.state_dict()),
                  max_run_steps=3)
        second = Trainer(draft, embed, head, MASK_TOKEN_ID,
                         TrainConfig(**cfg, fused_adam=resumed_fused))
        second.load_state_dict(state)
        assert second.fit(data)["done"] and second.num_steps == 6
        trained[fused, resumed_fused] = {k: v.clone() for k, v in draft.state_dict().items()}
    assert any(not torch.equal(trained[False, False][k], start[k]) for k in start)  # trained
    for runs in ((True, True), (False, True)):  # fused throughout; foreach, then fused
        for k in start:
            torch.testing.assert_close(trained[runs][k], trained[False, False][k], rtol=1e-5,
                                       atol=1e-6)


def test_a_finished_training_keeps_its_best_validations_draft(target):
    """`keep_best`: each validation that beats the best so far (held-out accept, then loss)
    keeps a copy of the weights, a checkpoint carries it to the next run, and a finished
    training whose last validation is worse leaves the best one's draft, bit for bit; without
    `keep_best`, the last step's. Three runs of two steps, validated at their ends: weights
    scaled up before the first and the third stand in for steps that made the draft worse
    (confidently wrong: a far higher held-out loss), so the second run's is the best."""
    tr, _, draft, reqs, aux = _setup(target, num_layers=1)
    data = _sequence_set(reqs, aux)
    embed, head = tr.model.get_input_embeddings(), tr.model.lm_head_weight
    good = {k: v.clone() for k, v in draft.state_dict().items()}

    def worse() -> None:
        draft.load_state_dict({k: v * 50 for k, v in draft.state_dict().items()})

    for keep in (True, False):
        cfg = TrainConfig(steps=6, batch_size=1, anchors_per_seq=4, val_samples=1,
                          val_every=2, keep_best=keep)
        trainer, state = Trainer(draft, embed, head, MASK_TOKEN_ID, cfg), {}
        draft.load_state_dict(good)
        worse()
        for run in range(2):
            if run:
                draft.load_state_dict(good)
            trainer.fit(data, max_run_steps=2,
                        checkpoint=lambda t=trainer, s=state: s.update(t.state_dict()))
        at_four = {k: v.clone() for k, v in draft.state_dict().items()}
        resumed = Trainer(draft, embed, head, MASK_TOKEN_ID, cfg)
        resumed.load_state_dict(state)  # the run's state at step 4, the best's copy with it
        worse()
        assert resumed.fit(data)["done"]
        two, four, six = resumed.val_curve
        assert [p["step"] for p in (two, four, six)] == [2, 4, 6]
        assert four["loss"] < min(two["loss"], six["loss"])
        kept = draft.state_dict()
        if keep:
            assert resumed.kept_point() == four
            assert all(torch.equal(kept[k], at_four[k]) for k in at_four)
        else:
            assert resumed.kept_point() is None
            assert not all(torch.equal(kept[k], at_four[k]) for k in at_four)


def _vocab_objective(target, token_ids):
    """The objective (loss, stats) of one batch with the whole LM head and over `token_ids`,
    on the same draft, with the draft's hidden rows and the true labels."""
    tr, _, draft, reqs, aux = _setup(target, num_layers=1)
    batch = _sequence_set(reqs, aux).batch([0, 1])
    anchors = sample_anchors(batch, 6, torch.Generator().manual_seed(3))
    args = (draft, tr.model.get_input_embeddings(), tr.model.lm_head_weight, MASK_TOKEN_ID,
            TrainConfig())
    with torch.no_grad():
        whole = Trainer(*args).objective(batch, anchors)
        cut = Trainer(*args, token_ids=token_ids).objective(batch, anchors)
        hidden = draft_block_hidden(draft, tr.model.get_input_embeddings(), batch.aux,
                                    batch.ids, anchors, MASK_TOKEN_ID)
    return whole, cut, hidden, tr.model.lm_head_weight, block_labels(batch, anchors, BLOCK)


def test_a_vocabulary_of_every_id_trains_as_the_whole_head(target):
    """Every id in order: the same loss, accuracies and accept length, bitwise."""
    (loss, stats), (cut_loss, cut_stats), *_ = _vocab_objective(target, torch.arange(320))
    assert torch.equal(cut_loss, loss)
    for k in stats:
        assert torch.equal(cut_stats[k], stats[k]), k


def test_a_small_vocabulary_trains_its_rows_and_counts_the_rest_wrong(target):
    """Half the ids, shuffled: the loss is the cross-entropy over those columns alone of the
    labels inside them (weighted as the whole head's), and a label outside is never right."""
    ids = torch.randperm(320, generator=torch.Generator().manual_seed(1))[:160]
    _, (loss, stats), hidden, head, labels = _vocab_objective(target, ids)
    inside = torch.isin(labels, ids)
    assert inside.any() and ((labels != IGNORE) & ~inside).any()  # both kinds occur
    rows = torch.full((320,), -1)
    rows[ids] = torch.arange(160)
    logits = hidden @ head[ids].t()
    w = offset_weights(BLOCK, TrainConfig().gamma, torch.device("cpu")) * inside
    ce = torch.nn.functional.cross_entropy(logits[inside], rows[labels[inside]],
                                           reduction="none")
    torch.testing.assert_close(loss, (ce * w[inside]).sum() / w.sum())
    correct = (logits.argmax(-1) == rows[labels.clamp(min=0)]) & inside
    valid = (labels != IGNORE).flatten(0, 1)
    want_acc = correct.flatten(0, 1).sum(0) / valid.sum(0).clamp(min=1)
    torch.testing.assert_close(stats["acc"], want_acc[1:])


def test_the_lm_head_is_read_as_it_is_under_autocast():
    """`head_logits`: under autocast, the draft's fp32 rows through a bf16 head give the
    product the old cast of the head to fp32 gave, bit for bit, and no op writes a tensor of
    the head's size (no copy of it a slice); without autocast, the head in the rows' dtype;
    traced (`--compile`), the loss slice is one graph either way."""
    from torch.utils._python_dispatch import TorchDispatchMode

    g = torch.Generator().manual_seed(0)
    head = torch.randn(320, 64, generator=g).to(torch.bfloat16)

    class Writes(TorchDispatchMode):  # the size of every new tensor an op writes
        def __init__(self):
            super().__init__()
            self.sizes = []

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            out = func(*args, **(kwargs or {}))
            self.sizes += [t.numel() for t in torch.utils._pytree.tree_leaves(out)
                           if isinstance(t, torch.Tensor) and t.untyped_storage().data_ptr()
                           != head.untyped_storage().data_ptr()]  # (views of the head: none)
            return out

    h = torch.randn(2, 8, 64, generator=g)
    with torch.autocast("cpu", torch.bfloat16):
        before = h @ head.t().to(h.dtype)
        with Writes() as writes:
            logits = head_logits(h, head)
    assert logits.dtype == before.dtype == torch.bfloat16 and torch.equal(logits, before)
    assert head.numel() not in writes.sizes, writes.sizes
    assert torch.equal(head_logits(h, head), h @ head.t().float())  # no autocast: fp32
    # the question asked inside a traced loss slice breaks no graph, autocast on or off
    labels, weights = torch.randint(0, 320, (2, 8), generator=g), torch.ones(2, 8)
    for on in (False, True):
        with torch.autocast("cpu", torch.bfloat16, enabled=on):
            explained = torch._dynamo.explain(slice_cross_entropy)(
                h, head, labels, weights, torch.tensor(16.0))
        assert (explained.graph_count, explained.graph_break_count) == (1, 0), on


def test_sliced_block_loss_equals_the_whole_batch_loss(target):
    """The block loss over slices of one block gives the loss, stats and parameter gradients
    of one slice holding the whole batch; each hidden row's gradient is its slice's own, so
    the draft's gradients agree to fp32 rounding of the sums over rows."""
    tr, _, draft, reqs, aux = _setup(target, num_layers=1)
    data = _sequence_set(reqs, aux)
    trainer = Trainer(draft, tr.model.get_input_embeddings(), tr.model.lm_head_weight,
                      MASK_TOKEN_ID, TrainConfig())
    batch = data.batch([0, 1])
    anchors = sample_anchors(batch, 5, torch.Generator().manual_seed(2))
    results = []
    for rows in (10_000, BLOCK):
        trainer.slice_rows = rows
        draft.zero_grad(set_to_none=True)
        loss, stats = trainer.objective(batch, anchors)
        loss.backward()
        results.append((loss.detach(), stats,
                        {n: p.grad.clone() for n, p in draft.named_parameters()
                         if p.grad is not None}))
    (whole, s_whole, g_whole), (sliced, s_sliced, g_sliced) = results
    torch.testing.assert_close(sliced, whole)
    for k in s_whole:
        torch.testing.assert_close(s_sliced[k], s_whole[k])
    assert set(g_sliced) == set(g_whole) and g_whole
    for n in g_whole:
        torch.testing.assert_close(g_sliced[n], g_whole[n], rtol=1e-5, atol=1e-6, msg=n)


def test_shared_prefix_rows_are_kept_once(target):
    """A SequenceSet given the k-shot prefix's rows once builds the same batches as one given
    every sequence's rows whole; rows that do not add up to a sequence are refused."""
    _, _, _, reqs, aux = _setup(target, num_layers=1)
    shared = 10
    rows = [torch.cat([aux[0][:shared], a[shared:]]) for a in aux]  # one prefix for all
    samples = [Sample(r.origin_input_ids[:12], r.origin_input_ids[12:]) for r in reqs]
    whole = SequenceSet(samples, rows, torch.device("cpu"))
    kept_once = SequenceSet(samples, [a[shared:] for a in rows], torch.device("cpu"),
                            prefix_aux=aux[0][:shared])
    assert [len(p) for p in kept_once.prefixes] == [shared]
    a, b = whole.batch([1, 0]), kept_once.batch([1, 0])
    assert torch.equal(a.aux, b.aux) and torch.equal(a.ids, b.ids)
    with pytest.raises(ValueError, match="shared and"):
        SequenceSet(samples, list(aux), torch.device("cpu"), prefix_aux=aux[0][:shared])


def test_each_source_keeps_its_own_prefix_once(target):
    """Sequences of two sources, each source's prefix kept once (`prefix_of`), build the same
    batches as every sequence's rows whole."""
    _, _, _, reqs, aux = _setup(target, num_layers=1)
    cpu = torch.device("cpu")
    prefixes = [aux[0][:10], aux[1][:6]]
    of = [i % 2 for i in range(len(reqs))]
    rows = [torch.cat([prefixes[of[i]], a[len(prefixes[of[i]]):]]) for i, a in enumerate(aux)]
    samples = [Sample(r.origin_input_ids[:12], r.origin_input_ids[12:]) for r in reqs]
    whole = SequenceSet(samples, rows, cpu)
    split = SequenceSet(samples, [r[len(prefixes[of[i]]):] for i, r in enumerate(rows)], cpu,
                        prefix_aux=prefixes, prefix_of=of)
    index = list(range(len(reqs)))[::-1]
    a, b = whole.batch(index), split.batch(index)
    assert torch.equal(a.aux, b.aux) and torch.equal(a.ids, b.ids)


def test_a_batch_is_its_sequences_rows_zero_padded(target):
    """`SequenceSet.batch` (one cat into the padded layout): each sequence's prefix and own
    rows and its ids, zero-padded to the longest one rounded up to the bucket, bit for bit
    as pad_sequence lays them out; a sequence drawn twice appears twice."""
    _, _, _, reqs, aux = _setup(target, num_layers=1)
    prefixes = [aux[0][:10], aux[1][:6]]
    of = [i % 2 for i in range(len(reqs))]
    own = [a[len(prefixes[of[i]]):] for i, a in enumerate(aux)]
    samples = [Sample(r.origin_input_ids[:12], r.origin_input_ids[12:]) for r in reqs]
    data = SequenceSet(samples, own, torch.device("cpu"), prefix_aux=prefixes, prefix_of=of)
    pad = torch.nn.utils.rnn.pad_sequence
    for index, bucket in (([1, 0], 0), ([0, 1, 0], 16), ([1], 256)):
        batch = data.batch(index, bucket)
        longest = max(SEQ_LENS[i] for i in index)
        width = -(-longest // bucket) * bucket if bucket else longest
        rows = pad([torch.cat([prefixes[of[i]], own[i]]) for i in index], batch_first=True)
        ids = pad([torch.tensor(reqs[i].origin_input_ids) for i in index], batch_first=True)
        assert batch.aux.shape == (len(index), width, aux[0].shape[-1])
        assert torch.equal(batch.aux[:, :longest], rows) and not batch.aux[:, longest:].any()
        assert torch.equal(batch.ids[:, :longest], ids) and not batch.ids[:, longest:].any()
        assert batch.lens.tolist() == [SEQ_LENS[i] for i in index]
        assert batch.prompt_lens.tolist() == [12] * len(index)
        assert batch.rows.tolist() == [j * width + t for j, i in enumerate(index)
                                       for t in range(SEQ_LENS[i])]


def test_batches_drawn_by_length_group_keep_every_sequence_equally_likely():
    """`BatchDraws`: without groups, a batch is `pool[randint]` as it always was (the data
    order of runs before it); with `group_rows`, every batch's sequences share one length
    group, each sequence of the pool is drawn as often as any other, and a batch pads to its
    own group's length (the rows the grouped batches pad to: fewer by the share the mix's
    lengths predict)."""
    lens = torch.tensor([10, 30, 12, 31, 11, 60, 29, 9, 58, 13])
    pool = torch.tensor([0, 1, 2, 3, 5, 6, 7, 8, 9])  # 4 held out
    plain = BatchDraws(lens, pool, 4)
    g, h = torch.Generator().manual_seed(3), torch.Generator().manual_seed(3)
    for _ in range(5):
        assert plain.draw(g) == pool[torch.randint(len(pool), (4,), generator=h)].tolist()
    grouped = BatchDraws(lens, pool, 4, group_rows=16)
    assert sorted(len(x) for x in grouped.groups) == [2, 3, 4]  # 49-64, 17-32, <=16 rows
    counts, padded, drawn = Counter(), 0, 0
    for _ in range(6000):
        index = grouped.draw(g)
        assert len({(int(lens[i]) + 15) // 16 for i in index}) == 1, index
        counts.update(index)
        padded += len(index) * -(-int(lens[index].max()) // 16) * 16
        drawn += len(index)
    assert set(counts) == set(pool.tolist())
    assert max(counts.values()) / min(counts.values()) < 1.15, counts  # 1/9 each
    plain_padded = 0
    for _ in range(6000):
        index = plain.draw(g)
        plain_padded += len(index) * -(-int(lens[index].max()) // 16) * 16
    assert padded < 0.7 * plain_padded


def _aux_runner(target: str):
    """A runner of the tiny target that captures a one-layer draft's two aux layers, and
    those layers."""
    config = draft_config(PRESETS["tiny-llama"], num_layers=1, num_aux_layers=2,
                          block_size=BLOCK, mask_token_id=MASK_TOKEN_ID)
    layer_ids = config["dflash_config"]["target_layer_ids"]
    return make_runner(target, aux_layer_ids=layer_ids, max_total_tokens=2048,
                       max_running_requests=4), layer_ids


def test_features_read_the_shared_prefix_from_the_kv_cache(target):
    """extract_aux runs the shared prefix once and every later sequence over it as a cached
    prefix: the rows equal one whole forward per sequence (fp32), and every slot and request
    row is given back."""
    tr, layer_ids = _aux_runner(target)
    g = torch.Generator().manual_seed(3)
    shots = torch.randint(0, 256, (21,), generator=g).tolist()
    samples = [Sample(shots + torch.randint(0, 256, (n,), generator=g).tolist(),
                      torch.randint(0, 256, (m,), generator=g).tolist())
               for n, m in [(5, 9), (3, 2), (8, 6), (1, 4), (6, 7), (2, 3)]]
    skip = common_prefix_len(samples)
    assert skip == len(shots)
    free = (tr.token_to_kv_pool_allocator.available_size(), tr.req_to_token_pool.available_size())
    prefix, rows = extract_aux(tr, samples, layer_ids, skip=skip)
    assert (tr.token_to_kv_pool_allocator.available_size(),
            tr.req_to_token_pool.available_size()) == free
    tr.model.set_dflash_layers_to_capture(layer_ids)  # extract_aux turns capturing off
    for s, own in zip(samples, rows, strict=True):
        reqs, out = prefill(tr, [s.ids])
        whole = out.aux_hidden_states
        release_kv(tr, reqs[0])
        # fp32 rounding only: matmul blocking differs with the forward's token count
        torch.testing.assert_close(prefix, whole[:skip], rtol=1e-4, atol=1e-4)
        torch.testing.assert_close(own, whole[skip:], rtol=1e-4, atol=1e-4)


def test_a_prompts_rows_are_kept_once_for_all_its_continuations(target, monkeypatch):
    """`share_prompts`: a prompt continued several times (greedy and sampled passes, file
    order pass by pass) is computed and kept in its first continuation alone; the others run
    over its K/V, keep only their continuation's rows (equal to a whole forward's, fp32) and
    borrow the prompt's (`prompt_owner`), so the set holds
    fewer rows and builds the batches of every sequence's rows whole, with each prompt's
    rows its owner's, bit for bit; an owner too short to train (one continuation token)
    still lends its rows; an owner of another prompt is refused."""
    tr, layer_ids = _aux_runner(target)
    g = torch.Generator().manual_seed(5)
    shots = torch.randint(0, 256, (17,), generator=g).tolist()
    prompts = [shots + torch.randint(0, 256, (n,), generator=g).tolist() for n in (6, 3, 9)]
    outs = [1, 7, 5, 4, 6, 2, 8, 3, 5]  # prompt 0's first continuation has one token
    samples = [Sample(prompts[i % 3], torch.randint(0, 256, (m,), generator=g).tolist())
               for i, m in enumerate(outs)]
    owner = prompt_owners(samples)
    assert owner == [0, 1, 2, 0, 1, 2, 0, 1, 2]
    skip = common_prefix_len(samples)
    free = (tr.token_to_kv_pool_allocator.available_size(), tr.req_to_token_pool.available_size())
    prefix, whole = extract_aux(tr, samples, layer_ids, skip=skip)
    prefix_s, shared = extract_aux(tr, samples, layer_ids, skip=skip, share_prompts=True)
    # every slot is given back, the owners' held prompts too
    assert (tr.token_to_kv_pool_allocator.available_size(),
            tr.req_to_token_pool.available_size()) == free
    # forwards of a few tokens: each owner's batch, then its continuations, many times over
    monkeypatch.setattr(features, "MAX_FORWARD_TOKENS", 12)
    _, small = extract_aux(tr, samples, layer_ids, skip=skip, share_prompts=True)
    assert (tr.token_to_kv_pool_allocator.available_size(),
            tr.req_to_token_pool.available_size()) == free
    for a, b in zip(shared, small, strict=True):
        torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-4)
    for i, s in enumerate(samples):
        mine = len(s.ids) - skip if owner[i] == i else len(s.output_ids)
        assert len(shared[i]) == mine
        torch.testing.assert_close(shared[i], whole[i][len(whole[i]) - mine:],
                                   rtol=1e-4, atol=1e-4)
    # what the trainer plans for before the features (`check_rows_fit`) is what they keep
    assert features.rows_to_keep(samples, share_prompts=True) == len(prefix_s) + sum(
        len(a) for a in shared)
    assert features.rows_to_keep(samples, share_prompts=False) == len(prefix) + sum(
        len(a) for a in whole)
    cpu = torch.device("cpu")
    data = SequenceSet(samples, shared, cpu, prefix_s, prompt_owner=owner)
    assert len(data) == 8 and sum(len(a) for a in data.aux) < sum(
        len(a) for a in whole[1:])
    # the same sequences with every row whole, each prompt's rows its owner's
    rows = [torch.cat([shared[o][: len(s.prompt_ids) - skip], shared[i]]) if o != i
            else shared[i] for i, (s, o) in enumerate(zip(samples, owner, strict=True))]
    plain = SequenceSet(samples, rows, cpu, prefix_s)
    index = [7, 0, 3, 3, 5, 1]
    a, b = plain.batch(index, 16), data.batch(index, 16)
    for x, y in ((a.aux, b.aux), (a.ids, b.ids), (a.prompt_lens, b.prompt_lens),
                 (a.lens, b.lens), (a.rows, b.rows)):
        assert torch.equal(x, y)
    wrong = owner[:4] + [2] + owner[5:]
    with pytest.raises(ValueError, match="sample 4: its prompt owner 2 has another prompt"):
        SequenceSet(samples, shared, cpu, prefix_s, prompt_owner=wrong)


def test_rows_that_cannot_fit_stop_before_the_features(target, tmp_path, monkeypatch):
    """The rows a run will keep are planned before the features start: where the device
    (past its reserve) and the host's available memory cannot hold them, the run stops in one
    line naming the bytes and the ways out, before any forward (the kernel would otherwise
    kill it minutes later); where they fit, the plan is logged and the run trains."""
    local_path_or_skip("train")
    assert "aux rows: 10 of 64 bytes" in features.check_rows_fit(10, 64, torch.device("cpu"), 0)
    samples = tmp_path / "s.jsonl"
    common = ["--smoke", "--target", target, "--num-samples", "8", "--samples-file",
              str(samples)]
    train_dflash.main([*common, "--phase", "data"])
    monkeypatch.setattr(features, "host_available_bytes",
                        lambda: features.HOST_MARGIN_BYTES + features.HOST_CHUNK_BYTES + 1000)
    forwards = []
    monkeypatch.setattr(features, "extract_aux", lambda *a, **k: forwards.append(1))
    with pytest.raises(SystemExit, match=r"^train_dflash: error: the target's aux rows need "
                                         r"[0-9.]+ GB \([0-9]+ rows of [0-9]+ bytes\), past "
                                         r"0\.0 GB on the device .* and 0\.0 GB of host "
                                         r"memory: train on fewer samples \(--sample-fraction\)"):
        train_dflash.main([*common, "--phase", "train", "--steps", "2", "--out",
                           str(tmp_path / "d")])
    assert not forwards and not (tmp_path / "d").exists()


def test_rows_past_the_hosts_memory_stop_in_one_line_before_pinning(monkeypatch):
    """Pinned rows that would leave the host less than its margin stop with one line naming
    the way out (the kernel would kill the process without one); the count of what is pinned
    is kept."""
    assert features.host_available_bytes() > 0  # Linux: /proc/meminfo's MemAvailable
    host = features.HostRows()
    left = features.HOST_MARGIN_BYTES + features.HOST_CHUNK_BYTES // 2
    monkeypatch.setattr(features, "host_available_bytes", lambda: left)
    with pytest.raises(MemoryError, match=r"0\.0 GB pinned, .* GB more would leave less than "
                                          r"2 GiB: train on fewer samples \(--num-samples\)"):
        host.copy(torch.zeros(4, 8))
    big = torch.zeros(features.HOST_CHUNK_BYTES // 4 + 1)  # a copy of its own: over a chunk
    with pytest.raises(MemoryError, match="need more host memory"):
        host.copy(big)
    assert host.pinned == 0 and host.chunk is None
    host._reserve(1 << 20)  # what fits is counted
    assert host.pinned == 1 << 20


def test_the_device_reserve_reaches_the_feature_rows(target, tmp_path, monkeypatch, capsys):
    """`--device-reserve-gb`: what the samples' rows leave free on the device (a larger value
    keeps more of them in pinned host memory, to time their copies); negative is refused."""
    local_path_or_skip("train")
    seen = []

    def spy(device, nbytes, reserve_bytes):
        seen.append(reserve_bytes)
        return True

    monkeypatch.setattr(features, "has_room", spy)
    train_dflash.main(["--smoke", "--target", target, "--out", str(tmp_path / "d"),
                       "--num-samples", "4", "--steps", "2", "--device-reserve-gb", "1.5"])
    assert seen and set(seen) == {3 << 29}
    with pytest.raises(SystemExit):
        train_args.parse_args(["--device-reserve-gb", "-1"])
    assert "--device-reserve-gb must be >= 0, got -1.0" in capsys.readouterr().err


def test_large_drafts_are_written_in_shards_the_loader_reads(target, tmp_path):
    """A draft over the shard limit is written as transformers shards a checkpoint (numbered
    files plus an index naming every tensor's file) and loads back equal; rewriting the
    folder replaces it whole; a folder that holds something else is refused."""
    config = draft_config(PRESETS["tiny-llama"], num_layers=2, num_aux_layers=2,
                          block_size=BLOCK, mask_token_id=MASK_TOKEN_ID, intermediate_size=48)
    assert config["intermediate_size"] == 48
    draft = new_draft(config, torch.device("cpu"), seed=0)
    init_random_weights(draft, seed=2)
    out = tmp_path / "draft"
    write_draft(draft, config, out, "card", max_shard_bytes=40_000)
    files = sorted(p.name for p in out.glob("*.safetensors"))
    assert len(files) >= 2 and files[0] == f"model-00001-of-{len(files):05d}.safetensors"
    index = json.loads((out / SHARD_INDEX).read_text())
    assert set(index["weight_map"]) == set(checkpoint_tensors(draft))
    assert set(index["weight_map"].values()) == set(files)
    sizes = [(out / f).stat().st_size for f in files]
    assert max(sizes) < 40_000 + 20_000  # a shard holds at most the limit (plus its header)
    loaded = new_draft(config, torch.device("cpu"), seed=5)
    load_named_weights(loaded, safetensors_weights_iterator(out))
    for name, t in checkpoint_tensors(draft).items():
        assert torch.equal(checkpoint_tensors(loaded)[name], t), name
    write_draft(draft, config, out, "card")  # one file now: no shard is left behind
    assert sorted(p.name for p in out.iterdir()) == ["README.md", "config.json",
                                                      "model.safetensors"]
    other = tmp_path / "other"
    other.mkdir()
    (other / "notes.txt").write_text("mine")
    with pytest.raises(FileExistsError, match="holds no draft"):
        write_draft(draft, config, other, "card")
    assert (other / "notes.txt").read_text() == "mine"


def test_recipe_sets_defaults_and_resolves_its_draft(tmp_path, monkeypatch):
    """`--recipe NAME` gives the named draft's flags as defaults (a flag given beside it wins)
    and writes where NAME resolves; before training, NAME fails naming the command."""
    monkeypatch.setenv("SGLANG_AUX_CACHE", str(tmp_path))
    name = "qwen2.5-coder-1.5b-instruct-dflash-b16-gsm8k"
    for recipe in RECIPES:  # every recipe's draft is served by its name once trained
        with pytest.raises(FileNotFoundError, match=f"train_dflash --recipe {recipe}"):
            builtin.resolve_model_path(recipe)
    args = train_args.parse_args(["--recipe", name, "--steps", "7"])
    assert (args.target, args.block_size, args.num_layers, args.num_aux_layers,
            args.intermediate_size, args.holdout, args.sampled_passes, args.steps) == (
        "qwen2.5-coder-1.5b-instruct", 16, 2, 5, 2816, 200, 5, 7)
    assert (args.code_tasks, args.chat_instructions) == (0, 0)  # GSM8K only
    assert train_args.parse_args(["--recipe", name]).steps == 6_120
    # the default, the mix: GSM8K, code and chat prompts, the same draft otherwise
    mix = train_args.parse_args(["--recipe", MIX])
    assert MIX == "qwen2.5-coder-1.5b-instruct-dflash-b16" == builtin.TRAINED_DRAFTS[1]
    assert (mix.num_samples, mix.code_tasks, mix.chat_instructions, mix.sampled_passes) == (
        3_000, 3_000, 2_000, 3)
    assert (mix.block_size, mix.num_layers, mix.steps) == (16, 2, 24_000)
    assert mix.code_tasks_file == str(TASKS_FILE)  # the shipped tasks, the same everywhere
    # generated once, trained from here; the mix beside the GSM8K recipe's, as MXFP8 rows
    assert mix.samples_file == str(shipped_samples(MIX))
    assert args.samples_file == str(shipped_samples(name)) == mix.extra_samples_file[0]
    assert (mix.extra_samples_file, args.extra_samples_file) == ([args.samples_file], [])
    assert mix.mxfp8_rows and not args.mxfp8_rows
    # the mix's second prompts: code tasks of other functions, chat from another seed, no GSM8K
    more = train_args.parse_args(["--recipe", MIX_MORE])
    assert (more.num_samples, more.code_tasks, more.chat_instructions, more.seed) == (
        0, 3_000, 2_000, 1)
    assert (more.code_tasks_file, more.samples_file, more.extra_samples_file) == (
        str(MORE_TASKS_FILE), str(shipped_samples(MIX_MORE)), [])
    # the mix trains over its draft vocabulary (DSpark too), a flag turns it off
    assert mix.train_over_token_map and not args.train_over_token_map
    assert (mix.val_samples, args.val_samples) == (320, 0)  # its curve says when it overfits
    assert not train_args.parse_args(["--recipe", MIX, "--no-train-over-token-map"]
                                     ).train_over_token_map
    assert train_args.parse_args(["--recipe", MIX, "--algorithm", "dspark"]
                                 ).train_over_token_map
    assert args.out == str(tmp_path / "drafts" / name)
    (tmp_path / "drafts" / name).mkdir(parents=True)
    (tmp_path / "drafts" / name / "config.json").write_text("{}")
    assert builtin.resolve_model_path(name) == args.out


def test_a_bad_code_tasks_file_stops_before_any_model_loads(tmp_path):
    bad = tmp_path / "tasks.jsonl"
    bad.write_text("not json\n")
    with pytest.raises(BadInputError, match=r"tasks.jsonl:1: not a code task"):
        train_args.parse_args(["--smoke", "--out", "d", "--code-tasks", "2",
                                 "--code-tasks-file", str(bad)])
    with pytest.raises(BadInputError, match="3000 code tasks, --code-tasks asks for 3001"):
        train_args.parse_args(["--smoke", "--out", "d", "--code-tasks", "3001",
                                 "--code-tasks-file", str(TASKS_FILE)])
    with pytest.raises(BadInputError, match=r"missing.jsonl: no such file \(--code-tasks-file"):
        train_args.parse_args(["--smoke", "--out", "d", "--code-tasks-file",
                                 str(tmp_path / "missing.jsonl")])


def test_deadline_leaves_training_what_the_rest_did_not_use():
    args = train_args.parse_args(["--smoke", "--out", "d", "--deadline-s", "100"])
    started = time.perf_counter() - 30  # generation and features took 30 s
    left = 100 - 30 - train_dflash.DEADLINE_RESERVE_S
    assert train_dflash._train_budget(args, started) == pytest.approx(left, abs=1)
    args.train_budget_s = 10.0  # the smaller of the two
    assert train_dflash._train_budget(args, started) == 10.0
    assert train_dflash._train_budget(args, started - 1000) == 0.0  # past the deadline
    args.deadline_s = None
    assert train_dflash._train_budget(args, started) == 10.0


def test_holdout_keeps_the_last_train_questions_for_evaluation(tmp_path):
    """`--holdout N`: training never sees the last N train questions; evaluation uses them."""
    data = tmp_path / "train.jsonl"
    rows = [{"question": f"q{i}?", "answer": f"a {i}\n#### {i}"} for i in range(12)]
    data.write_text("".join(json.dumps(r) + "\n" for r in rows))
    args = train_args.parse_args(["--smoke", "--data-path", str(data), "--eval-data-path",
                                    str(data), "--num-shots", "2", "--holdout", "3",
                                    "--num-samples", "100", "--eval-num-prompts", "10",
                                    "--out", str(tmp_path / "d")])
    train_q = [p.rsplit("Question: ", 1)[1] for p in run_prompts.train_prompts(args)]
    eval_q = [p.rsplit("Question: ", 1)[1] for p in run_prompts.gsm8k_eval_prompts(args)[0]]
    assert [q.split("?")[0] for q in train_q] == [f"q{i}" for i in range(2, 9)]
    assert [q.split("?")[0] for q in eval_q] == ["q9", "q10", "q11"]


def test_common_prefix_len():
    shots = [5, 6, 7, 8, 9]
    samples = [Sample(shots + [1], [2, 3]), Sample(shots + [1, 4], [2]), Sample([5, 6, 0], [1])]
    assert common_prefix_len(samples[:1]) == 6  # one sample: its whole prompt
    assert common_prefix_len(samples[:2]) == 6
    assert common_prefix_len(samples) == 2
    assert common_prefix_len([samples[0], Sample([4], [1])]) == 0


def test_samples_file_is_xz_when_named_so_and_a_bad_one_is_named(tmp_path):
    samples = [Sample([1, 2, 3], [4, 5]), Sample([1, 2], [6], temperature=0.7)]
    xz, plain = tmp_path / "s.jsonl.xz", tmp_path / "s.jsonl"
    save_samples(samples, xz)
    save_samples(samples, plain)
    assert xz.read_bytes().startswith(b"\xfd7zXZ\x00") and plain.read_text().startswith("{")
    assert load_samples(xz) == samples and load_samples(plain) == samples
    cut, garbled, empty = tmp_path / "cut.jsonl.xz", tmp_path / "g.jsonl", tmp_path / "e.jsonl"
    cut.write_bytes(xz.read_bytes()[:-20])
    garbled.write_text('{"prompt_ids": [1]}\n')
    empty.write_text("")
    for bad, why in [(tmp_path / "absent.jsonl.xz", "no such samples file"),
                     (cut, "not a samples file"), (garbled, "not a samples file \\(KeyError"),
                     (empty, "holds no samples")]:
        with pytest.raises(BadInputError, match=f"^{re.escape(str(bad))}: {why}") as e:
            load_samples(bad)
        assert "\n" not in str(e.value)


def test_the_card_describes_the_samples_read_not_the_flags():
    """A GSM8K-only run given a mixed samples file says so on its card: each source, how it
    was continued and its longest continuation, read from the samples."""
    samples = [Sample([1, 2], [3, 4, 5]), Sample([1, 2], [3, 4], temperature=0.7),
               Sample([7], [8] * 9, source="code"), Sample([9], [1, 2], source="chat")]
    text = describe_data(samples, num_shots=5)
    assert text.startswith("GSM8K train questions in the 5-shot")
    assert ": 1 greedy, 1 sampled at temperature 0.7 (the longest 3 tokens); code tasks" in text
    assert "Python packages: 1 greedy (the longest 9 tokens); chat requests" in text
    assert describe_data(samples[:2], 3).count(";") == 0


def test_the_mix_recipes_shipped_samples():
    """The samples the mix recipe trains on by default, as the H100 generated them
    (`qwen25_coder.sh gen`, 2026-12-05): every prompt of the recipe continued greedily and in
    three sampled passes, within the recipe's token limits and Qwen2.5's vocabulary. (That no
    evaluation prompt is among them needs the real tokenizer: the trainer checks it whenever it
    reads them, and did on the device.)"""
    path = shipped_samples(MIX)
    assert path.stat().st_size < 10_000_000  # the repository keeps it
    samples = load_samples(path)
    recipe = train_args.parse_args(["--recipe", MIX])
    counts = Counter((s.source, s.temperature) for s in samples)
    per_source = {"gsm8k": recipe.num_samples, "code": recipe.code_tasks,
                  "chat": recipe.chat_instructions}
    assert counts == {**{(k, 0.0): n for k, n in per_source.items()},
                      **{(k, 0.7): recipe.sampled_passes * n for k, n in per_source.items()}}
    limit = {"gsm8k": recipe.max_new_tokens, "code": recipe.code_chat_max_new_tokens,
             "chat": recipe.code_chat_max_new_tokens}
    assert all(2 <= len(s.output_ids) <= limit[s.source] for s in samples)
    vocab = PRESETS["qwen2.5-1.5b-shaped"]["vocab_size"]
    assert max(max(s.ids) for s in samples) < vocab
    # each source's greedy pass continues distinct prompts
    for source, n in per_source.items():
        assert len({tuple(s.prompt_ids) for s in samples
                    if s.source == source and s.temperature == 0}) == n


def test_bad_input_stops_in_one_line_naming_the_file(target, tmp_path):
    """A missing samples file for `--phase train`, a missing GSM8K file, training data that
    holds a GSM8K test question: each stops before training with one line naming the file."""
    local_path_or_skip("train")
    test = local_path_or_skip("test")
    common = ["--smoke", "--target", target, "--out", str(tmp_path / "d")]
    missing = tmp_path / "absent.jsonl.xz"
    with pytest.raises(SystemExit, match=rf"^train_dflash: error: {missing}: no such samples "
                                         r"file \(--phase train reads it"):
        train_dflash.main([*common, "--phase", "train", "--samples-file", str(missing)])
    with pytest.raises(SystemExit, match=rf"^train_dflash: error: {missing}: no such file "
                                         r"\(--data-path\)$"):
        train_dflash.main([*common, "--data-path", str(missing)])
    tok = Tokenizer.from_dir(target)
    question = read_jsonl(test)[5]["question"]
    data = tmp_path / "leaky.jsonl.xz"
    save_samples([Sample(tok.encode(build_prompt("", q)), tok.encode(" 7 apples"))
                  for q in ["Tom has 3 apples. How many?", question, question]], data)
    with pytest.raises(SystemExit, match=rf"^train_dflash: error: {data}: sample 1's prompt "
                                         rf"holds evaluation prompt 5 of {test} \("):
        train_dflash.main([*common, "--phase", "train", "--samples-file", str(data)])
    assert not (tmp_path / "d").exists()


def test_mixed_prompts_are_kept_with_their_source_and_checked_against_humaneval(target,
                                                                               tmp_path):
    """`--code-tasks` (the shipped file's first) and `--chat-instructions` add code and chat
    prompts to the smoke run's GSM8K ones; the samples file keeps each sample's source (and a
    mix trains on it whole); a HumanEval prompt among the training prompts stops the run in
    one line naming the file."""
    local_path_or_skip("train")
    local_path_or_skip("test")
    humaneval = tmp_path / "HumanEval.jsonl"
    problem = {"task_id": "T/0", "entry_point": "add", "test": "", "canonical_solution": "",
               "prompt": 'def add(a, b):\n    """Return a + b."""\n'}
    humaneval.write_text(json.dumps(problem) + "\n")
    data = tmp_path / "mix.jsonl.xz"
    common = ["--smoke", "--target", target, "--humaneval-path", str(humaneval),
              "--code-tasks", "4", "--code-tasks-file", str(TASKS_FILE),
              "--chat-instructions", "2", "--samples-file", str(data)]
    assert train_dflash.main([*common, "--phase", "data"]) == data
    samples = load_samples(data)
    sources = [s.source for s in samples]
    # the byte-level tiny target's context leaves out code prompts longer than 1,000 bytes
    assert sources.count("gsm8k") == 6 and 1 <= sources.count("code") <= 4
    assert set(sources) <= {"gsm8k", "code", "chat"}
    tok = Tokenizer.from_dir(target)
    leaky = tmp_path / "leaky.jsonl.xz"
    save_samples(samples + [Sample(tok.encode(problem["prompt"]), tok.encode(" return a"),
                                   source="code")], leaky)
    with pytest.raises(SystemExit, match=rf"^train_dflash: error: {leaky}: sample "
                                         rf"{len(samples)}'s prompt holds evaluation prompt 0 "
                                         rf"of {humaneval} \(prompts\)"):
        train_dflash.main([*common[:-1], str(leaky), "--phase", "train", "--out",
                           str(tmp_path / "d")])


def test_the_gsm8k_recipes_shipped_samples_and_what_the_mix_takes_of_them():
    """The GSM8K recipe's samples, as the H200 generated them (the continuations README's
    sha256): every train question but the shots and the held-out 200, greedy and five sampled
    passes; the mix trains beside its own those of the 4,268 questions it lacks."""
    path = shipped_samples(GSM8K)
    assert path.stat().st_size < 10_000_000
    assert hashlib.sha256(path.read_bytes()).hexdigest() == (
        "f3f41f11b8fac2e6512a41c3c8db98e5368842ebeb32e9fcf3cfd3a0375b5ef1")
    samples = load_samples(path)
    assert Counter(s.temperature for s in samples) == {0.0: 7_268, 0.7: 5 * 7_268}
    assert {s.source for s in samples} == {"gsm8k"}
    extra = new_prompts_only(load_samples(shipped_samples(MIX)), samples)
    assert (len(extra), len({tuple(s.prompt_ids) for s in extra})) == (25_608, 4_268)


def test_the_more_recipes_shipped_samples_are_all_new_prompts_to_the_mix():
    """The second set of code and chat samples, as the H100 generated them (`qwen25_coder.sh
    gen`, 2026-12-08): each of the 3,000 code tasks and 2,000 chat requests continued greedily
    and in three sampled passes, no GSM8K, within the token limits; beside the mix, all train
    but the four of one chat request the target wrote from both seeds ("I'm ready to log in to
    the app!"), which the mix already holds."""
    path = shipped_samples(MIX_MORE)
    assert path.stat().st_size < 10_000_000
    assert hashlib.sha256(path.read_bytes()).hexdigest() == (
        "2355ed64270554fd22cc8ece1e6447b6b3542a60c28f4aa53f596e8fcebe47a8")
    samples = load_samples(path)
    recipe = train_args.parse_args(["--recipe", MIX_MORE])
    per_source = {"code": recipe.code_tasks, "chat": recipe.chat_instructions}
    assert Counter((s.source, s.temperature) for s in samples) == {
        **{(k, 0.0): n for k, n in per_source.items()},
        **{(k, 0.7): recipe.sampled_passes * n for k, n in per_source.items()}}
    assert all(2 <= len(s.output_ids) <= recipe.code_chat_max_new_tokens for s in samples)
    assert len(new_prompts_only(load_samples(shipped_samples(MIX)), samples)) == 19_996


def test_a_mix_without_gsm8k_generates_code_and_chat_only(target, tmp_path):
    """`--num-samples 0` beside code tasks and chat requests (the mix's second prompts): the
    data phase writes no GSM8K sample."""
    local_path_or_skip("train")
    local_path_or_skip("test")
    data = tmp_path / "more.jsonl"
    train_dflash.main(["--smoke", "--target", target, "--num-samples", "0", "--code-tasks", "2",
                       "--code-tasks-file", str(MORE_TASKS_FILE), "--chat-instructions", "1",
                       "--samples-file", str(data), "--phase", "data"])
    sources = Counter(s.source for s in load_samples(data))
    assert sources["gsm8k"] == 0 and sources["code"] >= 1 and sources["chat"] == 1


def test_a_fraction_of_the_prompts_keeps_each_sources_share_and_whole_prompts():
    """`keep_prompt_fraction` on the shipped mix (four passes, each source by source): each
    source keeps the fraction of its samples, a prompt's continuations are kept or left out
    together, the file order stays; 1 keeps everything and a fraction out of (0, 1] is
    refused."""
    samples = load_samples(shipped_samples(MIX))
    whole = Counter(s.source for s in samples)
    for fraction in (0.75, 1 / 3):  # (a third's spacing splits a pass of 8,000 prompts)
        kept = keep_prompt_fraction(samples, fraction)
        share = Counter(s.source for s in kept)
        for source, n in whole.items():
            assert share[source] == pytest.approx(fraction * n, abs=4), source
        prompts = {tuple(s.prompt_ids) for s in kept}
        assert sum(tuple(s.prompt_ids) in prompts for s in samples) == len(kept)
        index = {id(s): i for i, s in enumerate(samples)}
        assert [index[id(s)] for s in kept] == sorted(index[id(s)] for s in kept)
    assert keep_prompt_fraction(samples, 1.0) == samples
    with pytest.raises(ValueError, match=r"fraction must be in \(0, 1\], got 0"):
        keep_prompt_fraction(samples, 0)


def test_sample_fraction_trains_on_that_share_of_a_samples_file(target, tmp_path):
    """`--sample-fraction 0.5` over a read samples file: the draft's card counts half its
    prompts' continuations; out of (0, 1] the flag is refused."""
    local_path_or_skip("train")
    g = torch.Generator().manual_seed(0)
    prompts = [torch.randint(1, 200, (12,), generator=g).tolist() for _ in range(4)]
    samples = [Sample(p, torch.randint(1, 200, (9,), generator=g).tolist())
               for _ in range(2) for p in prompts]  # a greedy and a sampled pass
    data = tmp_path / "samples.jsonl.xz"
    save_samples(samples, data)
    out = tmp_path / "draft"
    train_dflash.main(["--smoke", "--target", target, "--out", str(out), "--num-samples", "8",
                       "--steps", "2", "--samples-file", str(data), "--phase", "train",
                       "--sample-fraction", "0.5", "--num-shots", "0"])
    assert "- Data: 4 continuations" in (out / "README.md").read_text()
    for bad in ("0", "1.5"):
        with pytest.raises(SystemExit):
            train_args.parse_args(["--sample-fraction", bad])


def test_extra_samples_files_train_beside_the_samples_file(target, tmp_path, caplog,
                                                           monkeypatch):
    """`--extra-samples-file`: its samples of prompts the samples file lacks are trained
    beside that file's (the card counts both), those of prompts it has are left out (another
    greedy pass would repeat them), the held-out sequences are drawn among the file's
    prompts; a missing extra file, and one holding an evaluation prompt, stop in one line
    naming it."""
    drawn, real = [], trainer_module.held_out_index
    monkeypatch.setattr(trainer_module, "held_out_index", lambda *a: drawn.append(
        (len(a[0]), a[3], real(*a))) or drawn[-1][2])
    local_path_or_skip("train")
    test = local_path_or_skip("test")
    g = torch.Generator().manual_seed(0)

    def passes(prompts: list[list[int]]) -> list[Sample]:  # a greedy and a sampled pass
        return [Sample(p, torch.randint(1, 200, (9,), generator=g).tolist())
                for _ in range(2) for p in prompts]

    prompts = [torch.randint(1, 200, (12,), generator=g).tolist() for _ in range(7)]
    data, extra = tmp_path / "samples.jsonl.xz", tmp_path / "extra.jsonl.xz"
    save_samples(passes(prompts[:4]), data)
    save_samples(passes(prompts[2:]), extra)  # two of the file's prompts, three new ones
    out = tmp_path / "draft"
    common = ["--smoke", "--target", target, "--steps", "2", "--samples-file", str(data),
              "--phase", "train", "--num-shots", "0", "--num-samples", "8"]
    with caplog.at_level(logging.INFO, logger="train_dflash"):
        train_dflash.main([*common, "--out", str(out), "--extra-samples-file", str(extra),
                           "--val-samples", "2"])
    assert "- Data: 14 continuations" in (out / "README.md").read_text()
    (sequences, among, held), = drawn
    assert (sequences, among, len(held)) == (14, 4, 2) and max(held) < 8
    assert f"{extra}: 10 samples, 6 of prompts not seen before" in caplog.text
    missing = tmp_path / "absent.jsonl"
    with pytest.raises(SystemExit, match=rf"^train_dflash: error: {missing}: no such samples "
                                         r"file \(--extra-samples-file\)$"):
        train_dflash.main([*common, "--out", str(out), "--extra-samples-file", str(missing)])
    tok = Tokenizer.from_dir(target)
    leaky = tmp_path / "leaky.jsonl.xz"
    save_samples([Sample(tok.encode(build_prompt("", read_jsonl(test)[3]["question"])),
                         tok.encode(" 7"))], leaky)
    with pytest.raises(SystemExit, match=rf"^train_dflash: error: {leaky}: sample 0's prompt "
                                         rf"holds evaluation prompt 3 of {test} \("):
        train_dflash.main([*common, "--out", str(tmp_path / "d2"),
                           "--extra-samples-file", str(leaky)])
    assert not (tmp_path / "d2").exists()


def test_new_prompts_only_keeps_the_samples_of_unseen_prompts_in_order():
    seen = [Sample([1, 2], [3, 4]), Sample([5], [6, 7])]
    more = [Sample([5], [8, 9]), Sample([1, 2, 3], [4, 4]), Sample([1, 2], [9, 9]),
            Sample([1, 2, 3], [5, 5], temperature=0.7)]
    assert new_prompts_only(seen, more) == [more[1], more[3]]
    assert new_prompts_only([], more) == more


def test_sampled_continuations_are_seeded(target):
    engine = Engine(model_path=target, device="cpu", max_total_tokens=2048,
                    max_running_requests=4)
    prompts = ["Question: Tom has 3 apples.", "12 + 30 ="]
    greedy = generate_samples(engine, prompts, 12)
    sampled = generate_samples(engine, prompts, 12, temperature=1.0, seed=5)
    again = generate_samples(engine, prompts, 12, temperature=1.0, seed=5)
    other = generate_samples(engine, prompts, 12, temperature=1.0, seed=6)
    assert [s.prompt_ids for s in sampled] == [s.prompt_ids for s in greedy]
    assert [s.output_ids for s in sampled] == [s.output_ids for s in again]
    assert [s.output_ids for s in sampled] != [s.output_ids for s in greedy]
    assert [s.output_ids for s in sampled] != [s.output_ids for s in other]


def test_time_budget_shortens_the_schedule(target):
    tr, _, draft, reqs, aux = _setup(target, num_layers=1)
    data = _sequence_set(reqs, aux)
    trainer = Trainer(draft, tr.model.get_input_embeddings(), tr.model.lm_head_weight,
                      MASK_TOKEN_ID, TrainConfig(steps=10_000, batch_size=2, anchors_per_seq=2))
    stats = trainer.fit(data, time_budget_s=0.0)  # only the timed probe steps fit
    assert stats["steps"] == BUDGET_PROBE_STEPS
    assert trainer.lr == pytest.approx(0.0, abs=1e-12)  # the cosine ended at the last step


@pytest.mark.parametrize("steps", [12, 7])
def test_profile_logs_where_a_step_goes(target, caplog, steps):
    """`profile_steps`: the steps after the warm-up ones run under torch.profiler and one
    log line gives the wall time a step took and the ops by self time; a run that ends
    inside the profiled steps still logs them."""
    tr, _, draft, reqs, aux = _setup(target, num_layers=1)
    data = _sequence_set(reqs, aux)
    trainer = Trainer(draft, tr.model.get_input_embeddings(), tr.model.lm_head_weight,
                      MASK_TOKEN_ID, TrainConfig(steps=steps, batch_size=2, anchors_per_seq=2,
                                                 profile_steps=4))
    with caplog.at_level(logging.INFO, logger="sglang_aux.tools.dflash_training.step_profile"):
        trainer.fit(data)
    lines = [r.getMessage() for r in caplog.records if "profile of" in r.getMessage()]
    assert len(lines) == 1
    profiled = min(4, steps - BUDGET_WARMUP_STEPS)
    assert lines[0].startswith(f"profile of {profiled} steps: ")
    assert "Self CPU" in lines[0] and "aten::mm" in lines[0]
    with pytest.raises(ValueError, match="profile_steps must be >= 0, got -1"):
        TrainConfig(profile_steps=-1)


def test_device_busy_counts_each_kernel_once():
    """An op's self device time repeats its kernels' (the H100's first profile read 120.8 ms
    busy where its table's total was 59.5): only the kernels' own events count, and neither
    a CPU op nor a user annotation on the device adds to them."""
    from types import SimpleNamespace

    from torch.autograd import DeviceType

    def event(device, us, annotation=False):
        return SimpleNamespace(device_type=device, self_device_time_total=us,
                               is_user_annotation=annotation)

    events = [event(DeviceType.CPU, 300.0), event(DeviceType.CUDA, 200.0),
              event(DeviceType.CUDA, 100.0), event(DeviceType.CUDA, 50.0, annotation=True),
              event(DeviceType.CPU, 0.0)]
    assert device_busy_us(events) == 300.0
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as prof:
        torch.ones(64, 64) @ torch.ones(64, 64)
    assert device_busy_us(prof.key_averages()) == 0.0  # a CPU run launches no kernel


def _timed_trainer(target: str, monkeypatch, slow_steps: int, slow_s: float, fast_s: float,
                   **cfg) -> tuple[Trainer, SequenceSet]:
    """A trainer whose steps only sleep (and count): the first `slow_steps` for `slow_s`, the
    rest `fast_s`; and data for it. `cfg`: TrainConfig fields over 100,000 steps."""
    tr, _, draft, reqs, aux = _setup(target, num_layers=1)
    data = _sequence_set(reqs, aux)
    trainer = Trainer(draft, tr.model.get_input_embeddings(), tr.model.lm_head_weight,
                      MASK_TOKEN_ID, TrainConfig(**{"steps": 100_000, "batch_size": 2,
                                                    "anchors_per_seq": 2, **cfg}))
    calls = []

    def timed_step(batch, anchors):
        calls.append(1)
        time.sleep(slow_s if len(calls) <= slow_steps else fast_s)
        trainer.num_steps += 1  # as a step does: `fit` counts steps by it
        return {"loss": 1.0, "accept": 1.0, "acc": [0.0] * (BLOCK - 1)}

    monkeypatch.setattr(trainer, "step", timed_step)
    return trainer, data


def test_time_budget_paces_after_the_warm_up_steps(target, monkeypatch):
    """Slow first steps (allocations, kernel selection) do not set the pace: 5 steps of 0.2 s
    then 0.01 s each fit ~55 steps in 1.5 s, where pacing from the start would fit ~26."""
    trainer, data = _timed_trainer(target, monkeypatch, BUDGET_WARMUP_STEPS, 0.2, 0.01)
    stats = trainer.fit(data, time_budget_s=1.5)
    assert 40 <= stats["steps"] <= 60, stats["steps"]


def test_time_budget_repaces_when_the_steps_speed_up(target, monkeypatch):
    """Steps 5..20 of 0.03 s would fit 20 + 2.4 / 0.03 = 100 steps into a 3 s budget; the
    pace is set again every BUDGET_REPACE_EVERY steps, so steady 1 ms steps fill the budget
    (on the H200 the probe's steps were 6x slower than the steady ones)."""
    trainer, data = _timed_trainer(target, monkeypatch, BUDGET_PROBE_STEPS, 0.03, 0.001)
    start = time.perf_counter()
    stats = trainer.fit(data, time_budget_s=3.0)
    assert stats["steps"] > 4 * 100, stats["steps"]
    assert time.perf_counter() - start < 3.0 + 1.0  # and it still ends near the budget


@pytest.mark.parametrize("fill", [False, True])
def test_fill_budget_trains_past_steps_while_the_time_holds(target, monkeypatch, fill):
    """`fill_budget`: 1 ms steps in a 1 s budget run some 900 steps where `steps` says 50;
    without it the budget only ever shortens the schedule."""
    trainer, data = _timed_trainer(target, monkeypatch, 0, 0.0, 0.001, steps=50,
                                   fill_budget=fill)
    start = time.perf_counter()
    stats = trainer.fit(data, time_budget_s=1.0)
    if fill:
        assert stats["steps"] > 300, stats["steps"]
        assert time.perf_counter() - start < 1.0 + 0.5
    else:
        assert stats["steps"] == 50


def test_snapshots_are_taken_every_so_many_seconds_of_training(target, monkeypatch):
    """`snapshot_every_s`: 60 steps of 10 ms with a snapshot every 0.1 s call it after the first
    step 0.1 s or more past the last one (about six times), with the training's seconds so
    far; at 0 it is called after every step."""
    trainer, data = _timed_trainer(target, monkeypatch, 0, 0.0, 0.01, steps=60)
    taken = []
    stats = trainer.fit(data, snapshot=lambda s: taken.append((trainer.num_steps, s)),
                        snapshot_every_s=0.1)
    steps, seconds = zip(*taken, strict=True)
    assert 1 <= len(taken) <= stats["train_seconds"] / 0.1, (taken, stats["train_seconds"])
    assert seconds[0] >= 0.1 and all(b - a >= 0.1 for a, b in itertools.pairwise(seconds))
    assert list(steps) == sorted(set(steps)) and steps[-1] <= 60
    trainer, data = _timed_trainer(target, monkeypatch, 0, 0.0, 0.0, steps=20)
    taken = []
    trainer.fit(data, snapshot=lambda s: taken.append(trainer.num_steps), snapshot_every_s=0)
    assert taken == list(range(1, 21))


def test_fill_budget_needs_a_time_budget_and_no_resume(capsys):
    for argv in (["--fill-budget"], ["--fill-budget", "--deadline-s", "60", "--resume"]):
        with pytest.raises(SystemExit):
            train_args.parse_args(argv)
        assert "--fill-budget needs --deadline-s or --train-budget-s, and no --resume" in (
            capsys.readouterr().err)
    args = train_args.parse_args(["--fill-budget", "--train-budget-s", "60"])
    assert args.fill_budget and args.train_budget_s == 60


def test_held_out_prompts_are_whole():
    """`held_out_index` holds whole prompts out: every continuation of a held-out prompt (the
    greedy one and the sampled ones), none trained on, until `val_samples` sequences; with one
    sequence a prompt, the seed's own `val_samples` of them."""
    singles = list(range(10))
    assert held_out_index(singles, 3, 0) == held_out_index(singles, 3, 0) != held_out_index(
        singles, 3, 1)
    assert len(set(held_out_index(singles, 3, 0))) == 3 and held_out_index(singles, 0, 0) == []
    with pytest.raises(ValueError, match="val_samples 2 leaves none of the 2 sequences"):
        held_out_index([0, 1], 2, 0)
    with pytest.raises(ValueError, match="val_samples 1 leaves none of the 2 sequences"):
        held_out_index([0, 0], 1, 0)  # one prompt: holding it out holds out both
    samples = _samples_of_repeated_prompts()
    prompts, groups = [s.prompt_ids for s in samples], prompt_groups(samples)
    assert groups == [0, 0, 0, 0, 1, 1, 1, 1, 2, 2, 2, 2, 3, 3, 3, 3, 4, 4, 4, 4]
    data = SequenceSet(samples, [torch.zeros(len(s.ids), 4) for s in samples],
                       torch.device("cpu"))
    assert data.prompt_groups == groups  # what training holds out by
    for seed in range(5):
        held = held_out_index(groups, 5, seed)
        assert len(held) == 8  # two whole prompts: 5 sequences need a second one
        assert {tuple(prompts[i]) for i in held} == {
            tuple(p) for i, p in enumerate(prompts) if groups[i] in {groups[j] for j in held}}
        trained = set(range(len(groups))) - set(held)
        assert not {groups[i] for i in held} & {groups[i] for i in trained}


def test_held_out_prompts_drawn_among_the_first_stay_when_more_prompts_follow():
    """`among`: the held-out sequences are drawn among the first prompts only, the same
    whatever prompts follow (an extra samples file's); drawn among all, they change."""
    first = prompt_groups(_samples_of_repeated_prompts())  # 5 prompts, 4 sequences each
    more = first + [5, 5, 6, 6, 7, 7, 8, 8, 9, 9]
    moved = 0
    for seed in range(6):
        held = held_out_index(first, 5, seed)
        assert held_out_index(more, 5, seed, among=5) == held
        moved += held_out_index(more, 5, seed) != held
    assert moved
    # every first prompt held out: the following ones are still trained on
    assert held_out_index(first + [5], 20, 0, among=5) == list(range(20))


def _samples_of_repeated_prompts() -> list[Sample]:
    """Five prompts, four continuations each (greedy and three sampled), in the order the
    generation writes them: every prompt's together."""
    return [Sample([7, p, p + 1], [p + k, p + k + 1, 3]) for p in range(5) for k in range(4)]


def test_held_out_sequences_are_never_trained_and_measured_as_it_trains(target, monkeypatch):
    """`val_samples`: the seed's own choice of sequences is never drawn for a step; their
    objective (the same anchors each time) is measured every `val_every` steps and at the end,
    and a checkpoint carries the curve. With none held out, the data order is the one before
    held-out sequences existed (every index drawn straight from the generator)."""
    tr, _, draft, reqs, aux = _setup(target, num_layers=1)
    data = _sequence_set(reqs, aux)
    assert sorted(set(data.prompt_groups)) == list(range(len(data)))  # a prompt each
    start = {k: v.clone() for k, v in draft.state_dict().items()}
    drawn, real = [], SequenceSet.batch
    monkeypatch.setattr(SequenceSet, "batch", lambda self, index, *a: drawn.append(
        list(index)) or real(self, index, *a))
    args = (draft, tr.model.get_input_embeddings(), tr.model.lm_head_weight, MASK_TOKEN_ID)
    trainer = Trainer(*args, TrainConfig(steps=7, batch_size=2, anchors_per_seq=4, log_every=7,
                                         val_samples=1, val_every=3))
    trainer.fit(data)
    (held,) = held_out_index(data.prompt_groups, 1, 0)
    steps = [d for d in drawn if d != [held]]
    assert len(steps) == 7 and all(held not in d for d in steps)
    assert [p["step"] for p in trainer.val_curve] == [3, 6, 7]
    assert all(p["accept"] >= 1 and p["loss"] > 0 for p in trainer.val_curve)
    assert trainer.val_curve[0]["loss"] != trainer.val_curve[-1]["loss"]  # it trained
    again = trainer.validate(data, [held])  # the same anchors: the same figures
    assert (again["loss"], again["accept"]) == (trainer.val_curve[-2]["loss"],
                                                trainer.val_curve[-2]["accept"])
    resumed = Trainer(*args, TrainConfig(val_samples=1))
    resumed.load_state_dict(trainer.state_dict())
    assert resumed.val_curve == trainer.val_curve
    # none held out: every index as the generator draws it, as before
    draft.load_state_dict(start)
    drawn.clear()
    Trainer(*args, TrainConfig(steps=3, batch_size=2, anchors_per_seq=4)).fit(data)
    fitted, g, expected = list(drawn), torch.Generator().manual_seed(0), []
    for _ in range(3):
        expected.append(torch.randint(len(data), (2,), generator=g).tolist())
        sample_anchors(data.batch(expected[-1]), 4, g)
    assert fitted == expected


def test_smoke_run_holds_sequences_out_and_cards_their_curve(target, tmp_path):
    local_path_or_skip("train")
    out = tmp_path / "draft"
    train_dflash.main(["--smoke", "--target", target, "--out", str(out), "--num-samples", "6",
                       "--steps", "8", "--val-samples", "2", "--val-every", "4"])
    card = (out / "README.md").read_text()
    line = next(x for x in card.splitlines() if x.startswith("- Held out of training: 2 "))
    assert line.count(" at ") == 2 and line.endswith(" at 8."), line
    assert "2 of the sequences (every continuation of 2 prompts)" in line
    assert json.loads((out / TRAINING_RECORD).read_text())["kept_step"] == 8
    # --keep-best: the card and the record name the validation whose weights were written
    train_dflash.main(["--smoke", "--target", target, "--out", str(out), "--num-samples", "6",
                       "--steps", "8", "--val-samples", "2", "--val-every", "4", "--keep-best"])
    line = next(x for x in (out / "README.md").read_text().splitlines()
                if x.startswith("- Held out of training: 2 "))
    kept = json.loads((out / TRAINING_RECORD).read_text())["kept_step"]
    assert kept in (4, 8) and line.endswith(
        f" at 8. The weights written are step {kept}'s, the best of the curve."), line
    with pytest.raises(SystemExit):
        train_args.parse_args(["--smoke", "--val-every", "0"])
    # more held out than there are sequences: one line before the features are extracted
    with pytest.raises(SystemExit, match=r"--val-samples 99 leaves none of the \d+ trainable"):
        train_dflash.main(["--smoke", "--target", target, "--out", str(tmp_path / "x"),
                           "--num-samples", "6", "--val-samples", "99"])


def test_smoke_run_writes_a_draft_the_engine_runs_losslessly(target, tmp_path):
    local_path_or_skip("train")
    local_path_or_skip("test")
    out = tmp_path / "draft"
    samples_file = tmp_path / "samples.jsonl.xz"
    train_dflash.main(["--smoke", "--target", target, "--out", str(out), "--num-samples", "4",
                       "--steps", "8", "--eval", "--sampled-passes", "1",
                       "--samples-file", str(samples_file), "--token-map-size", "64"])
    written = load_samples(samples_file)
    assert len(written) == 8  # greedy, then one sampled pass over the same prompts
    assert [s.prompt_ids for s in written[:4]] == [s.prompt_ids for s in written[4:]]
    config = json.loads((out / "config.json").read_text())
    assert config["architectures"] == ["DFlashDraftModel"]
    assert config["dflash_config"] == {"target_layer_ids": [0, 3], "block_size": 4,
                                       "mask_token_id": MASK_TOKEN_ID, "target_hidden_size": 64}
    card = (out / "README.md").read_text()
    assert "4 greedy, 4 sampled at temperature 0.7" in card
    assert "--smoke" in card and "Held-out accept length: not measured" not in card
    # the draft vocabulary beside it: the 64 ids its continuations write most, the end token
    # kept whether or not they write it, and the draft still lossless under it
    ids = load_token_map(str(out / "freq_64.pt"), PRESETS["tiny-llama"]["vocab_size"])
    eos = PRESETS["tiny-llama"]["eos_token_id"]
    assert len(ids) == 64 and ids[0] == eos
    assert ids[1:].tolist() == [t for t in hot_ids(written, 65) if t != eos][:63]
    share, _ = coverage(written, ids.tolist())
    assert "Draft vocabulary: `freq_64.pt`, the 64 token ids" in card and f"{share:.2%}" in card
    _assert_lossless(target, out)
    _assert_lossless(target, out, speculative_token_map=str(out / "freq_64.pt"))


def test_a_draft_trained_over_its_vocabulary_is_served_with_it(target, tmp_path, capsys):
    """`--train-over-token-map`: the config names the map, a server reads it with the draft
    (its LM head cut to the 64 rows) unless --speculative-token-map names another, and the
    draft stays lossless; bad combinations stop before any model loads."""
    local_path_or_skip("train")
    out = tmp_path / "draft"
    common = ["--smoke", "--target", target, "--num-samples", "4", "--steps", "4"]
    train_dflash.main([*common, "--out", str(out), "--token-map-size", "64",
                       "--train-over-token-map"])
    config = json.loads((out / "config.json").read_text())
    assert config["dflash_config"]["token_map"] == "freq_64.pt"
    assert "The draft was trained over it" in (out / "README.md").read_text()
    kw = dict(model_path=target, speculative_algorithm="DFLASH",
              speculative_draft_model_path=str(out), device="cpu", max_total_tokens=2048,
              max_running_requests=2)
    engine = Engine(**kw)
    draft = engine.worker.draft_runner.model
    assert torch.equal(draft.lm_head_weight,
                       engine.worker.target_runner.model.lm_head_weight[
                           torch.load(out / "freq_64.pt")])
    other = tmp_path / "other.pt"
    torch.save(torch.arange(100), other)
    assert Engine(**kw, speculative_token_map=str(other)).worker.draft_runner.model \
        .lm_head_weight.shape[0] == 100
    _assert_lossless(target, out)
    with pytest.raises(SystemExit):
        train_dflash.main([*common, "--out", str(tmp_path / "d"), "--token-map-size", "0",
                           "--train-over-token-map"])
    assert "trains the draft over its --token-map-size ids (not 0" in capsys.readouterr().err
    with pytest.raises(SystemExit, match=r"the target's 320 ids need no draft vocabulary of "
                                         r"32768"):
        train_dflash.main([*common, "--out", str(tmp_path / "e"), "--train-over-token-map"])


def test_only_a_generating_engine_captures_graphs(target, tmp_path, monkeypatch):
    """A run that generates its samples captures graphs for the generation; a run that reads
    them (its feature pass is eager) and the evaluation after it capture none, and the reading
    run's K/V holds what the feature pass holds at once, not a generating batch's."""
    local_path_or_skip("train")
    local_path_or_skip("test")
    from sglang_aux.tools.dflash_training import evaluate

    captured: list[tuple[bool, int]] = []
    kv_tokens: list[int] = []

    class SpyEngine(Engine):
        def __init__(self, **kwargs):
            super().__init__(**kwargs)
            runner = self.worker.model_runner
            captured.append(("speculative_algorithm" in kwargs,
                             sum(len(g.layouts) for g in runner.graph_runners.values())))
            kv_tokens.append(runner.token_to_kv_pool_allocator.size)

    monkeypatch.setattr(train_dflash, "Engine", SpyEngine)
    monkeypatch.setattr(evaluate, "Engine", SpyEngine)
    samples, out = tmp_path / "samples.jsonl.xz", tmp_path / "draft"
    common = ["--smoke", "--target", target, "--out", str(out), "--num-samples", "2",
              "--steps", "2", "--samples-file", str(samples)]
    train_dflash.main(common)
    assert len(captured) == 1 and not captured[0][0] and captured[0][1] > 0
    train_dflash.main([*common, "--eval", "--eval-num-prompts", "1"])
    assert captured[1:] == [(False, 0), (True, 0)]
    smoke = SMOKE_DEFAULTS  # context 1,024, a generating batch of 8
    assert kv_tokens[:2] == [smoke["gen_batch"] * smoke["context_length"],
                             features.MAX_FORWARD_TOKENS + smoke["context_length"]]


def test_eval_measures_accept_on_each_kind_of_prompt(target, tmp_path, caplog):
    """`--eval-tasks gsm8k humaneval chat`: one engine, an accept length per kind, all on the
    card's held-out line; HumanEval and chat answers run to --code-chat-max-new-tokens."""
    local_path_or_skip("train")
    local_path_or_skip("test")
    humaneval = tmp_path / "HumanEval.jsonl"
    problems = [{"task_id": f"T/{i}", "entry_point": "f", "test": "", "canonical_solution": "",
                 "prompt": f'def f(x):\n    """Return x + {i}."""\n'} for i in range(3)]
    humaneval.write_text("".join(json.dumps(p) + "\n" for p in problems))
    out = tmp_path / "draft"
    train_dflash.main(["--smoke", "--target", target, "--out", str(out), "--num-samples", "4",
                       "--steps", "4"])
    caplog.set_level(logging.INFO)
    train_dflash.main(["--smoke", "--target", target, "--out", str(out), "--eval-only",
                       "--eval-tasks", "gsm8k", "humaneval", "chat", "--eval-num-prompts", "2",
                       "--humaneval-path", str(humaneval), "--max-new-tokens", "8",
                       "--code-chat-max-new-tokens", "12"])
    logged = [r.getMessage() for r in caplog.records if r.getMessage().startswith("eval: ")]
    assert [m.split(":")[1].strip() for m in logged] == ["gsm8k", "humaneval", "chat"]
    line = next(x for x in (out / "README.md").read_text().splitlines()
                if x.startswith(EVAL_LINE))
    parts = line.removeprefix(EVAL_LINE).split("; ")
    assert len(parts) == 3
    assert "on 2 held-out GSM8K prompts" in parts[0] and "at most 8 new tokens" in parts[0]
    assert "on 2 HumanEval prompts as completions (`HumanEval.jsonl`)" in parts[1]
    assert "on 2 chat prompts" in parts[2] and "at most 12 new tokens" in parts[2]
    for part in parts:  # an accept length of at least one token per step leads each part
        assert float(part.split()[0]) >= 1.0
    # the draft's acceptance profile: every kind's verify steps, which a server reads with
    # --speculative-acceptance-profile draft
    doc = json.loads((out / DRAFT_PROFILE).read_text())
    assert sorted(doc["per_task"]) == ["chat", "gsm8k", "humaneval"]
    assert doc["verify_width"] == 4 and len(doc["accept_histogram"]) == 4
    assert doc["accept_histogram"] == [sum(h[a] for h in doc["per_task"].values())
                                       for a in range(4)]
    assert sum(doc["accept_histogram"]) > 0 and doc["source"].startswith("train_dflash --eval")
    engine = Engine(model_path=target, speculative_algorithm="DFLASH",
                    speculative_draft_model_path=str(out), device="cpu", max_total_tokens=4096,
                    max_running_requests=4, speculative_acceptance_profile="draft")
    info = engine.worker.server_info()["speculative_draft_len_schedule"]
    assert info["source"] == "derived" and info["acceptance_prior"] == str(out / DRAFT_PROFILE)
    engine.shutdown()
    # given no profile flag, a static server derives its schedule from the draft's own;
    # `none` keeps the full width
    for flag, source, prior in ((None, "derived", str(out / DRAFT_PROFILE)),
                                ("none", "static verify: full width", None)):
        engine = Engine(model_path=target, speculative_algorithm="DFLASH",
                        speculative_draft_model_path=str(out), device="cpu",
                        max_total_tokens=4096, max_running_requests=4,
                        speculative_acceptance_profile=flag)
        info = engine.worker.server_info()["speculative_draft_len_schedule"]
        assert (info["source"], info.get("acceptance_prior")) == (source, prior), flag
        engine.shutdown()


def _assert_lossless(target: str, draft: Path, algorithm: str = "DFLASH", **spec_kw) -> None:
    """Greedy DFlash (or `algorithm`) with the draft at `draft` gives the target-only
    tokens."""
    common = dict(device="cpu", max_total_tokens=4096, max_running_requests=4)
    prompts = ["Question: Tom has 3 apples.", "12 + 30 =", "The quick brown"]
    params = {"temperature": 0, "max_new_tokens": 16, "ignore_eos": True}
    ref = Engine(model_path=target, **common).generate(prompts, params)
    spec = Engine(model_path=target, speculative_algorithm=algorithm,
                  speculative_draft_model_path=str(draft), **common, **spec_kw).generate(
        prompts, params)
    for r, s in zip(ref, spec, strict=True):
        assert s["output_ids"] == r["output_ids"]
        assert s["meta_info"]["spec_verify_ct"] > 0


def test_qwen2_target_with_block_16(tmp_path):
    """The Qwen2.5-Coder recipe's shape on CPU: a Qwen2 target (transformers' own checkpoint,
    rope in `rope_parameters`) and a block-16 draft, trained and served losslessly."""
    pytest.importorskip("transformers", reason="the target is saved by transformers")
    local_path_or_skip("train")
    target, out = save_tiny_qwen2(tmp_path / "qwen2"), tmp_path / "draft"
    train_dflash.main(["--smoke", "--target", target, "--out", str(out), "--num-samples", "4",
                       "--steps", "4", "--block-size", "16", "--num-layers", "2",
                       "--num-aux-layers", "3"])
    config = json.loads((out / "config.json").read_text())
    assert config["dflash_config"]["block_size"] == 16
    assert config["dflash_config"]["target_layer_ids"] == [0, 1, 2]
    assert config["rope_parameters"] == json.loads(
        (Path(target) / "config.json").read_text())["rope_parameters"]
    # a vocabulary of 32,768 ids or fewer has no draft vocabulary to ship
    assert config["vocab_size"] <= 32768 and not list(out.glob("freq_*.pt"))
    assert "Draft vocabulary" not in (out / "README.md").read_text()
    _assert_lossless(target, out)


def test_mask_token_choice(target):
    tok = Engine(model_path=target, device="cpu", max_total_tokens=1024).tokenizer
    assert train_args.resolve_mask_token(tok, None) == ("<|mask|>", MASK_TOKEN_ID)
    assert train_args.resolve_mask_token(tok, "7")[1] == 7
    with pytest.raises(ValueError, match="single-token"):
        train_args.resolve_mask_token(tok, "two tokens")
    # a vocabulary without <|mask|> (Qwen2.5's) falls back to its fill-in-the-middle padding
    alphabet = sorted(pre_tokenizers.ByteLevel.alphabet())
    qwen_like = tokenizers.Tokenizer(models.BPE({c: i for i, c in enumerate(alphabet)}, []))
    qwen_like.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    qwen_like.add_special_tokens(["<|endoftext|>", "<|fim_pad|>"])
    assert train_args.resolve_mask_token(Tokenizer(qwen_like, {}), None) == ("<|fim_pad|>", 257)


if __name__ == "__main__":
    sys.exit(pytest.main([__file__, "-q"]))
