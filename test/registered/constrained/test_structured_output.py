"""Structured output with xgrammar on the Engine: regex, JSON schema and EBNF outputs follow
their grammar although a tiny random model would not, target-only and with DFlash (greedy
DFlash equals target-only token for token, fp32), with and without the overlap scheduler,
beside requests without a grammar (unchanged by their neighbours' masks) and combined with
penalties, min_p and sampling. The pieces below them: the grammar check, the bitmask, the
block masks a DFlash verify uses, the compiled-grammar cache, and a compile that does not
stall the running batch."""

import sys
import threading

import pytest
import torch

from sglang_aux.srt.entrypoints.engine import Engine
from sglang_aux.srt.model_loader.tokenizer import Tokenizer
from sglang_aux.srt.sampling.sampling_params import SamplingParams
from sglang_aux.test.ci.ci_register import register_cpu_ci
from sglang_aux.test.grammar_cases import EBNF, GRAMMARS, REGEX, SCHEMA, check_output
from sglang_aux.test.runtime_utils import assert_kv_all_back, flat_step_costs, tiny_checkpoint

register_cpu_ci(est_time=60, suite="default")

pytest.importorskip("xgrammar", reason="structured output needs xgrammar ([grammar] extra)")

from sglang_aux.srt.constrained.grammar_backend import GrammarBackend  # noqa: E402
from sglang_aux.srt.constrained.request_grammar import batch_bitmask  # noqa: E402
from sglang_aux.srt.constrained.token_bitmask import (  # noqa: E402
    apply_token_bitmask,
    bitmask_words,
    is_allowed,
)

PROMPTS = ["Hi", "The quick brown fox", "x", "12 + 30 =", "What is the capital of France?"]
COMMON = dict(device="cpu", dtype="float32", max_total_tokens=8192, max_running_requests=8,
              cuda_graph_bs_decode=[1, 2, 4, 8])


@pytest.fixture(scope="module")
def ckpts(tmp_path_factory):
    root = tmp_path_factory.mktemp("ckpt")
    return {p: tiny_checkpoint(p, root) for p in ("tiny-llama", "tiny-llama-dflash")}


def _engine(ckpts, kind: str, overlap: bool) -> Engine:
    """Without overlap, JSON compiles compact (`--constrained-json-disable-any-whitespace`): a
    sampling random model may wander in the whitespace JSON allows until max_new_tokens."""
    spec = {} if kind == "target" else dict(
        speculative_algorithm="DFLASH", speculative_draft_model_path=ckpts["tiny-llama-dflash"])
    return Engine(model_path=ckpts["tiny-llama"], disable_overlap_schedule=not overlap,
                  constrained_json_disable_any_whitespace=not overlap, **spec, **COMMON)


@pytest.fixture(scope="module")
def engines(ckpts):
    return {(kind, overlap): _engine(ckpts, kind, overlap)
            for kind in ("target", "dflash") for overlap in (False, True)}


def _batch(extra: dict) -> list[dict]:
    """Each grammar, then a request without one, all with `extra`."""
    return [{"max_new_tokens": 96, **g, **extra} for g in GRAMMARS] + [
        {"max_new_tokens": 24, "ignore_eos": True, **extra}]


def test_grammar_fields_are_checked_by_name():
    assert SamplingParams.from_dict({"regex": REGEX}).grammar_key == ("regex", REGEX)
    for params, words in [({"regex": "(a"}, "regex is not valid"),
                          ({"json_schema": '{"type": "objec"}'}, "json_schema is not valid"),
                          ({"json_schema": "{"}, "json_schema is not valid"),
                          ({"ebnf": "root ::= foo"}, "ebnf is not valid"),
                          ({"structural_tag": '{"type": "structural_tag"}'}, "structural_tag"),
                          ({"regex": "a", "ebnf": EBNF}, "at most one"),
                          ({"json_schema": SCHEMA}, "json_schema must be a string")]:
        with pytest.raises(ValueError, match=words) as err:
            SamplingParams.from_dict(params)
        assert "/project/" not in str(err.value)  # xgrammar's source location is dropped


def test_apply_token_bitmask():
    g = torch.Generator().manual_seed(0)
    logits = torch.randn(3, 70, generator=g)
    bitmask = torch.randint(-2**31, 2**31 - 1, (3, bitmask_words(70)), generator=g,
                            dtype=torch.int32)
    out = apply_token_bitmask(logits.clone(), bitmask)
    for r in range(3):
        for t in range(70):
            want = logits[r, t] if is_allowed(bitmask, r, t) else float("-inf")
            assert out[r, t] == want
    with pytest.raises(ValueError, match=r"\(3, 3\).*\(3, 2\)"):
        apply_token_bitmask(logits, bitmask[:, :2])


def _backend() -> tuple[GrammarBackend, Tokenizer]:
    tok = Tokenizer.byte_level()
    return GrammarBackend(tok.vocab_bytes, tok.vocab_size + 4, [tok.eos_token_id]), tok


def _allowed(bitmask, row, vocab) -> set[int]:
    return {t for t in range(vocab) if is_allowed(bitmask, row, t)}


def test_block_masks_walk_the_drafts_and_roll_back():
    backend, tok = _backend()
    vocab = backend.vocab_size
    grammar = backend.new_grammar(backend.compile(("regex", REGEX)).result(), [])
    digits, dash = set(tok.encode("0123456789")), set(tok.encode("-"))
    bitmask = batch_bitmask([grammar], vocab, [tok.encode("123-n")])
    assert [_allowed(bitmask, j, vocab) for j in range(6)] == [
        digits, digits, digits, dash, set(tok.encode("yn")), set(tok.encode("o"))]
    # past a draft the grammar forbids ("x"), rows allow everything: never sampled from
    bitmask = batch_bitmask([grammar, None], vocab, [tok.encode("1x3"), tok.encode("abc")])
    assert _allowed(bitmask, 1, vocab) == digits
    assert [len(_allowed(bitmask, j, vocab)) for j in (2, 3, 4, 5, 6, 7)] == [vocab] * 6
    # the matcher is where it started
    assert all(grammar.accept(t) for t in tok.encode("123-"))
    assert not grammar.accept(tok.encode("x")[0])


def test_compiled_grammars_are_cached_and_failures_kept_apart():
    backend, _ = _backend()
    future = backend.compile(("regex", REGEX))
    assert backend.compile(("regex", REGEX)) is future
    a, b = (backend.new_grammar(future.result(), []) for _ in range(2))
    assert a.accept(_tok_id("7")) and not b.accept(_tok_id("-"))  # matchers are their own
    with pytest.raises(ValueError, match="regex is not valid"):
        backend.compile(("regex", "(")).result()
    backend.shutdown()


def _tok_id(ch: str) -> int:
    return Tokenizer.byte_level().encode(ch)[0]


@pytest.mark.parametrize("overlap", [False, True])
def test_greedy_outputs_follow_their_grammar_and_dflash_equals_target_only(engines, overlap):
    params = _batch({"temperature": 0})
    prompts = PROMPTS[: len(params)]
    ref = engines["target", overlap].generate(prompts, params)
    for p, o in zip(params, ref, strict=True):
        check_output(p, o["text"])
    assert [o["meta_info"]["finish_reason"]["type"] for o in ref[:3]] == ["stop"] * 3
    # the request without a grammar is unchanged by its neighbours' masks
    alone = engines["target", overlap].generate(prompts[3], params[3])
    assert ref[3]["output_ids"] == alone["output_ids"]
    outs = engines["dflash", overlap].generate(prompts, params)
    for r, o in zip(ref, outs, strict=True):
        assert o["output_ids"] == r["output_ids"]
        assert o["meta_info"]["finish_reason"] == r["meta_info"]["finish_reason"]
    assert sum(o["meta_info"]["spec_verify_ct"] for o in outs) > 0
    for engine in (engines["target", overlap], engines["dflash", overlap]):
        assert_kv_all_back(engine)


@pytest.mark.parametrize("kind", ["target", "dflash"])
@pytest.mark.parametrize("extra", [
    {"temperature": 1.0, "top_p": 0.9},
    {"temperature": 0, "repetition_penalty": 1.8, "frequency_penalty": 0.5},
    {"temperature": 0.8, "min_p": 0.1, "presence_penalty": 1.0, "min_new_tokens": 4},
])
def test_sampling_and_penalties_stay_in_the_grammar(engines, kind, extra):
    params = [{**p, "seed": i} for i, p in enumerate(_batch(extra))]
    outs = engines[kind, False].generate(PROMPTS[: len(params)], params)
    for p, o in zip(params, outs, strict=True):
        check_output(p, o["text"])
        assert len(o["output_ids"]) >= extra.get("min_new_tokens", 0)


@pytest.mark.parametrize("mode", ["static", "compact"])
def test_dspark_greedy_with_a_grammar_equals_target_only(engines, ckpts, tmp_path, mode):
    """DSpark's verify applies the same block masks; compact verifies every token of a
    grammar batch (its ragged rows would not line up with the masks)."""
    dspark = Engine(model_path=ckpts["tiny-llama"],
                    speculative_algorithm="DSPARK", speculative_verify_mode=mode,
                    speculative_draft_model_path=tiny_checkpoint("tiny-llama-dspark", tmp_path),
                    disable_overlap_schedule=True, constrained_json_disable_any_whitespace=True,
                    **({"speculative_step_costs": flat_step_costs(tmp_path)} if mode == "compact"
                       else {}), **COMMON)
    params = _batch({"temperature": 0})
    ref = engines["target", False].generate(PROMPTS[: len(params)], params)
    outs = dspark.generate(PROMPTS[: len(params)], params)
    assert [o["output_ids"] for o in outs] == [r["output_ids"] for r in ref]
    assert sum(o["meta_info"]["spec_verify_ct"] for o in outs) > 0
    assert_kv_all_back(dspark)
    dspark.shutdown()


def test_dflash_greedy_with_penalties_and_grammar_equals_target_only(engines):
    params = _batch({"temperature": 0, "repetition_penalty": 1.5, "presence_penalty": 0.7})
    ref = engines["target", False].generate(PROMPTS[: len(params)], params)
    outs = engines["dflash", False].generate(PROMPTS[: len(params)], params)
    assert [o["output_ids"] for o in outs] == [r["output_ids"] for r in ref]


def test_a_compile_does_not_stall_the_running_batch(engines, monkeypatch):
    """While a grammar compiles, the running request keeps decoding; the grammar request
    waits outside the batch and runs once its grammar is ready."""
    engine = engines["target", False]
    sched, backend = engine.scheduler, engine.scheduler.grammar_backend
    release, compile_ = threading.Event(), backend._compile
    monkeypatch.setattr(backend, "_compile", lambda key: (release.wait(60), compile_(key))[1])
    plain = engine.make_request(text="Hi", sampling_params={"temperature": 0,
                                                            "max_new_tokens": 8,
                                                            "ignore_eos": True})
    slow = engine.make_request(text="x", sampling_params={"temperature": 0,
                                                          "regex": "[a-z]{1,9}[0-9]"})
    sched.add_request(plain)
    sched.add_request(slow)
    while not plain.finished:
        sched.step()
    assert len(plain.output_ids) == 8 and not slow.output_ids and sched.grammar_queue
    release.set()
    while not slow.finished:
        sched.step()
    check_output({"regex": "[a-z]{1,9}[0-9]"}, engine.output_of(slow)["text"])


def test_a_bad_grammar_fails_alone(engines):
    engine = engines["dflash", False]
    with pytest.raises(ValueError, match="ebnf is not valid"):
        engine.make_request(text="Hi", sampling_params={"ebnf": "root ::= "})
    out = engine.generate("Hi", {"temperature": 0, "max_new_tokens": 40, "regex": REGEX})
    check_output({"regex": REGEX}, out["text"])


if __name__ == "__main__":
    sys.exit(pytest.main([__file__, "-q"]))
