"""Ragged verify steps (compact verify's layout) driven straight through runners, for the
prologue's CPU and CUDA tests: one runner whose TARGET_VERIFY graphs are captured per token
bucket, one that runs the same ragged steps eagerly, and one that verifies the same requests'
whole blocks (the static layout), all over the same prefilled prompts and block tokens. A
ragged token's logits must equal its static row's: attention is causal in the block, so a
token sees the same keys whichever later tokens are verified with it."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from sglang_aux.srt.forward_state.forward_batch_info import ForwardBatch, ForwardMode
from sglang_aux.srt.managers.schedule_batch import Req, reserve_kv, step_inputs
from sglang_aux.srt.mem_cache.memory_pool import PADDING_REQ_ROW
from sglang_aux.srt.model_executor.model_runner import ModelRunner
from sglang_aux.srt.model_executor.runner.forward_layout import ForwardInputs
from sglang_aux.srt.model_executor.runner.forward_parts import ForwardParts
from sglang_aux.srt.model_executor.runner.ragged_step_prologue import RaggedStepPrologue
from sglang_aux.srt.model_executor.runner.step_prologue import StepPrologue
from sglang_aux.test.runtime_utils import make_runner, prefill_random, publish_rows

VERIFY = ForwardMode.TARGET_VERIFY


def spread(total: int, num_reqs: int, width: int) -> list[int]:
    """`total` tokens over `num_reqs` requests of 1..width each, the first ones fullest (so a
    request of `width` and one of 1 tokens appear whenever the total allows)."""
    if not num_reqs <= total <= num_reqs * width:
        raise ValueError(f"{total} tokens do not fit {num_reqs} requests of 1..{width}")
    lens = []
    for i in range(num_reqs):
        lens.append(min(width, total - sum(lens) - (num_reqs - 1 - i)))
    return lens


@dataclass
class RaggedTrio:
    """Three runners over one checkpoint (`graphs`: ragged, captured per token bucket;
    `eager`: ragged, no graphs; `static`: whole blocks, no graphs) and their requests."""

    width: int
    runners: dict[str, ModelRunner]
    reqs: dict[str, list[Req]]
    lens: torch.Tensor  # [max tokens] the ragged prologues' lens storage, on the device
    rows: torch.Tensor  # [max tokens] their request_rows storage
    blocks: torch.Tensor  # [max tokens, width - 1] block tokens every prologue reads

    @classmethod
    def create(cls, path: str, width: int, prompt_lens: list[int], **server_args
               ) -> RaggedTrio:
        max_tokens = len(prompt_lens) * width
        runners = {"graphs": make_runner(path, **server_args),
                   "eager": make_runner(path, disable_decode_cuda_graph=True, **server_args),
                   "static": make_runner(path, disable_decode_cuda_graph=True, **server_args)}
        device = runners["graphs"].device
        vocab = runners["graphs"].model_config.hf_config.vocab_size
        g = torch.Generator().manual_seed(1)
        trio = cls(width, runners, {},
                   torch.zeros(max_tokens, dtype=torch.int64, device=device),
                   torch.zeros(max_tokens, dtype=torch.int64, device=device),
                   torch.randint(0, vocab, (max_tokens, width - 1), generator=g).to(device))
        ragged = RaggedStepPrologue(block_tokens=lambda n: trio.blocks[:n],
                                    lens=lambda n: trio.lens[:n],
                                    request_rows=lambda n: trio.rows[:n], width=width)
        for name, runner in runners.items():
            if name == "static":
                runner.init_forwards(ForwardParts(
                    VERIFY, width, StepPrologue(block_tokens=lambda bs: trio.blocks[:bs])))
            else:
                runner.init_forwards(ForwardParts(VERIFY, width, ragged, ragged=True))
            trio.reqs[name] = reqs = prefill_random(runner, prompt_lens, seed=3)
            for r in reqs:
                r.output_ids.append(11 + r.kv_len)  # the token each step feeds first
                reserve_kv(runner, r, r.kv_len + width)
            publish_rows(runner, reqs)
        return trio

    def buckets(self) -> list[int]:
        return [x.step_bs for x in self.runners["graphs"].step_graphs.layouts]

    def step(self, name: str, lens: list[int]) -> tuple[ForwardBatch, torch.Tensor]:
        """One ragged step of the first `len(lens)` requests, `lens` tokens each: its batch
        and its `[sum(lens), vocab]` logits (a copy)."""
        runner, reqs = self.runners[name], self.reqs[name][: len(lens)]
        n = sum(lens)
        self.lens.zero_()
        self.lens[: len(lens)] = torch.tensor(lens)
        bound = max(r.kv_len for r in reqs) + self.width - 1
        inputs = ForwardInputs(VERIFY, step_rows=[r.req_pool_idx for r in reqs]
                               + [PADDING_REQ_ROW] * (n - len(reqs)), step_kv_bounds=[bound] * n)
        fb = runner.prepare(inputs)
        return fb, runner.forward(fb).next_token_logits[:n].clone()

    def static_rows(self, lens: list[int]) -> torch.Tensor:
        """The static step's logits of the same requests' first `lens` block tokens, in the
        ragged step's order."""
        runner, reqs = self.runners["static"], self.reqs["static"][: len(lens)]
        logits = runner.forward(runner.prepare(step_inputs(reqs, VERIFY, self.width)))
        rows = torch.cat([torch.arange(i * self.width, i * self.width + n)
                          for i, n in enumerate(lens)])
        return logits.next_token_logits[rows.to(logits.next_token_logits.device)]


def ragged_verify_batch(req_pool, kv_pool, backend, rows: list[int], prefix: list[int],
                        lens: list[int], num_tokens: int, width: int,
                        max_requests: int = 0) -> ForwardBatch:
    """A TARGET_VERIFY batch of requests in `rows` with `prefix` cached tokens verifying
    `lens` tokens each, laid out token-major over `num_tokens` entries by
    `RaggedStepPrologue` (rows of no request past them; `max_requests` request slots, 0:
    one per token), for attention tests."""
    device, bs = req_pool.req_to_token.device, len(rows)
    ints = lambda xs: torch.tensor(xs, dtype=torch.int64, device=device)  # noqa: E731
    req_pool.kv_lens[ints(rows)] = ints(prefix)
    lens_storage = torch.zeros(num_tokens, dtype=torch.int64, device=device)
    lens_storage[:bs] = ints(lens)
    rows_storage = torch.zeros(num_tokens, dtype=torch.int64, device=device)
    zeros = torch.zeros(num_tokens, dtype=torch.int64, device=device)
    fb = ForwardBatch(
        forward_mode=VERIFY, batch_size=num_tokens, input_ids=zeros.clone(),
        req_pool_indices=ints(rows + [PADDING_REQ_ROW] * (num_tokens - bs)),
        seq_lens=zeros.clone(), seq_lens_cpu=zeros.cpu(), out_cache_loc=zeros.clone(),
        positions=zeros.clone(), req_to_token_pool=req_pool, token_to_kv_pool=kv_pool,
        attn_backend=backend)
    RaggedStepPrologue(lens=lambda n: lens_storage[:n], request_rows=lambda n: rows_storage[:n],
                       width=width, max_requests=max_requests)(fb)
    fb.seq_lens_cpu = fb.seq_lens.cpu()
    return fb
