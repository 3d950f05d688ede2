"""A target and drafts whose sampling laws are known exactly, for the law tests of speculative
sampling (test_acceptance_law.py, and its CUDA twin).

The pair: a target whose every token embeds alike (all embedding rows equal) and whose layers
add nothing (zero o_proj / down_proj), so its next-token law is the same at every position,
p = softmax(lm_head . norm(e)) restricted to the top k; and a DFlash draft in the published
layout built from the target's own weights: its layers add nothing either and its final norm
is the target's, perturbed by `DRAFT_NOISE`, so its proposals q overlap p and blocks reach
the bonus. The DSpark draft is the same with a Markov head of random weights in the noisy
pair, so its proposal law changes with the token before it (the anchor for the first). All
laws are computed here in float64 from the checkpoints, not by the runtime; the engines run
float32.
"""

from __future__ import annotations

from pathlib import Path

import torch
from safetensors.torch import load_file, save_file

from sglang_aux.srt.entrypoints.engine import Engine
from sglang_aux.srt.model_loader.preset_checkpoint import write_checkpoint
from sglang_aux.test.runtime_utils import assert_kv_all_back, record_verdict_rows
from sglang_aux.test.sampling_law import FALSE_ALARM, chi_square, position_laws

TOP_K = 8
DRAFT_NOISE = 0.3  # relative noise on the draft's final norm: acceptance ~0.6 per position
REQUESTS, NEW_TOKENS = 32, 150
SAMPLED = {"temperature": 1.0, "top_k": TOP_K, "ignore_eos": True}
CAPTURED = [1, 2, 4]
PROMPT = [72, 105, 33]
DRAFTS = {"DFLASH": "tiny-llama-dflash", "DSPARK": "tiny-llama-dspark"}
MARKOV_SCALE = 0.3  # the Markov weights' scale: a bias of std ~0.4 on the draft's logits


def silence_layers(tensors: dict) -> None:
    for name, t in tensors.items():
        if name.endswith(("o_proj.weight", "down_proj.weight")):
            t.zero_()


def law(tensors: dict, norm_weight: torch.Tensor,
         bias: torch.Tensor | None = None) -> torch.Tensor:
    """The float64 top-k law of lm_head . (w * e / rms(e)) at temperature 1 `[V]`; with
    `bias` `[W, V]` added to the logits, one law per bias row `[W, V]`."""
    e = tensors["model.embed_tokens.weight"][0].double()
    h = norm_weight.double() * e / torch.sqrt((e * e).mean() + 1e-6)
    logits = tensors["lm_head.weight"].double() @ h
    if bias is not None:
        logits = logits + bias.double()
    top = logits.topk(TOP_K, dim=-1).indices
    p = torch.zeros_like(logits).scatter_(-1, top, torch.softmax(logits.gather(-1, top), -1))
    return p


def write_pair(root: Path, draft_norm_scale, algorithm: str = "DFLASH", markov: bool = False
                ) -> tuple[str, str, torch.Tensor, torch.Tensor]:
    """(target, draft, p, q) with the draft's final norm = the target's times
    `draft_norm_scale(target_norm)`; q `[V]`, or for DSpark `[V, V]`, the draft's law after
    each previous token (its Markov head random with `markov`, else zero)."""
    target, draft = root / "target", root / "draft"
    write_checkpoint("tiny-qwen3", target)
    write_checkpoint(DRAFTS[algorithm], draft)
    t = load_file(str(target / "model.safetensors"))
    t["model.embed_tokens.weight"][:] = t["model.embed_tokens.weight"][0]
    silence_layers(t)
    save_file(t, str(target / "model.safetensors"))
    d = load_file(str(draft / "model.safetensors"))
    silence_layers(d)
    d["norm.weight"] = draft_norm_scale(t["model.norm.weight"])
    bias = None
    if algorithm == "DSPARK":
        g = torch.Generator().manual_seed(1)
        for name in ("markov_head.markov_w1.weight", "markov_head.markov_w2.weight"):
            d[name] = (MARKOV_SCALE * torch.randn(d[name].shape, generator=g) if markov
                       else torch.zeros_like(d[name]))
        bias = d["markov_head.markov_w1.weight"] @ d["markov_head.markov_w2.weight"].t()
    save_file(d, str(draft / "model.safetensors"))
    return (str(target), str(draft), law(t, t["model.norm.weight"]),
            law(t, d["norm.weight"], bias))


def noisy(w: torch.Tensor) -> torch.Tensor:
    return w * (1 + DRAFT_NOISE * torch.randn(w.shape, generator=torch.Generator().manual_seed(0)))


def law_pairs(root: Path) -> dict:
    """(algorithm, kind) -> `write_pair`: the noisy (Markov head for DSpark), the oracle (the
    target's own law) and the adversarial (disjoint top-k) draft of each algorithm."""
    return {(algo, name): write_pair(root / algo / name, scale, algo, markov=name == "noisy")
            for algo in DRAFTS for name, scale in (
                ("noisy", noisy), ("oracle", lambda w: w.clone()),
                ("adversarial", lambda w: -w))}


def law_engine(pair, algorithm="DFLASH", verify_mode="static", device="cpu", **kw) -> Engine:
    """The pair served (float32 wherever it runs: the laws are float64)."""
    target, draft, _, _ = pair
    return Engine(model_path=target, speculative_algorithm=algorithm,
                  speculative_draft_model_path=draft, device=device, dtype="float32",
                  speculative_verify_mode=verify_mode,
                  **{"max_total_tokens": 8192, "max_running_requests": 4,
                     "cuda_graph_bs_decode": CAPTURED, **kw})


def record_steps(worker, with_rids: bool = False) -> list[list]:
    """Every decode step's emitted tokens per request (with `with_rids`, as (request id,
    tokens)), from now on."""
    steps, decode = [], worker.decode

    def step(reqs):
        out = decode(reqs)
        rows = out.tokens()
        steps.append([(r.rid, row) for r, row in zip(reqs, rows, strict=True)] if with_rids
                     else rows)
        return out

    worker.decode = step
    return steps


def anchored_blocks(steps, outs) -> list[tuple[int, list[int]]]:
    """(anchor, emitted tokens) of every verified block: the anchor is the token before it."""
    last = {f"req-{i}": o["output_ids"][0] for i, o in enumerate(outs)}
    blocks = []
    for step in steps:
        for rid, row in step:
            if row:
                blocks.append((last[rid], row))
                last[rid] = row[-1]
    return blocks


def block_laws(p: torch.Tensor, q: torch.Tensor, b: int, anchors: set[int]
                ) -> dict[int | None, torch.Tensor]:
    """Per anchor (None: any, for a draft law that ignores it), `position_laws` of a block."""
    vocab = p.numel()
    targets = [p.expand(vocab, -1)] * (b - 1)
    if q.dim() == 1:
        return {None: position_laws(p, targets, q.expand(b - 1, -1))}
    return {a: position_laws(p, targets, [q[a][None], *[q] * (b - 2)]) for a in anchors}


def assert_block_positions_follow_the_target_law(pairs: dict, algorithm: str,
                                                 device: str = "cpu",
                                                 width: int | None = None) -> None:
    """Each emitted block position i: the token and whether the block went on, against p and
    min(p, q) / p (the bonus: p, and the block ends), over the blocks of each anchor (DSpark's
    proposal law depends on it); the first token (sampled after the prefill) against p.
    FALSE_ALARM is shared by the B + 1 tests; `scripts/sampler_test_power.py` gives their
    power. `width`: static verify of the blocks' leading `width` tokens only (a draft length
    schedule narrower than the block), so blocks of that width follow the same laws."""
    _, _, p, q = pair = pairs[algorithm, "noisy"]
    narrower = {} if width is None else {"speculative_draft_len_schedule": f"1:{width}"}
    engine = law_engine(pair, algorithm, device=device, max_running_requests=REQUESTS,
                        cuda_graph_bs_decode=[REQUESTS], **narrower)
    b = engine.worker.verify_width
    if width is not None:
        assert width < b and {x.tokens_per_req for x in
                              engine.worker.target_runner.step_graphs.layouts} == {width, b}
        b = width
    steps = record_steps(engine.worker, with_rids=True)
    params = [dict(SAMPLED, max_new_tokens=NEW_TOKENS, seed=i) for i in range(REQUESTS)]
    outs = engine.generate(input_ids=[PROMPT] * REQUESTS, sampling_params=params)
    alpha = FALSE_ALARM / (b + 1)
    vocab = p.numel()
    first = torch.bincount(torch.tensor([o["output_ids"][0] for o in outs]), minlength=vocab)
    pvalue, tv, _ = chi_square(first, p)
    assert pvalue > alpha, ("first token", pvalue, tv)
    blocks = anchored_blocks(steps, outs)
    laws = block_laws(p, q, b, {a for a, _ in blocks})
    law_of = (lambda a: laws[None]) if None in laws else laws.__getitem__
    assert sum(float(law_of(a)[-1, -1]) for a, _ in blocks) < 0.8 * len(blocks), \
        "blocks must reach the bonus often"
    for i in range(b):
        # cells: (x, goes on), (x, stops), not reached; the expected law mixes the anchors'
        cells = torch.tensor([row[i] if len(row) > i + 1 else vocab + row[i] if len(row) > i
                              else 2 * vocab for _, row in blocks])
        counts = torch.bincount(cells, minlength=2 * vocab + 1)
        law = sum(law_of(a)[i] for a, _ in blocks) / len(blocks)
        pvalue, tv, df = chi_square(counts, law)
        assert pvalue > alpha, (f"block position {i}", pvalue, tv, df, len(cells))
    assert_kv_all_back(engine)


def assert_compact_verify_keeps_the_target_law(pairs: dict, algorithm: str,
                                               device: str = "cpu") -> None:
    """Compact verify: each request verifies its own number of drafts, chosen from the
    confidences (DSpark's head, DFlash's draft probabilities) before the target runs;
    whatever it verifies, every emitted token (the target's law is the same at every
    position) must follow p, block position by block position, and the lengths must vary."""
    _, _, p, _ = pair = pairs[algorithm, "noisy"]
    # the full width at every batch size (no derived schedule): every block position is tested
    engine = law_engine(pair, algorithm, "compact", device=device,
                        max_running_requests=REQUESTS,
                     cuda_graph_bs_decode=[REQUESTS], speculative_draft_len_schedule="1:4")
    worker = engine.worker
    b = worker.verify_width
    assert b == 4
    steps = record_steps(worker)
    rows = record_verdict_rows(worker)
    params = [dict(SAMPLED, max_new_tokens=NEW_TOKENS, seed=i) for i in range(REQUESTS)]
    outs = engine.generate(input_ids=[PROMPT] * REQUESTS, sampling_params=params)
    # no block accepts past its verified drafts, and the cap binds often
    verdicts = [(row[0], row[-1]) for row in rows]  # accepted drafts, tokens verified
    assert all(accepted <= length - 1 for accepted, length in verdicts)
    assert sum(accepted == length - 1 < b - 1 for accepted, length in verdicts) > 100
    spent = sum(o["meta_info"]["spec_verify_tokens"] for o in outs)
    assert spent < b * sum(o["meta_info"]["spec_verify_ct"] for o in outs)
    alpha = FALSE_ALARM / b
    blocks = [row for s in steps for row in s]
    for i in range(b):
        tokens = torch.tensor([row[i] for row in blocks if len(row) > i], dtype=torch.long)
        pvalue, tv, df = chi_square(torch.bincount(tokens, minlength=p.numel()), p)
        assert pvalue > alpha, (f"block position {i}", pvalue, tv, df, len(tokens))
    assert_kv_all_back(engine)
