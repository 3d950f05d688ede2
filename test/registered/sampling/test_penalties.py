"""Penalties, min_new_tokens and min_p (SGLang's definitions) on CPU: the device tables against
a direct computation, a DFlash block's positions against target-only steps, and end to end
through the Engine: each parameter does what it says, rows without it are unchanged in the same
batch, and greedy DFlash equals target-only token for token (real draft and oracle
proposals, which exercise every block position)."""

import sys

import pytest
import torch

from sglang_aux.srt.entrypoints.engine import Engine
from sglang_aux.srt.sampling.penalties import PenaltyRows
from sglang_aux.srt.sampling.sampler import SamplingTensors, sampling_probs
from sglang_aux.srt.sampling.sampling_params import SamplingParams
from sglang_aux.test.ci.ci_register import register_cpu_ci
from sglang_aux.test.runtime_utils import assert_kv_all_back, tiny_checkpoint

register_cpu_ci(est_time=120, suite="default")

VOCAB = 11
PROMPTS = ["Hi", "The quick brown fox jumps over", "12 + 30 =", "Natalia sold clips to 48 of"]
GREEDY = {"temperature": 0, "max_new_tokens": 24, "ignore_eos": True}
COMMON = dict(device="cpu", max_total_tokens=4096, cuda_graph_bs_decode=[1, 2, 4],
              max_running_requests=4)
PENALIZED = [{"repetition_penalty": 2.0}, {"frequency_penalty": 2.0},
             {"presence_penalty": 2.0},
             {"frequency_penalty": -1.5, "presence_penalty": 1.0, "repetition_penalty": 1.5}]


def _reference(logits, outputs, freq, pres, rep, min_new, stop):
    """SGLang's penalizers, one token position at a time, from the output so far."""
    x = logits.clone()
    counts = torch.bincount(torch.tensor(outputs, dtype=torch.int64), minlength=VOCAB).float()
    x = x - freq * counts - pres * (counts > 0).float()
    x = torch.where(counts > 0, torch.where(x < 0, x * rep, x / rep), x)
    if len(outputs) < min_new:
        x[stop] = float("-inf")
    return x


def _params(**kw) -> SamplingParams:
    return SamplingParams.from_dict({"max_new_tokens": 64, **kw})


def test_rows_match_the_definitions_and_defaults_stay_exact():
    rows = PenaltyRows(4, VOCAB, "cpu")
    settings = [dict(frequency_penalty=0.5, presence_penalty=-0.3, repetition_penalty=1.7,
                     min_new_tokens=3, stop_token_ids=[4, VOCAB + 5]), {},
                dict(repetition_penalty=0.6)]
    outputs = [[1, 1, 2], [3], [5, 7, 7]]
    for row, (kw, out) in enumerate(zip(settings, outputs, strict=True), start=1):
        rows.stage(row, _params(**kw), out, {9})
    rows.write([1, 2, 3])
    g = torch.Generator().manual_seed(0)
    logits = torch.randn(3, VOCAB, generator=g) * 3
    index = torch.tensor([1, 2, 3])
    got = rows.apply(logits, index)
    for i, (kw, out) in enumerate(zip(settings, outputs, strict=True)):
        p = _params(**kw)
        ref = _reference(logits[i], out, p.frequency_penalty, p.presence_penalty,
                         p.repetition_penalty, p.min_new_tokens, [4, 9] if kw else [])
        torch.testing.assert_close(got[i], ref, rtol=0, atol=0)
    assert torch.equal(got[1], logits[1])  # default parameters: bit-identical
    rows.advance(index, torch.tensor([[2], [3], [8]]), 1)
    assert rows.out_len[1:4].tolist() == [4, 2, 4]
    assert rows.counts[1, 2].item() == 2 and rows.counts[3, 8].item() == 1
    # a reused row starts over
    rows.stage(1, _params(), [], {9})
    rows.write([1])
    assert rows.counts[1].sum().item() == 0 and rows.params[1].tolist() == [0.0, 0.0, 1.0]


def test_block_positions_equal_target_only_steps():
    """Position j of a block is processed as target-only decoding after drafts 0..j-1."""
    b = 5
    kw = dict(frequency_penalty=0.7, presence_penalty=0.4, repetition_penalty=1.9,
              min_new_tokens=4, stop_token_ids=[6])
    block = PenaltyRows(2, VOCAB, "cpu")
    block.stage(1, _params(**kw), [3, 2], {0})
    block.stage(2, _params(), [1], {0})  # a default row in the same block batch
    block.write([1, 2])
    drafts = torch.tensor([[2, 2, 5, 3], [4, 4, 4, 4]])
    g = torch.Generator().manual_seed(1)
    logits = torch.randn(2 * b, VOCAB, generator=g) * 2
    index = torch.tensor([1, 2])
    got = block.apply(logits, index, drafts).view(2, b, VOCAB)
    assert torch.equal(got[1], logits.view(2, b, VOCAB)[1])
    step = PenaltyRows(1, VOCAB, "cpu")
    step.stage(1, _params(**kw), [3, 2], {0})
    step.write([1])
    one = torch.tensor([1])
    for j in range(b):
        torch.testing.assert_close(got[0, j], step.apply(logits[j:j + 1], one)[0], rtol=0,
                                   atol=0)
        if j < b - 1:
            step.advance(one, drafts[:1, j:j + 1], 1)
    # advancing by a verdict counts only the emitted tokens
    block.advance(index, torch.tensor([[2, 2, 9, 9, 9], [4, 1, 1, 1, 1]]), torch.tensor([2, 1]))
    assert block.counts[1, 2].item() == 3 and block.counts[1, 9].item() == 0
    assert block.out_len[1:3].tolist() == [4, 2]


def test_min_p_keeps_tokens_near_the_top_and_leaves_zero_rows_alone():
    g = torch.Generator().manual_seed(2)
    logits = torch.randn(3, VOCAB, generator=g) * 2
    params = SamplingTensors(temperature=torch.ones(3), top_k=torch.full((3,), VOCAB),
                             top_p=torch.ones(3), seed=torch.zeros(3, dtype=torch.int64),
                             is_greedy=torch.zeros(3, dtype=torch.bool))
    plain = sampling_probs(logits, params)
    params.min_p = torch.tensor([0.0, 0.3, 1.0])
    got = sampling_probs(logits, params)
    assert torch.equal(got[0], plain[0])
    soft = torch.softmax(logits[1], -1)
    keep = soft >= 0.3 * soft.max()
    torch.testing.assert_close(got[1], torch.where(keep, soft, 0.0) / soft[keep].sum())
    assert got[2].argmax() == logits[2].argmax() and got[2].max().item() == 1.0


@pytest.fixture(scope="module")
def ckpts(tmp_path_factory):
    root = tmp_path_factory.mktemp("ckpt")
    return {p: tiny_checkpoint(p, root) for p in ("tiny-k3", "tiny-k3-dflash")}


@pytest.fixture(scope="module")
def plain(ckpts):
    return Engine(model_path=ckpts["tiny-k3"], **COMMON)


@pytest.fixture(scope="module")
def spec(ckpts):
    return Engine(model_path=ckpts["tiny-k3"], speculative_algorithm="DFLASH",
                  speculative_draft_model_path=ckpts["tiny-k3-dflash"], **COMMON)


def _repeats(ids: list[int]) -> int:
    return len(ids) - len(set(ids))


def test_penalties_change_outputs_as_defined(plain):
    base = plain.generate(PROMPTS, GREEDY)
    # one penalized request among default ones: the default rows are unchanged
    for kw in PENALIZED:
        params = [dict(GREEDY)] * len(PROMPTS)
        params[1] = {**GREEDY, **kw}
        outs = plain.generate(PROMPTS, params)
        for i in (0, 2, 3):
            assert outs[i]["output_ids"] == base[i]["output_ids"]
        assert outs[1]["output_ids"] != base[1]["output_ids"], kw
    rep = plain.generate(PROMPTS, {**GREEDY, "repetition_penalty": 2.0, "presence_penalty": 2.0})
    assert sum(_repeats(o["output_ids"]) for o in rep) < sum(
        _repeats(o["output_ids"]) for o in base)
    assert_kv_all_back(plain)


def test_min_new_tokens_delays_stop_tokens(plain):
    base = plain.generate(PROMPTS, GREEDY)
    for prompt, ref in zip(PROMPTS, base, strict=True):
        stop = ref["output_ids"][1]  # a stop at the second token
        cut = plain.generate(prompt, {**GREEDY, "ignore_eos": False, "stop_token_ids": [stop]})
        assert cut["output_ids"][-1] == stop and len(cut["output_ids"]) <= 2
        held = plain.generate(prompt, {**GREEDY, "ignore_eos": False, "stop_token_ids": [stop],
                                       "min_new_tokens": 6})
        assert stop not in held["output_ids"][:6]
        assert len(held["output_ids"]) >= 7 or held["meta_info"]["finish_reason"][
            "type"] == "length"


def test_min_p_one_samples_the_greedy_tokens(plain, spec):
    greedy = plain.generate(PROMPTS, GREEDY)
    sampled = {**GREEDY, "temperature": 1.0, "min_p": 1.0, "seed": 3}
    for engine in (plain, spec):
        for ref, out in zip(greedy, engine.generate(PROMPTS, sampled), strict=True):
            assert out["output_ids"] == ref["output_ids"]
    # a seeded sampled row beside a min_p row is unchanged
    free = {**GREEDY, "temperature": 1.0, "seed": 5}
    alone = plain.generate(PROMPTS[:2], [free, free])
    mixed = plain.generate(PROMPTS[:2], [free, {**free, "min_p": 0.5}])
    assert mixed[0]["output_ids"] == alone[0]["output_ids"]


def _oracle(worker, refs: dict[tuple, list[int]]):
    """Proposals read from the target-only output: every draft is accepted when the verify
    processes each block position as target-only decoding did."""

    def propose(reqs, fb):
        b = worker.verify_width
        drafts = [(refs[tuple(r.origin_input_ids)][len(r.output_ids):] + [0] * b)[:b - 1]
                  for r in reqs]
        return torch.tensor(drafts, device=fb.input_ids.device)

    return propose


@pytest.mark.parametrize("oracle", [False, True])
def test_greedy_dflash_equals_target_only_with_every_parameter(plain, spec, oracle):
    settings = [*PENALIZED, {"min_new_tokens": 12, "ignore_eos": False},
                {"min_p": 0.2, "repetition_penalty": 1.3}]
    worker = spec.worker
    original = worker.propose
    try:
        for kw in settings:
            params = [dict(GREEDY), {**GREEDY, **kw}, {**GREEDY, **kw}, dict(GREEDY)]
            refs = plain.generate(PROMPTS, params)
            if oracle:
                ids = [spec.tokenizer.encode(p) for p in PROMPTS]
                worker.propose = _oracle(worker, {tuple(i): r["output_ids"]
                                                  for i, r in zip(ids, refs, strict=True)})
            outs = spec.generate(PROMPTS, params)
            for ref, out in zip(refs, outs, strict=True):
                assert out["output_ids"] == ref["output_ids"], kw
            if oracle:
                assert all(o["meta_info"]["spec_accept_rate"] == 1.0 for o in outs), kw
    finally:
        worker.propose = original
    assert_kv_all_back(spec)


def test_mixed_and_overlapped_steps_with_processing(ckpts, plain):
    """Arrivals prefilled inside verify steps (MIXED), with the overlap scheduler: greedy rows
    equal target-only; every row, sampled ones too, equals DFlash without mixed steps."""
    prompts = PROMPTS + ["x", "Once upon a time", "1, 2, 3,"]
    params = []
    for i in range(len(prompts)):
        p = {**GREEDY, "max_new_tokens": 6 + 2 * i, **PENALIZED[i % len(PENALIZED)]}
        if i % 3 == 1:
            p.update(temperature=0.9, top_k=20, min_p=0.1, seed=i)
        if i % 3 == 2:
            p.update(min_new_tokens=5, ignore_eos=False)
        params.append(p)

    def dflash(mixed: bool) -> Engine:
        return Engine(model_path=ckpts["tiny-k3"], speculative_algorithm="DFLASH",
                      speculative_draft_model_path=ckpts["tiny-k3-dflash"],
                      enable_mixed_chunk=mixed, mixed_chunk_max_prefill_tokens=16,
                      disable_overlap_schedule=False,
                      **{**COMMON, "max_running_requests": 3, "cuda_graph_bs_decode": [1, 2, 3]})

    mixed = dflash(True)
    got = mixed.generate(prompts, params)
    assert mixed.scheduler.stats["mixed_steps"] > 0
    want = dflash(False).generate(prompts, params)
    target = plain.generate(prompts, params)
    for i, (g, w, t) in enumerate(zip(got, want, target, strict=True)):
        assert g["output_ids"] == w["output_ids"], i
        if "seed" not in params[i]:
            assert g["output_ids"] == t["output_ids"], i
    assert_kv_all_back(mixed)


if __name__ == "__main__":
    sys.exit(pytest.main([__file__, "-q"]))
