"""Does the CPU suite catch one-line breakage of central logic? Each mutation below is applied to
a temporary copy of the tree (the working tree is never touched, even on Ctrl-C), the test
files that should catch it run there with `-x`, and the mutation counts as caught when they
fail. Exit status 1 when any mutation is not caught (or no longer applies).

    python scripts/mutation_check.py [--jobs 2] [--only NAME ...] [--list]
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from concurrent.futures import ThreadPoolExecutor, wait
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
SRT = "python/sglang_aux/srt"
COPIED = ("python", "test", "benchmark", "scripts", "pyproject.toml")
T = "test/registered"
LAW = f"{T}/speculative/test_dflash_info_law.py"
ENGINE_LAW = f"{T}/speculative/test_acceptance_law.py"
WORKER = f"{T}/speculative/test_dflash_worker.py"
TAPS = f"{T}/compat/test_aux_taps_hf.py"
PENALTIES = f"{T}/sampling/test_penalties.py"
GRAMMAR = f"{T}/constrained/test_structured_output.py"
# the worker's tests that read the draft context and the bookkeeping back (its greedy ones
# start four engines first)
CONTEXT = f"{WORKER}::test_aux_rows_consumed_before_next_target_forward"
KNOWN = f"{WORKER}::test_acceptance_under_known_proposals"
DSPARK_KNOWN = f"{T}/speculative/test_dspark_worker.py::test_acceptance_under_known_proposals"
STOP = threading.Event()  # set on Ctrl-C: no new runs; running ones are terminated
RUNNING: set[subprocess.Popen] = set()


@dataclass(frozen=True)
class Mutation:
    name: str
    path: str  # relative to the repository root
    old: str  # must occur exactly once
    new: str
    tests: tuple[str, ...]  # files (or node ids) that must fail


MUTATIONS = [
    # sampling tails in slices / without the logits copy
    Mutation("sample_from_probs: every slice draws with the first slice's uniforms",
             f"{SRT}/sampling/sampler.py",
             "target = u[s:s + step, ..., None]", "target = u[:len(cdf), ..., None]",
             (f"{T}/sampling/test_sampler.py",)),
    Mutation("DSpark's Markov loop leaves its distributions out of the verify storage",
             f"{SRT}/speculative/dspark_proposal.py",
             "else probs_out if probs_out is not None else torch.empty(",
             "else torch.empty(",
             (f"{T}/speculative/test_dspark_proposal.py::"
              "test_distributions_go_into_a_given_view",)),
    Mutation("a narrower step's draft laws are read from each request's whole rows",
             f"{SRT}/speculative/draft_proposals.py",
             "return self.probs[: bs * n].view(bs, n, self.probs.shape[1])",
             "return self.probs[: bs * full].view(bs, full, -1)[:, :n]",
             (f"{T}/speculative/test_draft_proposals.py::"
              "test_sampled_drafts_and_their_distributions_line_up",)),
    # draft training: the sliced LM-head loss (its gradient is handed on in the caller's
    # backward; parameters read inside get theirs during the objective)
    Mutation("sliced loss: the slices' gradients are not handed on to the draft",
             "python/sglang_aux/tools/dflash_training/sliced_loss.py",
             "return total + (handed_on - handed_on.detach()), stats", "return total, stats",
             (f"{T}/speculative/test_sliced_loss.py",)),
    # a recipe search's variants share the features of one set of target layers
    Mutation("the kept features ignore which target layers a variant reads",
             "python/sglang_aux/tools/train_dflash.py",
             "args.sample_fraction, args.num_aux_layers,",
             "args.sample_fraction,",
             (f"{T}/speculative/test_dflash_recipe_search.py::"
              "test_variants_share_the_features_and_train_as_alone",)),
    Mutation("pinned feature rows ignore the host's margin",
             "python/sglang_aux/tools/dflash_training/features.py",
             "if available is not None and available - nbytes < HOST_MARGIN_BYTES:",
             "if available is not None and available < nbytes:",
             (f"{T}/speculative/test_train_dflash.py::"
              "test_rows_past_the_hosts_memory_stop_in_one_line_before_pinning",)),
    Mutation("an engine that reads its samples captures graphs it never replays",
             "python/sglang_aux/tools/train_dflash.py",
             "**(_feature_engine_args(args) if loaded else _engine_args(args, args.gen_batch)))",
             "**_engine_args(args, args.gen_batch))",
             (f"{T}/speculative/test_train_dflash.py::"
              "test_only_a_generating_engine_captures_graphs",)),
    Mutation("a nested frozen-heap block unfreezes the heap as it ends",
             f"{SRT}/model_executor/runner_utils/frozen_gc.py",
             "    if _depth:\n        _depth += 1",
             "    if False:\n        _depth += 1",
             (f"{T}/model_executor/test_frozen_gc.py",)),
    Mutation("a frozen-heap block thaws what was frozen before it",
             f"{SRT}/model_executor/runner_utils/frozen_gc.py",
             "        if thaw:\n            gc.unfreeze()",
             "        if True:\n            gc.unfreeze()",
             (f"{T}/model_executor/test_frozen_gc.py",)),
    Mutation("the Markov kernel's ties go to the largest index",
             f"{SRT}/speculative/markov_argmax_kernel.py",
             "    take = top > best\n",
             "    take = top >= best\n",
             (f"{T}/speculative/test_markov_argmax_kernel.py",)),
    Mutation("the Markov kernel's second proposal reads the anchor again",
             f"{SRT}/speculative/markov_argmax_kernel.py",
             "FIRST=k == 0, SWEEP=sweep,",
             "FIRST=k <= 1, SWEEP=sweep,",
             (f"{T}/speculative/test_markov_argmax_kernel.py",)),
    Mutation("the Markov kernel drops a batch's last, partial row block",
             f"{SRT}/speculative/markov_argmax_kernel.py",
             "    row_blocks = triton.cdiv(bs, tile.rows)",
             "    row_blocks = max(1, bs // tile.rows)",
             (f"{T}/speculative/test_markov_argmax_kernel.py",)),
    Mutation("the Markov kernel's pipelined loop skips its chunk's last tile",
             f"{SRT}/speculative/markov_argmax_kernel.py",
             "            for s in range(NSUB):",
             "            for s in range(NSUB - 1):",
             (f"{T}/speculative/test_markov_argmax_kernel.py",)),
    Mutation("the top-K certificate ignores the bias bound",
             f"{SRT}/speculative/markov_topk_kernel.py",
             "        x = tl.min(base.to(tl.float32), axis=0) + bound * (1 + MARGIN)\n",
             "        x = tl.min(base.to(tl.float32), axis=0)\n",
             (f"{T}/speculative/test_markov_topk_kernel.py",)),
    Mutation("the certified Markov kernel sweeps every row block",
             f"{SRT}/speculative/markov_argmax_kernel.py",
             "            go = tl.max((rmask",
             "            go = 1 + 0 * tl.max((rmask",
             (f"{T}/speculative/test_markov_topk_kernel.py",)),
    Mutation("a swept token that differs from its candidate does not carry on",
             f"{SRT}/speculative/markov_argmax_kernel.py",
             "            div = tl.where(swept & (prev != cand), 1, div)\n",
             "            div = div\n",
             (f"{T}/speculative/test_markov_topk_kernel.py",)),
    Mutation("the bias bounds keep a stale pair after the weight changes",
             f"{SRT}/models/dspark.py",
             "        key = (w.data_ptr(), w._version)\n",
             "        key = (w.data_ptr(),)\n",
             (f"{T}/speculative/test_markov_topk_kernel.py",)),
    Mutation("the Markov bench counts one w2 read whatever the request blocks",
             "benchmark/spec_decode/bench_markov_argmax.py",
             "reads = -(-bs // tile.rows) * n * w2.nbytes",
             "reads = n * w2.nbytes",
             (f"{T}/speculative/test_bench_markov_argmax.py",)),
    Mutation("training step zeroes gradients after the objective",
             "python/sglang_aux/tools/dflash_training/trainer.py",
             "        self.opt.zero_grad(set_to_none=True)\n        with self._kernels():\n"
             "            loss, stats = self.objective(batch, anchors)\n        loss.backward()",
             "        with self._kernels():\n"
             "            loss, stats = self.objective(batch, anchors)\n"
             "        self.opt.zero_grad(set_to_none=True)\n        loss.backward()",
             (f"{T}/speculative/test_train_dspark.py::"
              "test_a_step_updates_the_markov_head_inside_the_sliced_loss",)),
    # chunked prefill (issue 29): a chunk's tokens at the positions after the prefix so far
    Mutation("chunked prefill: a chunk's positions start one past the prefix",
             f"{SRT}/managers/schedule_batch.py",
             "positions += range(r.kv_len, r.kv_len + len(tokens))",
             "positions += range(r.kv_len + (chunk is not None), "
             "r.kv_len + len(tokens) + (chunk is not None))",
             ("test/registered/managers/test_scheduler_chunked_prefill.py",)),
    # DSpark compact verify (issue 30): survival is the running product of confidences
    Mutation("compact verify ranks raw confidences, not survivals",
             f"{SRT}/speculative/verify_plan.py",
             "survival = torch.cumprod(confidence.float(), dim=1)",
             "survival = confidence.float()",
             (f"{T}/speculative/test_verify_plan.py",)),
    # the DSpark worker (issue 30)
    Mutation("compact verify: greedy acceptance past a request's verified tokens",
             f"{SRT}/speculative/acceptance.py",
             "self.plan.verify_lens[:r]).packed()", "None).packed()", (DSPARK_KNOWN,)),
    Mutation("compact verify: rejection sampling past a request's verified tokens",
             f"{SRT}/speculative/acceptance.py",
             "num_verified=self.plan.verify_lens[:r])", "num_verified=None)",
             (f"{ENGINE_LAW}::test_compact_verify_keeps_every_token_on_the_target_law",)),
    Mutation("ragged verify: each token reads the draft one position late",
             f"{SRT}/model_executor/runner/ragged_step_prologue.py",
             "(offset - 1).clamp_min(0)]", "offset.clamp_max(block.shape[1] - 1)]",
             (DSPARK_KNOWN,)),
    Mutation("DSpark's Markov loop starts from the mask token, not the anchor",
             f"{SRT}/speculative/dspark_proposal.py",
             "fb.input_ids.view(bs, n)[:, 0]", "fb.input_ids.view(bs, n)[:, 1]",
             (f"{ENGINE_LAW}::test_every_block_position_follows_the_target_law[DSPARK]",)),
    # structured output (issue 28): block masks, their rollback, no overlap lag
    Mutation("DFlash verify ignores the grammar masks",
             f"{SRT}/speculative/acceptance.py",
             "            apply_token_bitmask(processed, token_bitmask)",
             "            pass", (GRAMMAR,)),
    Mutation("compact verify ignores the grammar masks",
             f"{SRT}/speculative/dflash_worker.py",
             "token_bitmask=token_bitmask)", "token_bitmask=None)",
             (f"{GRAMMAR}::test_dspark_greedy_with_a_grammar_equals_target_only",)),
    Mutation("Triton ragged verify: a request's last verified token hidden from all",
             f"{SRT}/layers/attention/triton_ops/decode_attention.py",
             "seq_len = tl.load(Seq_Lens + b) + q_len",
             "seq_len = tl.load(Seq_Lens + b) + q_len - 1",
             (f"{T}/attention/test_triton_backend.py::"
              "test_ragged_verify_reads_each_request_once",)),
    # the draft length per batch size
    Mutation("draft length schedule: the batch size's width read from the step above",
             f"{SRT}/configs/draft_len_schedule.py",
             "bisect.bisect_right(self.batch_sizes, bs) - 1",
             "bisect.bisect_left(self.batch_sizes, bs) - 1",
             (f"{T}/speculative/test_draft_len_schedule.py",)),
    Mutation("draft length: a step's width does not cap compact verify's budget",
             f"{SRT}/speculative/verify_plan.py",
             "take = min(self.budget(bs), bs * (width - 1))", "take = self.budget(bs)",
             (f"{T}/speculative/test_dflash_worker_draft_len.py",)),
    Mutation("draft length: plain steps still run the draft forward",
             f"{SRT}/speculative/dflash_worker.py",
             "if width > 1:  # else plain decoding", "if width >= 1:  # else plain decoding",
             (f"{T}/speculative/test_dflash_worker_draft_len.py",)),
    Mutation("narrower static verify: its rejection test reads the block's last draft laws",
             f"{SRT}/speculative/acceptance.py",
             "self.proposals.q(bs, w - 1), p,",
             "self.proposals.q(bs)[:, self.verify_width - w:], p,",
             (f"{ENGINE_LAW}::test_static_verify_narrower_than_the_block_keeps_the_law",)),
    Mutation("narrower static verify: a step pads to a graph of the full width",
             f"{SRT}/model_executor/model_runner.py",
             "live = ForwardLayout.of(inputs, inputs.step_width or parts.layout_width,",
             "live = ForwardLayout.of(inputs, parts.layout_width,",
             (f"{T}/speculative/test_dflash_worker_draft_len.py",)),
    Mutation("narrower draft: its LM head reads block offsets 0..n-1",
             f"{SRT}/layers/logits_processor.py",
             "[:, 1 : 1 + n].reshape(bs * n, -1)", "[:, :n].reshape(bs * n, -1)",
             (f"{T}/speculative/test_draft_proposals.py",)),
    Mutation("narrower draft: a narrower static step's draft computes every proposal",
             f"{SRT}/speculative/dflash_worker.py",
             "inputs = dataclasses.replace(inputs, logits_per_req=width - 1)", "pass",
             (f"{T}/speculative/test_dflash_worker_draft_len.py",)),
    Mutation("narrower draft: the derivation prices every width's draft as the block's",
             f"{SRT}/speculative/draft_len_planner.py",
             "costs.draft(bs, w - 1 if narrow_draft else None)", "costs.draft(bs)",
             (f"{T}/speculative/test_draft_len_planner.py",)),
    Mutation("narrower mixed steps: the epilogue reads the block's full width",
             f"{SRT}/speculative/acceptance.py",
             "n = bs * fb.mixed_step_width", "n = bs * self.verify_width",
             (f"{T}/speculative/test_dflash_worker_draft_len.py",)),
    Mutation("narrower mixed steps: a mixed step verifies the full width",
             f"{SRT}/speculative/dflash_worker.py",
             "             else self.draft_len.width(bs))", "             else self.verify_width)",
             (f"{T}/speculative/test_dflash_worker_draft_len.py",)),
    Mutation("narrower static verify: the host counts the full width as verified",
             f"{SRT}/speculative/dflash_worker.py",
             "tokens = row[-1] if self.verify_plan.compact else width",
             "tokens = row[-1] if self.verify_plan.compact else self.verify_width",
             (f"{T}/speculative/test_dflash_worker_draft_len.py",)),
    Mutation("draft length derivation: the requests' contexts cost nothing",
             f"{SRT}/speculative/draft_len_planner.py",
             "+ costs.context_cost(bs, drafted=True))", ")",
             (f"{T}/speculative/test_draft_len_planner.py",)),
    Mutation("step cost probe: the borrowed request rows keep their context",
             f"{SRT}/speculative/step_cost_probe.py",
             "        pool.kv_lens[1 : rows + 1] = 0\n", "",
             (f"{T}/speculative/test_step_costs.py",)),
    Mutation("draft length derivation: a tie goes to the larger width",
             f"{SRT}/speculative/draft_len_planner.py",
             "if rate > best * (1 + TIE_RTOL):", "if rate >= best * (1 - TIE_RTOL):",
             (f"{T}/speculative/test_draft_len_planner.py",)),
    Mutation("acceptance counts: the rejected proposal is not counted as tried",
             f"{SRT}/speculative/acceptance_counts.py",
             "for k in range(min(accepted + 1, verified - 1)):",
             "for k in range(min(accepted, verified - 1)):",
             (f"{T}/speculative/test_acceptance_counts.py",)),
    Mutation("ragged verify attention: a request's tokens all at its first position",
             f"{SRT}/layers/attention/torch_native_backend.py",
             "q_pos[run, offset], seq[run, offset] = fb.positions, fb.seq_lens[:n]",
             "q_pos[run, offset], seq[run, offset] = fb.positions[starts[run]], "
             "fb.seq_lens[:n]",
             (f"{T}/speculative/test_verify_plan_dflash.py::"
              "test_ragged_verify_attention_reads_each_request_once",)),
    Mutation("DFlash compact verify plans from stale confidences",
             f"{SRT}/speculative/draft_proposals.py",
             "            max_probability(logits, self.proposals.confidence[:bs, :n])",
             "            pass",
             (f"{T}/speculative/test_verify_plan_dflash.py::"
              "test_confidence_is_the_drafts_probability_of_its_proposal",)),
    Mutation("chunk rows not capped below the staged projection's start",
             f"{SRT}/model_executor/model_runner.py",
             "chunk = min(chunk, extend.staged_from_tokens - 1)", "chunk = chunk",
             (f"{T}/managers/test_scheduler_chunked_prefill.py::test_staged_chunks_need_no_rows",)),
    Mutation("block masks leave the matcher advanced along the drafts",
             f"{SRT}/constrained/request_grammar.py",
             "            self._matcher.rollback(walked)",
             "            pass", (f"{GRAMMAR}::test_block_masks_walk_the_drafts_and_roll_back",)),
    Mutation("a grammar step keeps the overlap lag",
             f"{SRT}/managers/scheduler/scheduler.py",
             "lag = self.overlap and not any(r.grammar is not None for s in launched "
             "for r in s.reqs)",
             "lag = self.overlap", (GRAMMAR,)),
    # penalties and min_new_tokens inside a DFlash block (issue 28)
    Mutation("block position j does not count the drafts before it",
             f"{SRT}/sampling/penalties.py",
             "k = counts.gather(1, drafts)[:, None, :] + before",
             "k = counts.gather(1, drafts)[:, None, :] + 0 * before", (PENALTIES,)),
    Mutation("min_new_tokens ignores the block's earlier positions",
             f"{SRT}/sampling/penalties.py",
             "emitted = self.out_len[rows][:, None] + torch.arange(b, device=x.device)",
             "emitted = self.out_len[rows][:, None] + 0 * torch.arange(b, device=x.device)",
             (PENALTIES,)),
    # the three the suite used to miss
    Mutation("bonus token drawn from max(p - q, 0) instead of p",
             f"{SRT}/speculative/dflash_info.py",
             "q_next = torch.where((accepted < limit)[:, None], q_next, 0.0)",
             "q_next = torch.where((accepted <= limit)[:, None], q_next, 0.0)",
             (LAW, ENGINE_LAW)),
    Mutation("proposal drawn with the accept test's random number",
             f"{SRT}/speculative/draft_proposals.py",
             "uniform(params.seed[:, None], positions, Lane.DRAFT)",
             "uniform(params.seed[:, None], positions, Lane.ACCEPT)", (ENGINE_LAW,)),
    Mutation("Llama/Qwen aux states tapped one layer off", f"{SRT}/models/llama.py",
             "self.model.layers_to_capture = [i + 1 for i in layer_ids]",
             "self.model.layers_to_capture = [i for i in layer_ids]", (TAPS,)),
    # the twelve caught before
    Mutation("greedy: count matches instead of the longest prefix",
             f"{SRT}/speculative/dflash_info.py",
             "return BlockVerdicts(match.long().cumprod(-1).sum(-1), target_argmax)",
             "return BlockVerdicts(match.long().sum(-1), target_argmax)", (WORKER,)),
    Mutation("packer: slot ignores the caller's out= buffer", f"{SRT}/layers/aux_hidden_states.py",
             "                self._packed = self.out",
             "                self._packed = torch.empty_like(self.out)",
             (f"{T}/layers/test_aux_hidden_states.py",)),
    Mutation("packer: columns in reverse capture order", f"{SRT}/layers/aux_hidden_states.py",
             "start = self._count * self._width",
             "start = (self.num_captures - 1 - self._count) * self._width",
             (f"{T}/layers/test_aux_hidden_states.py",)),
    Mutation("acceptance scaled by 0.95", f"{SRT}/speculative/dflash_info.py",
             "ok = (q > 0) & (p > 0) & (u_accept * q <= p)",
             "ok = (q > 0) & (p > 0) & (u_accept * q <= 0.95 * p)",
             (LAW,)),
    Mutation("acceptance ignores the draft probability", f"{SRT}/speculative/dflash_info.py",
             "ok = (q > 0) & (p > 0) & (u_accept * q <= p)",
             "ok = (q > 0) & (p > 0) & (u_accept <= p)", (LAW,)),
    Mutation("acceptance independent of the target", f"{SRT}/speculative/dflash_info.py",
             "ok = (q > 0) & (p > 0) & (u_accept * q <= p)",
             "ok = (q > 0) & (p > 0) & (u_accept * q <= q)", (LAW,)),
    Mutation("corrected token drawn from p, not the residual",
             f"{SRT}/speculative/dflash_info.py",
             "residual = (p_next - q_next).clamp_min_(0)", "residual = p_next.clone()", (LAW,)),
    Mutation("corrected token drawn from max(q - p, 0)", f"{SRT}/speculative/dflash_info.py",
             "residual = (p_next - q_next).clamp_min_(0)",
             "residual = (q_next - p_next).clamp_min_(0)", (LAW,)),
    Mutation("verify step commits no draft context", f"{SRT}/speculative/acceptance.py",
             "the forward just wrote, and accept greedily (`verdicts[:bs]`).\"\"\"\n"
             "        self.draft_context.commit_forward(",
             "the forward just wrote, and accept greedily (`verdicts[:bs]`).\"\"\"\n"
             "        (lambda *a: None)(", (CONTEXT,)),
    Mutation("prefill commits no draft context", f"{SRT}/speculative/draft_context.py",
             "context from the aux rows (or projection) the forward just wrote.\"\"\"\n"
             "        self.commit_forward(",
             "context from the aux rows (or projection) the forward just wrote.\"\"\"\n"
             "        (lambda *a: None)(", (CONTEXT,)),
    Mutation("top-k keeps every token tied at the cut", f"{SRT}/sampling/top_k_top_p.py",
             "tied &= mask > ties[:, None]", "tied &= mask > vocab",
             (f"{T}/sampling/test_top_k_top_p.py",)),
    Mutation("inverse-CDF draw assumes normalized rows", f"{SRT}/sampling/sampler.py",
             "target = u[s:s + step, ..., None] * cdf[..., -1:]",
             "target = u[s:s + step, ..., None]",
             (f"{T}/sampling/test_sampler.py", LAW)),
    # more: sampling, acceptance, packer, commit, slot bookkeeping, staged / streamed projection
    Mutation("sampling ignores the temperature", f"{SRT}/sampling/sampler.py",
             "temperature = params.temperature.clamp_min(GREEDY_EPS)",
             "temperature = torch.ones_like(params.temperature)",
             (f"{T}/sampling/test_sampler.py", f"{T}/sampling/test_top_k_top_p.py")),
    Mutation("corrected / bonus draw shares the accept tests' stream",
             f"{SRT}/speculative/acceptance.py",
             "uniform(seed, positions + 1, Lane.RESIDUAL)",
             "uniform(seed, positions + 1, Lane.ACCEPT)",
             (ENGINE_LAW,)),
    Mutation("rejection sampling: accept count without the prefix rule",
             f"{SRT}/speculative/dflash_info.py",
             "accepted = ok.long().cumprod(-1).sum(-1)  # [bs]",
             "accepted = ok.long().sum(-1)  # [bs]", (LAW,)),
    Mutation("sampled requests keep their greedy verdicts", f"{SRT}/speculative/acceptance.py",
             "verdicts.copy_(torch.where(params.is_greedy[:, None],",
             "verdicts.copy_(torch.where(params.is_greedy[:, None] | True,",
             (ENGINE_LAW,)),
    Mutation("draft context committed at the next position",
             f"{SRT}/speculative/draft_context.py",
             "draft.write_context_kv(aux, positions, out_cache_loc, pool)",
             "draft.write_context_kv(aux, positions + 1, out_cache_loc, pool)", (CONTEXT,)),
    Mutation("packer: every capture into the first column block",
             f"{SRT}/layers/aux_hidden_states.py",
             "return self._packed[..., start : start + self._width]",
             "return self._packed[..., : self._width]", (f"{T}/layers/test_aux_hidden_states.py",)),
    Mutation("slot bookkeeping: kv_len skips the bonus", f"{SRT}/speculative/dflash_worker.py",
             "req.kv_len += row[0] + 1", "req.kv_len += row[0]", (KNOWN,)),
    Mutation("slot bookkeeping: the request-to-token rows advance one short",
             f"{SRT}/speculative/dflash_worker.py",
             "verdicts = self.acceptance.verdicts[:bs]\n        added = verdicts[:, 0] + 1",
             "verdicts = self.acceptance.verdicts[:bs]\n        added = verdicts[:, 0]",
             (KNOWN,)),
    Mutation("emitted tokens drop the bonus", f"{SRT}/speculative/dflash_worker.py",
             "return row[1 : row[0] + 2]", "return row[1 : row[0] + 1]", (KNOWN,)),
    Mutation("staged projection: every slice's scales into the first columns",
             f"{SRT}/layers/quantization/staged_input.py",
             "self.scales[:, lo // MXFP8_BLOCK:hi // MXFP8_BLOCK]))",
             "self.scales[:, : (hi - lo) // MXFP8_BLOCK]))",
             (f"{T}/speculative/test_staged_input.py",)),
    Mutation("streamed projection: every slice overwrites the accumulator",
             f"{SRT}/layers/quantization/streamed_projection.py",
             "torch.ops.sglang_aux.gemm_accumulate(hidden.to(w.dtype), w, self.acc, not first)",
             "torch.ops.sglang_aux.gemm_accumulate(hidden.to(w.dtype), w, self.acc, False)",
             (f"{T}/speculative/test_streamed_projection.py",)),
    Mutation("CPU attention: the gathered keys keep the first request's layout for every slot",
             f"{SRT}/layers/attention/torch_native_backend.py",
             "return buf.index_select(0, slots.reshape(-1)).view(*slots.shape, *buf.shape[1:])",
             "return buf.index_select(0, slots.reshape(-1).sort().values).view("
             "*slots.shape, *buf.shape[1:])",
             (f"{T}/attention/test_triton_backend.py",)),
    Mutation("offline sm_90 builds: a build the compiler rejects is not recorded as failed",
             "python/sglang_aux/test/sm90_builds.py",
             'record["error"] = f"{type(e).__name__}: {e}".strip().splitlines()[-1][:300]',
             "pass",
             (f"{T}/layers/test_sm90_builds.py",)),
    # the bs-1 decode's paired GEMVs and the split attention's key split and merge
    Mutation("paired qkv GEMV drops the q/k/v bias",
             f"{SRT}/layers/decode_gemv.py",
             "return row_gemv_rope_store(hidden, qkv_proj.weight, qkv_proj.bias, positions,",
             "return row_gemv_rope_store(hidden, qkv_proj.weight, None, positions,",
             (f"{T}/layers/test_decode_gemv_model.py::test_greedy_tokens_equal_the_torch_backend",)),
    Mutation("multi-token launches fill the SMs at least, not at most",
             f"{SRT}/layers/attention/triton_ops/decode_attention.py",
             "at_most=q_len > 1)", "at_most=False)",
             (f"{T}/attention/test_split_merge.py",)),
    Mutation("a merge program's heads are taken as the first program's",
             f"{SRT}/layers/attention/triton_ops/merge_attn_states.py",
             "h = tl.program_id(1) * BLOCK_H + tl.arange(0, BLOCK_H)",
             "h = tl.arange(0, BLOCK_H) + 0 * tl.program_id(1)",
             (f"{T}/attention/test_split_merge.py",)),
    # the scheduler's statistics and the mixed-step default
    Mutation("overlap: a pass's seconds charged to the step it launched, not the one it reads",
             f"{SRT}/managers/scheduler/scheduler.py",
             "self.stats[charged] += time.perf_counter() - start",
             "self.stats[kind] += time.perf_counter() - start",
             (f"{T}/managers/test_scheduler_overlap.py::"
              "test_overlap_charges_a_pass_to_the_step_it_completes",)),
    Mutation("mixed steps on by default under compact verify too",
             f"{SRT}/server_args.py",
             'algo.is_dflash_family() and self.speculative_verify_mode == "compact")',
             "False)",
             (f"{T}/test_server_args.py",)),
    Mutation("a GQA-packed extend tile stops its causal keys one token early",
             f"{SRT}/layers/attention/triton_ops/extend_attention.py",
             "last_token = ((m_tile + 1) * BLOCK_M - 1) // rows_per_token",
             "last_token = ((m_tile + 1) * BLOCK_M - 1) // rows_per_token - 1",
             (f"{T}/attention/test_triton_backend.py::test_extend_packed_gqa_equals_per_head",)),
    Mutation("the mixed graphs ignore --cuda-graph-tokens-mixed",
             f"{SRT}/model_executor/runner_utils/capture_sizes.py",
             "tokens = (sorted(set(args.cuda_graph_tokens_mixed)) if args.cuda_graph_tokens_mixed",
             "tokens = (sorted(set(args.cuda_graph_tokens_mixed)) if False",
             (f"{T}/managers/test_scheduler_mixed_chunk.py"
              "::test_mixed_graph_token_counts_from_the_flag",)),
    Mutation("mixed steps on by default on the CPU too",
             f"{SRT}/server_args.py",
             'self.enable_mixed_chunk = self.resolved_device().startswith("cuda") and not (',
             "self.enable_mixed_chunk = True and not (",
             (f"{T}/test_server_args.py",)),
    # the chunk pacer (--chunked-prefill-decode-share)
    Mutation("the chunk pacer owes one decode step too few",
             f"{SRT}/managers/scheduler/chunk_pacer.py",
             "return max(0, math.ceil(", "return max(0, math.floor(",
             (f"{T}/managers/test_chunk_pacer.py",)),
    Mutation("a new prompt's first chunk owes decode steps for the last prompt's",
             f"{SRT}/managers/scheduler/chunk_pacer.py",
             "        self._last_chunk_ms = None\n", "        pass\n",
             (f"{T}/managers/test_chunk_pacer.py",
              f"{T}/managers/test_scheduler_chunked_prefill.py"
              "::test_paced_chunks_interleave_decode_steps_and_equal_unchunked")),
    Mutation("paced chunks: no decode steps between them",
             f"{SRT}/managers/scheduler/scheduler.py",
             "self._decode_owed = pacer.decode_steps_owed() if not new else 0",
             "self._decode_owed = 0",
             (f"{T}/managers/test_scheduler_chunked_prefill.py"
              "::test_paced_chunks_interleave_decode_steps_and_equal_unchunked",)),
    Mutation("tensor parallelism: a follower's chunk pacer reads its own step times",
             f"{SRT}/managers/scheduler/tp_step_broadcast.py",
             'scheduler.chunk_pacer.role = "follower"', 'scheduler.chunk_pacer.role = "alone"',
             (f"{T}/managers/test_chunk_pacer.py"
              "::test_under_tensor_parallelism_followers_decide_from_rank0s_readings",)),
    Mutation("tensor parallelism: rank 0 does not send its pacer's readings",
             f"{SRT}/managers/scheduler/tp_step_broadcast.py",
             "            if readings:\n", "            if False:\n",
             (f"{T}/managers/test_chunk_pacer.py"
              "::test_under_tensor_parallelism_followers_decide_from_rank0s_readings",)),
    Mutation("the scheduler ignores the chunk pacer's size",
             f"{SRT}/managers/scheduler/scheduler.py",
             "size = pacer.chunk_tokens(size)", "pacer.chunk_tokens(size)",
             (f"{T}/managers/test_scheduler_chunked_prefill.py"
              "::test_paced_chunks_interleave_decode_steps_and_equal_unchunked",)),
    Mutation("recipe search: a training keeps one evaluation's reserve, whatever waits",
             "python/sglang_aux/tools/dflash_recipe_search.py",
             "budget = left() - a.eval_reserve_s * (1 + waiting)",
             "budget = left() - a.eval_reserve_s",
             (f"{T}/speculative/test_dflash_recipe_search.py"
              "::test_each_training_leaves_time_for_every_waiting_evaluation",)),
    Mutation("recipe search: a carried state's lost checkpoint keeps its run count",
             "python/sglang_aux/tools/dflash_recipe_search.py",
             "v.update(status=\"training\", runs=0, train_seconds=0.0)",
             "v.update(status=\"training\")",
             (f"{T}/speculative/test_dflash_recipe_search.py"
              "::test_a_carried_state_keeps_what_it_measured_and_trains_again_what_stayed",)),
    Mutation("--init-from: the folder's weights are read but not loaded",
             "python/sglang_aux/tools/dflash_training/warm_start.py",
             "draft.load_weights(safetensors_weights_iterator(folder))",
             "list(safetensors_weights_iterator(folder))",
             (f"{T}/speculative/test_training_checkpoint.py"
              "::test_init_from_starts_from_a_written_drafts_weights",)),
    Mutation("--init-from: a resumed run's fingerprint ignores the weights it started from",
             "python/sglang_aux/tools/train_dflash.py",
             "init=warm.digest if warm else None))", "init=None))",
             (f"{T}/speculative/test_training_checkpoint.py"
              "::test_init_from_starts_from_a_written_drafts_weights",)),
    Mutation("training attention: grouped K/V heads go to the memory-efficient kernel as they are",
             "python/sglang_aux/tools/dflash_training/draft_forward.py",
             "        if not gqa:  #", "        if False:  #",
             (f"{T}/speculative/test_train_dflash.py"
              "::test_the_sdpa_backend_choice_trains_the_same_and_a_bad_one_is_named",)),
    Mutation("--fill-budget: the budget still stops at --steps",
             "python/sglang_aux/tools/dflash_training/trainer.py",
             "fits if self.cfg.fill_budget else min(self.cfg.steps, fits)",
             "min(self.cfg.steps, fits)",
             (f"{T}/speculative/test_train_dflash.py"
              "::test_fill_budget_trains_past_steps_while_the_time_holds",)),
    Mutation("--device-reserve-gb never reaches the feature rows",
             "python/sglang_aux/tools/dflash_training/features.py",
             "final_hidden=final_hidden, reserve_bytes=reserve_bytes,",
             "final_hidden=final_hidden,",
             (f"{T}/speculative/test_train_dflash.py"
              "::test_the_device_reserve_reaches_the_feature_rows",)),
    # the draft vocabulary (--speculative-token-map)
    Mutation("draft vocabulary: greedy proposals are map columns, not tokens",
             f"{SRT}/speculative/draft_proposals.py",
             "best if self.token_ids is None\n", "best if True\n",
             (f"{T}/speculative/test_draft_proposals.py"
              "::test_a_draft_vocabulary_maps_proposals_and_places_q_at_its_ids",)),
    Mutation("draft vocabulary: q keeps stale mass off the map",
             f"{SRT}/speculative/draft_proposals.py",
             "q.view(bs * n, -1).zero_().index_copy_(", "q.view(bs * n, -1).index_copy_(",
             (f"{T}/speculative/test_draft_proposals.py"
              "::test_a_draft_vocabulary_maps_proposals_and_places_q_at_its_ids",)),
    Mutation("draft vocabulary: repeated ids accepted",
             f"{SRT}/speculative/token_map.py",
             "if unique.numel() != ids.numel():", "if False:",
             (f"{T}/speculative/test_dflash_token_map.py",)),
    Mutation("draft vocabulary: the cut head is not summed over ranks",
             f"{SRT}/speculative/token_map.py",
             "return tensor_model_parallel_all_reduce(rows)", "return rows",
             (f"{T}/speculative/test_dflash_token_map.py"
              "::test_the_cut_head_gathers_each_ranks_rows_exactly",)),
    Mutation("draft vocabulary: DSpark's loop feeds the column, not the token, to markov_w1",
             f"{SRT}/speculative/dspark_proposal.py",
             "        if ids is not None:\n            chosen = ids[chosen]\n", "",
             (f"{T}/speculative/test_dspark_proposal.py",)),
    Mutation("draft vocabulary: the Markov kernel leaves argmax columns unmapped",
             f"{SRT}/speculative/markov_argmax_kernel.py",
             "            prev = tl.load(IDS + prev, mask=rmask, other=0)\n",
             "            prev = prev\n",
             (f"{T}/speculative/test_markov_argmax_kernel.py"
              "::test_a_draft_vocabulary_is_the_torch_loop_with_the_rest_masked",)),
    Mutation("draft vocabulary: the Markov head keeps the full markov_w2 beside its rows",
             f"{SRT}/models/dspark.py",
             "        self.markov_w2.weight = nn.Parameter(rows, requires_grad=w.requires_grad)\n",
             "        self.markov_w2.weight = nn.Parameter(rows, requires_grad=w.requires_grad)\n"
             "        self._full_w2 = w\n",
             (f"{T}/speculative/test_dspark_proposal.py"
              "::test_a_draft_vocabulary_is_the_full_loop_with_the_rest_masked",)),
    Mutation("draft vocabulary: the trained draft's map leaves the target's end tokens out",
             "python/sglang_aux/tools/train_dflash.py",
             "    return size, token_map(samples, size, sorted(eos_ids))\n",
             "    return size, token_map(samples, size, [])\n",
             (f"{T}/speculative/test_train_dflash.py"
              "::test_smoke_run_writes_a_draft_the_engine_runs_losslessly",)),
    Mutation("draft vocabulary: a built-in draft's name is sent to the hub",
             f"{SRT}/speculative/token_map.py",
             "    if repo in SHIPPED_DRAFTS or repo in TRAINED_DRAFTS:\n",
             "    if False:\n",
             (f"{T}/speculative/test_dflash_token_map.py"
              "::test_a_built_in_drafts_map_is_named_by_the_draft",)),
    Mutation("draft vocabulary: a label the map leaves out is trained toward a row of the cut head",
             "python/sglang_aux/tools/dflash_training/block_objective.py",
             "    trained = labels >= 0\n",
             "    trained = labels != IGNORE\n",
             (f"{T}/speculative/test_train_dflash.py"
              "::test_a_small_vocabulary_trains_its_rows_and_counts_the_rest_wrong",)),
    Mutation("draft vocabulary: the server ignores the map a draft was trained over",
             f"{SRT}/speculative/dflash_worker.py",
             "        map_path = server_args.speculative_token_map or (\n",
             "        map_path = server_args.speculative_token_map or None and (\n",
             (f"{T}/speculative/test_train_dflash.py"
              "::test_a_draft_trained_over_its_vocabulary_is_served_with_it",)),
    # the training step's profile and its candidates (sixteenth session)
    Mutation("training profile: an op's device time counted beside its kernels'",
             "python/sglang_aux/tools/dflash_training/step_profile.py",
             "               if e.device_type != DeviceType.CPU and not e.is_user_annotation)",
             "               if not e.is_user_annotation)",
             (f"{T}/speculative/test_train_dflash.py::test_device_busy_counts_each_kernel_once",)),
    Mutation("training: the context bucket pads nothing",
             "python/sglang_aux/tools/dflash_training/sequence_set.py",
             "width = longest + (-longest % bucket if bucket else 0)",
             "width = longest",
             (f"{T}/speculative/test_train_dflash.py"
              "::test_a_context_bucket_pads_the_batch_and_trains_the_same",)),
    Mutation("training: the SDPA backend choice is ignored",
             "python/sglang_aux/tools/dflash_training/trainer.py",
             "        backend = SDPA_BACKENDS[self.cfg.sdpa_backend]\n",
             "        backend = None\n",
             (f"{T}/speculative/test_train_dflash.py"
              "::test_the_sdpa_backend_choice_trains_the_same_and_a_bad_one_is_named",)),
    Mutation("training: held-out sequences are drawn for steps",
             "python/sglang_aux/tools/dflash_training/trainer.py",
             "pool = torch.tensor(sorted(set(range(len(data))) - set(held_out)), dtype=torch.long)",
             "pool = torch.arange(len(data))",
             (f"{T}/speculative/test_train_dflash.py"
              "::test_held_out_sequences_are_never_trained_and_measured_as_it_trains",)),
    Mutation("training: each validation draws its anchors from the training's generator",
             "python/sglang_aux/tools/dflash_training/trainer.py",
             "anchors_from = torch.Generator().manual_seed(self.cfg.seed + 1)",
             "anchors_from = self.generator",
             (f"{T}/speculative/test_train_dflash.py"
              "::test_held_out_sequences_are_never_trained_and_measured_as_it_trains",)),
    Mutation("training: the card leaves the held-out curve out",
             "python/sglang_aux/tools/dflash_training/export.py",
             "{info.get('val_line', '')}{heads}", "{heads}",
             (f"{T}/speculative/test_train_dflash.py"
              "::test_smoke_run_holds_sequences_out_and_cards_their_curve",)),
    Mutation("training: --compile leaves the draft's forward eager",
             "python/sglang_aux/tools/dflash_training/trainer.py",
             "self.block_hidden = self.step_function(draft_block_hidden)",
             "self.block_hidden = draft_block_hidden",
             (f"{T}/speculative/test_train_dflash.py"
              "::test_a_compiled_step_trains_as_the_eager_one",)),
    Mutation("training: the default leaves CUDA steps eager",
             "python/sglang_aux/tools/dflash_training/trainer.py",
             'return device.type == "cuda" if self.compile is None else self.compile',
             "return bool(self.compile)",
             (f"{T}/speculative/test_train_dflash.py"
              "::test_steps_compile_by_default_on_cuda_alone",)),
    Mutation("training: --fused-adam steps AdamW with its foreach kernels",
             "python/sglang_aux/tools/dflash_training/trainer.py",
             '**({"fused": True} if cfg.fused_adam else {})', "**{}",
             (f"{T}/speculative/test_train_dflash.py::test_fused_adamw_trains_as_the_foreach_one",)),
    Mutation("training: the LM head cast to the draft rows' dtype at every loss slice",
             "python/sglang_aux/tools/dflash_training/target_head.py",
             "        return h @ lm_head.t()\n", "        return h @ lm_head.t().to(h.dtype)\n",
             (f"{T}/speculative/test_train_dflash.py"
              "::test_the_lm_head_is_read_as_it_is_under_autocast",)),
    Mutation("training: a held-out prompt's other continuations are trained on",
             "python/sglang_aux/tools/dflash_training/trainer.py",
             "held += members[keys[g]]", "held += members[keys[g]][:1]",
             (f"{T}/speculative/test_train_dflash.py::test_held_out_prompts_are_whole",)),
    Mutation("training: a sequence set numbers every sequence a prompt of its own",
             "python/sglang_aux/tools/dflash_training/sequence_set.py",
             "self.prompt_groups = prompt_groups([samples[i] for i in keep])",
             "self.prompt_groups = list(range(len(keep)))",
             (f"{T}/speculative/test_train_dflash.py::test_held_out_prompts_are_whole",)),
    Mutation("training: a better validation keeps no copy of the draft",
             "python/sglang_aux/tools/dflash_training/trainer.py",
             'if self.cfg.keep_best and (self.best is None or _better(point, self.best["point"])):',
             "if self.cfg.keep_best and self.best is None:",
             (f"{T}/speculative/test_train_dflash.py"
              "::test_a_finished_training_keeps_its_best_validations_draft",)),
    Mutation("training: a finished training leaves the last step's draft under keep_best",
             "python/sglang_aux/tools/dflash_training/trainer.py",
             'self.draft.load_state_dict(self.best["draft"])', "pass",
             (f"{T}/speculative/test_train_dflash.py"
              "::test_a_finished_training_keeps_its_best_validations_draft",)),
    Mutation("training: a checkpoint forgets the best validation's draft",
             "python/sglang_aux/tools/dflash_training/trainer.py",
             '"val_curve": self.val_curve, "best": self.best}', '"val_curve": self.val_curve}',
             (f"{T}/speculative/test_train_dflash.py"
              "::test_a_finished_training_keeps_its_best_validations_draft",)),
    Mutation("training: the held-out validation runs the compiled functions too",
             "python/sglang_aux/tools/dflash_training/trainer.py",
             "(compiled if torch.is_grad_enabled() else fn)(*args)", "compiled(*args)",
             (f"{T}/speculative/test_train_dflash.py"
              "::test_validation_runs_eagerly_beside_compiled_steps",)),
    Mutation("recipe search: a variant's pace counts its whole training call",
             "python/sglang_aux/tools/dflash_recipe_search.py",
             'v["step_ms"] = round(1e3 * record["train_seconds"] / record["steps"], 1)',
             'v["step_ms"] = round(1e3 * v["train_seconds"] / record["steps"], 1)',
             (f"{T}/speculative/test_dflash_recipe_search.py"
              "::test_two_variants_trained_measured_and_tabled",)),
    Mutation("training: a packed context pass still projects the padding",
             "python/sglang_aux/tools/dflash_training/trainer.py",
             "return batch.rows if self.cfg.pack_context else None", "return None",
             (f"{T}/speculative/test_train_dflash.py"
              "::test_a_packed_context_pass_skips_the_padding_and_trains_the_same",)),
    Mutation("training: a batch's own rows miss its last sequence",
             "python/sglang_aux/tools/dflash_training/sequence_set.py",
             "for i, n in enumerate(lens.tolist())", "for i, n in enumerate(lens.tolist()[:-1])",
             (f"{T}/speculative/test_train_dflash.py"
              "::test_a_packed_context_pass_skips_the_padding_and_trains_the_same",)),
    Mutation("recipe search: a recipe whose defaults moved is searched on",
             "python/sglang_aux/tools/dflash_recipe_search.py",
             'found = state.get(key) if key == "recipe_defaults" else state[key]',
             'found = value if key == "recipe_defaults" else state[key]',
             (f"{T}/speculative/test_dflash_recipe_search.py"
              "::test_missing_samples_and_another_searchs_state_are_one_line",)),
    Mutation("training: a batch's padding lies before its sequence's rows",
             "python/sglang_aux/tools/dflash_training/sequence_set.py",
             "            aux += [tensor_to_device(self.aux[i], dev), zero_rows[:pad]]",
             "            aux += [zero_rows[:pad], tensor_to_device(self.aux[i], dev)]",
             (f"{T}/speculative/test_train_dflash.py"
              "::test_a_batch_is_its_sequences_rows_zero_padded",)),
    Mutation("recipe search: Dynamo's graph limit stays at its default",
             "python/sglang_aux/tools/dflash_recipe_search.py",
             "COMPILES_PER_VARIANT * len(self.variants))", "0)",
             (f"{T}/speculative/test_dflash_recipe_search.py"
              "::test_every_variant_may_compile_its_steps",)),
    Mutation("DSpark training: the loss slices stay eager under compile",
             "python/sglang_aux/tools/dflash_training/dspark_objective.py",
             "self.slice_terms = self.step_function(slice_terms)",
             "self.slice_terms = slice_terms",
             (f"{T}/speculative/test_train_dspark.py"
              "::test_a_compiled_objective_gives_the_eager_ones_loss_and_gradients",)),
    Mutation("DSpark over a draft vocabulary: the target's mass off the map is no distance",
             "python/sglang_aux/tools/dflash_training/dspark_objective.py",
             "        l1 = l1 + off_map\n", "        l1 = l1\n",
             (f"{T}/speculative/test_train_dspark.py"
              "::test_row_terms_over_a_draft_vocabulary_are_the_whole_ones_with_no_mass_off_it",)),
    Mutation("training: a length group is drawn as often as any other, whatever its size",
             "python/sglang_aux/tools/dflash_training/sequence_set.py",
             "torch.multinomial(self.sizes, 1,", "torch.multinomial(self.sizes.sign(), 1,",
             (f"{T}/speculative/test_train_dflash.py"
              "::test_batches_drawn_by_length_group_keep_every_sequence_equally_likely",)),
    Mutation("DSpark over a draft vocabulary: labels stay token ids, not the map's rows",
             "python/sglang_aux/tools/dflash_training/dspark_objective.py",
             "            labels = vocab_labels(labels, self.label_rows)\n",
             "            labels = labels\n",
             (f"{T}/speculative/test_train_dspark.py"
              "::test_a_trainer_over_every_id_gives_the_whole_vocabularys_objective",)),
    Mutation("DSpark's kept logsumexp unread: the map's target logits softmaxed among "
             "themselves (no mass off the map)",
             "python/sglang_aux/tools/dflash_training/dspark_objective.py",
             "torch.exp((target_logits.float() - target_lse[..., None]).clamp(max=0))",
             "torch.softmax(target_logits.float(), -1)",
             (f"{T}/speculative/test_train_dspark.py"
              "::test_row_terms_from_the_logsumexp_are_those_of_the_whole_softmax",
              f"{T}/speculative/test_train_dspark.py"
              "::test_a_trainer_reading_the_logsumexp_gives_the_same_objective")),
    Mutation("a fraction of the samples spaced by sample, not by prompt (prompts split)",
             "python/sglang_aux/tools/dflash_training/data.py",
             "zip(samples, prompt_groups(samples), strict=True)",
             "zip(samples, range(len(samples)), strict=True)",
             (f"{T}/speculative/test_train_dflash.py"
              "::test_a_fraction_of_the_prompts_keeps_each_sources_share_and_whole_prompts",)),
    Mutation("--sample-fraction never reaches training",
             "python/sglang_aux/tools/train_dflash.py",
             "        samples = keep_prompt_fraction(samples, args.sample_fraction)\n",
             "        samples = samples\n",
             (f"{T}/speculative/test_train_dflash.py"
              "::test_sample_fraction_trains_on_that_share_of_a_samples_file",)),
    Mutation("the target's logsumexp of a forward's first chunk of rows alone",
             "python/sglang_aux/tools/dflash_training/target_head.py",
             "for c in final.split(LOGSUMEXP_CHUNK_ROWS)]",
             "for c in final.split(LOGSUMEXP_CHUNK_ROWS)[:1]]",
             (f"{T}/speculative/test_train_dspark.py"
              "::test_logsumexp_columns_hold_the_targets_whole_vocabulary_logsumexp",)),
    Mutation("a snapshot after every step, whatever the interval",
             "python/sglang_aux/tools/dflash_training/trainer.py",
             "time.perf_counter() - snapped_at >= snapshot_every_s:",
             "time.perf_counter() - snapped_at >= 0:",
             (f"{T}/speculative/test_train_dflash.py"
              "::test_snapshots_are_taken_every_so_many_seconds_of_training",)),
    Mutation("every snapshot kept",
             "python/sglang_aux/tools/dflash_training/snapshot.py",
             "sorted(root.glob(\"step-*\"))[:-SNAPSHOTS_KEPT]", "[]",
             (f"{T}/speculative/test_training_checkpoint.py"
              "::test_snapshots_leave_a_draft_a_later_training_starts_from",)),
    Mutation("an earlier training's snapshots left in place",
             "python/sglang_aux/tools/train_dflash.py",
             "        clear_snapshots(args.out)\n", "        pass\n",
             (f"{T}/speculative/test_training_checkpoint.py"
              "::test_snapshots_leave_a_draft_a_later_training_starts_from",)),
    Mutation("MXFP8 rows decoded without their scales",
             "python/sglang_aux/tools/dflash_training/mxfp8_rows.py",
             "data[..., q:q + g], self.dtype)",
             "torch.full_like(data[..., q:q + g], 127), self.dtype)",
             (f"{T}/speculative/test_mxfp8_rows.py"
              "::test_a_row_decodes_to_its_mxfp8_round_trip_and_its_raw_bytes",)),
    Mutation("MXFP8 rows' raw columns dropped",
             "python/sglang_aux/tools/dflash_training/mxfp8_rows.py",
             "            out[:, q + g:] = rows[:, q:].contiguous().view(torch.uint8)\n",
             "            out[:, q + g:] = 0\n",
             (f"{T}/speculative/test_mxfp8_rows.py"
              "::test_a_row_decodes_to_its_mxfp8_round_trip_and_its_raw_bytes",)),
    Mutation("a batch of MXFP8 rows left encoded",
             "python/sglang_aux/tools/dflash_training/sequence_set.py",
             "gathered if self.codec is None else self.codec.decode(gathered),",
             "gathered,",
             (f"{T}/speculative/test_mxfp8_rows.py"
              "::test_a_batch_of_encoded_rows_is_the_batch_of_their_round_trips",)),
    Mutation("--mxfp8-rows ignored by the features",
             "python/sglang_aux/tools/dflash_training/features.py",
             "    return rows if codec is None else codec.encode(rows)",
             "    return rows",
             (f"{T}/speculative/test_mxfp8_rows.py"
              "::test_training_on_mxfp8_rows_is_training_on_their_round_trips",)),
    Mutation("train-wait packs the newest snapshot again every call",
             "scripts/device/qwen25_coder.sh",
             "  if [ -z \"$(ls $work/snapshot-parts 2>/dev/null)\" ]; then",
             "  if true; then",
             (f"{T}/test_device_scripts.py"
              "::test_a_running_training_sends_its_newest_snapshot_home",)),
    Mutation("held-out prompts drawn among every prompt, an extra file's too",
             "python/sglang_aux/tools/dflash_training/trainer.py",
             "    keys = sorted(g for g in members if among is None or g < among)",
             "    keys = sorted(members)",
             (f"{T}/speculative/test_train_dflash.py"
              "::test_held_out_prompts_drawn_among_the_first_stay_when_more_prompts_follow",)),
    Mutation("an extra samples file's continuations of known prompts trained again",
             "python/sglang_aux/tools/dflash_training/data.py",
             "    return [s for s in more if tuple(s.prompt_ids) not in seen]",
             "    return list(more)",
             (f"{T}/speculative/test_train_dflash.py"
              "::test_extra_samples_files_train_beside_the_samples_file",)),
    Mutation("the extra files' held-out draw left to every prompt",
             "python/sglang_aux/tools/train_dflash.py",
             "                      val_among_prompts=val_among,",
             "                      val_among_prompts=None,",
             (f"{T}/speculative/test_train_dflash.py"
              "::test_extra_samples_files_train_beside_the_samples_file",)),
    Mutation("code tasks holding an evaluation signature drawn",
             "python/sglang_aux/tools/dflash_training/code_tasks.py",
             "            if any(a in _normalized(f\"{signature} {doc}\") for a in avoid):",
             "            if False:",
             (f"{T}/speculative/test_code_tasks.py"
              "::test_a_task_holding_an_evaluation_signature_is_not_drawn",)),
    Mutation("a second draw of code tasks repeats the first's functions",
             "python/sglang_aux/tools/dflash_training/code_tasks.py",
             "    seen = {key for t in exclude for key in (_normalized(t.docstring), "
             "_normalized(t.signature))}",
             "    seen = set()",
             (f"{T}/speculative/test_code_tasks.py"
              "::test_a_second_draw_leaves_out_the_functions_of_the_first",)),
    Mutation("a borrowed prompt's rows left out of the batch",
             "python/sglang_aux/tools/dflash_training/sequence_set.py",
             "            if self.prompt_aux[i] is not None:",
             "            if False:",
             (f"{T}/speculative/test_train_dflash.py"
              "::test_a_prompts_rows_are_kept_once_for_all_its_continuations",)),
    Mutation("a prompt's later continuations compute and keep it again",
             "python/sglang_aux/tools/dflash_training/features.py",
             "        reads = [kept_slots[owner[i]] if owner[i] != i else prefix_slots "
             "for i in index]",
             "        reads = [prefix_slots for i in index]",
             (f"{T}/speculative/test_train_dflash.py"
              "::test_a_prompts_rows_are_kept_once_for_all_its_continuations",)),
    Mutation("an owner's held prompt slots never given back",
             "python/sglang_aux/tools/dflash_training/features.py",
             "            alloc.free(kept_slots.pop(o)[skip:])",
             "            kept_slots.pop(o)",
             (f"{T}/speculative/test_train_dflash.py"
              "::test_a_prompts_rows_are_kept_once_for_all_its_continuations",)),
    Mutation("every sample is its own prompt owner",
             "python/sglang_aux/tools/dflash_training/data.py",
             "    return [first.setdefault((s.source, tuple(s.prompt_ids)), i) "
             "for i, s in enumerate(samples)]",
             "    return [i for i, s in enumerate(samples)]",
             (f"{T}/speculative/test_train_dflash.py"
              "::test_a_prompts_rows_are_kept_once_for_all_its_continuations",)),
    Mutation("the Triton rows decoder decodes through torch",
             "python/sglang_aux/tools/dflash_training/mxfp8_rows.py",
             '        if self.decoder == "triton":',
             "        if False:",
             (f"{T}/speculative/test_mxfp8_rows_triton.py",)),
    Mutation("rows past the machine's memory are not stopped before the features",
             "python/sglang_aux/tools/dflash_training/features.py",
             "    if need > on_device + host:",
             "    if False:",
             (f"{T}/speculative/test_train_dflash.py"
              "::test_rows_that_cannot_fit_stop_before_the_features",)),
    Mutation("the rows plan counts a borrowed prompt's rows again",
             "python/sglang_aux/tools/dflash_training/features.py",
             "        total += skip + sum(len(s.ids) - skip if owner[j] == j "
             "else len(s.output_ids)",
             "        total += skip + sum(len(s.ids) - skip if True "
             "else len(s.output_ids)",
             (f"{T}/speculative/test_train_dflash.py"
              "::test_a_prompts_rows_are_kept_once_for_all_its_continuations",)),
]


def _copy_tree(dest: Path) -> None:
    for name in COPIED:
        src = ROOT / name
        if src.is_dir():
            shutil.copytree(src, dest / name, ignore=shutil.ignore_patterns("__pycache__"))
        else:
            shutil.copy2(src, dest / name)


def run_one(m: Mutation, timeout: float) -> tuple[str, float, str]:
    """(verdict, seconds, detail): verdict is caught, NOT CAUGHT or stale."""
    start = time.time()
    with tempfile.TemporaryDirectory(prefix="mutation_") as tmp:
        tree = Path(tmp)
        _copy_tree(tree)
        target = tree / m.path
        text = target.read_text()
        if text.count(m.old) != 1:
            return "stale", 0.0, f"expected text found {text.count(m.old)} times in {m.path}"
        target.write_text(text.replace(m.old, m.new))
        env = {**os.environ, "PYTHONPATH": str(tree / "python"), "PYTHONDONTWRITEBYTECODE": "1"}
        cmd = [sys.executable, "-m", "pytest", "-x", "-q", "-p", "no:cacheprovider",
               "-o", "addopts=", *m.tests]
        if STOP.is_set():
            return "skipped", 0.0, "interrupted"
        proc = subprocess.Popen(cmd, cwd=tree, env=env, stdout=subprocess.PIPE,
                                stderr=subprocess.PIPE, text=True)
        RUNNING.add(proc)
        try:
            stdout, stderr = proc.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.communicate()
            return "NOT CAUGHT", time.time() - start, f"timed out after {timeout:.0f}s"
        finally:
            RUNNING.discard(proc)
        if STOP.is_set():
            return "skipped", 0.0, "interrupted"
        failed = [ln for ln in stdout.splitlines() if ln.startswith(("FAILED", "ERROR"))]
        if proc.returncode == 1 and failed:
            return "caught", time.time() - start, failed[0][:150]
        if proc.returncode == 0:
            return "NOT CAUGHT", time.time() - start, stdout.strip().splitlines()[-1]
        return "NOT CAUGHT", time.time() - start, f"pytest exit {proc.returncode}: " + (
            stdout + stderr).strip()[-300:]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--jobs", type=int, default=2, help="mutations run at once (CPU: 2)")
    parser.add_argument("--only", nargs="*", help="names (substrings) of mutations to run")
    parser.add_argument("--timeout", type=float, default=900.0, help="seconds per mutation")
    parser.add_argument("--list", action="store_true")
    args = parser.parse_args()
    chosen = [m for m in MUTATIONS
              if not args.only or any(s in m.name for s in args.only)]
    if args.list:
        for m in chosen:
            print(f"{m.name}  [{m.path}]  <- {', '.join(m.tests)}")
        return 0
    start = time.time()
    results = []
    pool = ThreadPoolExecutor(max_workers=max(1, args.jobs))
    try:
        futures = [(m, pool.submit(run_one, m, args.timeout)) for m in chosen]
        for m, fut in futures:
            while not wait([fut], timeout=0.5).done:  # short waits: Ctrl-C lands promptly
                pass
            verdict, secs, detail = fut.result()
            results.append((m, verdict))
            print(f"{verdict:10s} {secs:6.0f}s  {m.name}  ({m.path.rsplit('/', 1)[-1]})\n"
                  f"{'':19s}{detail}", flush=True)
    except KeyboardInterrupt:
        # pending mutations are dropped, running pytest children terminated; each
        # TemporaryDirectory removes its copy as its thread unwinds
        STOP.set()
        for proc in list(RUNNING):
            proc.terminate()
        pool.shutdown(wait=True, cancel_futures=True)
        print("interrupted: the working tree was never modified", file=sys.stderr)
        return 130
    pool.shutdown()
    missed = [m.name for m, v in results if v != "caught"]
    print(f"\n{len(results) - len(missed)}/{len(results)} mutations caught in "
          f"{time.time() - start:.0f}s" + (f"; not caught: {missed}" if missed else ""))
    return 1 if missed else 0


if __name__ == "__main__":
    sys.exit(main())
