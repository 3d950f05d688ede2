"""Tensor parallelism through the offline Engine, on the CPU with gloo, in real processes:
`--tp-size 2` greedy output equals `--tp-size 1` token for token (fp32) for the Llama, Qwen2,
Qwen3 and K3-style families, target-only and with their DFlash drafts (greedy DFlash is lossless,
so it equals target-only), seeded sampling too, the chunk pacer's time-driven schedule
taken from rank 0 on every rank; `--tp-size 4` replicates the two KV heads;
each rank holds its share of the heads and the whole-width aux storage; a draft vocabulary's
cut head on every rank."""

import sys

import pytest

from sglang_aux.srt.configs.presets import PRESETS
from sglang_aux.srt.entrypoints.engine import Engine
from sglang_aux.test.ci.ci_register import register_cpu_ci
from sglang_aux.test.hf_checkpoints import save_tiny_qwen2
from sglang_aux.test.runtime_utils import tiny_checkpoint

register_cpu_ci(est_time=120, suite="default")

PROMPTS = ["Hi", "The quick brown fox jumps over", "12 + 30 =", "Natalia sold clips to 48"]
GREEDY = {"temperature": 0, "max_new_tokens": 12, "ignore_eos": True}
SAMPLED = {"temperature": 0.9, "top_p": 0.9, "max_new_tokens": 12, "ignore_eos": True,
           "sampling_seed": 7}
# dist_timeout: a bug that leaves the ranks out of step fails a collective, not the CI job
ENGINE = {"device": "cpu", "max_total_tokens": 2048, "max_running_requests": 4,
          "cuda_graph_bs_decode": [1, 2, 4], "dist_timeout": 60}


@pytest.fixture(scope="module")
def root(tmp_path_factory):
    return tmp_path_factory.mktemp("ckpt")


def _generate(params: dict | list[dict], prompts=PROMPTS, **kwargs) -> tuple[list, Engine]:
    """Output ids of `prompts`, and the engine (shut down: its other ranks have stopped)."""
    engine = Engine(**ENGINE, **kwargs)
    try:
        outs = engine.generate(prompts, params)
    finally:
        engine.shutdown()
    return outs, engine


def _flat(x) -> list:
    """The scalars of SGLang's nested logprob entries, in order."""
    return [v for item in x for v in _flat(item)] if isinstance(x, list | tuple) else [x]


def _ids(outs: list[dict]) -> list[list[int]]:
    return [o["output_ids"] for o in outs]


@pytest.mark.parametrize("target,draft", [("tiny-llama", "tiny-llama-dflash"),
                                          ("tiny-qwen3", "tiny-qwen3-dflash"),
                                          ("tiny-k3", "tiny-k3-dflash")])
def test_tp2_greedy_equals_tp1_target_only_and_dflash(root, target, draft):
    path = tiny_checkpoint(target, root)
    ref, _ = _generate(GREEDY, model_path=path)
    tp2, engine = _generate(GREEDY, model_path=path, tp_size=2)
    assert _ids(tp2) == _ids(ref)
    assert len({tuple(i) for i in _ids(ref)}) > 1
    runner = engine.worker.model_runner
    heads = PRESETS[target]["num_key_value_heads"]
    assert runner.token_to_kv_pool.k_buffer[0].shape[1] == heads // 2  # this rank's KV heads

    dflash = {"speculative_algorithm": "DFLASH",
              "speculative_draft_model_path": tiny_checkpoint(draft, root)}
    spec, engine = _generate(GREEDY, model_path=path, tp_size=2, **dflash)
    assert _ids(spec) == _ids(ref)  # greedy DFlash at TP2 is lossless too
    assert all(o["meta_info"]["spec_verify_ct"] > 0 for o in spec)
    # rank 0's target runner owns the whole-width aux storage [rows, K * hidden]
    draft_cfg = PRESETS[draft]["dflash_config"]
    width = len(draft_cfg["target_layer_ids"]) * PRESETS[target]["hidden_size"]
    assert engine.worker.target_runner.aux_storage.buffer.shape[1] == width


@pytest.mark.parametrize("schedule", ["flag", "derived"])
def test_tp2_static_verify_narrower_per_batch_size_equals_tp1(root, schedule, tmp_path):
    """Static verify under a draft length schedule at TP2: every rank captures the same
    narrower graphs (the derived schedule from rank 0's measured costs) and steps them in
    lockstep; greedy output equals target-only's."""
    path = tiny_checkpoint("tiny-llama", root)
    ref, _ = _generate(GREEDY, model_path=path)
    profile = tmp_path / "profile.json"
    profile.write_text('{"accept_histogram": [0.2, 0.4, 0.2, 0.2]}')
    narrow = ({"speculative_draft_len_schedule": "1:4,3:2"} if schedule == "flag"
              else {"speculative_acceptance_profile": str(profile)})
    spec, engine = _generate(GREEDY, model_path=path, tp_size=2, speculative_algorithm="DFLASH",
                             speculative_draft_model_path=tiny_checkpoint("tiny-llama-dflash",
                                                                          root), **narrow)
    assert _ids(spec) == _ids(ref)
    info = engine.worker.server_info()["speculative_draft_len_schedule"]
    assert info["source"] == schedule
    if schedule == "flag":
        assert {(x.step_bs, x.tokens_per_req) for x in
                engine.worker.target_runner.step_graphs.layouts} >= {(4, 2), (4, 4)}


def test_tp2_qwen2_biases_and_untied_head_equal_tp1(root):
    """A Qwen2 checkpoint transformers saved: q/k/v biases cut with their rows, an untied LM
    head split by vocabulary."""
    pytest.importorskip("transformers", reason="the checkpoint is saved by transformers")
    path = save_tiny_qwen2(root / "qwen2")
    ref, _ = _generate(GREEDY, model_path=path)
    tp2, _ = _generate(GREEDY, model_path=path, tp_size=2)
    assert _ids(tp2) == _ids(ref)


def test_tp2_sampled_dflash_equals_tp1(root):
    """Seeded sampling: rank 0's drafts and verdicts are the ones every rank commits."""
    dflash = {"model_path": tiny_checkpoint("tiny-llama", root), "speculative_algorithm":
              "DFLASH", "speculative_draft_model_path": tiny_checkpoint("tiny-llama-dflash", root)}
    ref, _ = _generate(SAMPLED, **dflash)
    tp2, _ = _generate(SAMPLED, tp_size=2, **dflash)
    assert _ids(tp2) == _ids(ref)
    greedy, _ = _generate(GREEDY, **dflash)
    assert _ids(ref) != _ids(greedy)  # the sampling really sampled


def test_tp2_draft_vocabulary_equals_tp1(root, tmp_path):
    """`--speculative-token-map` at TP2: each rank's cut head gathers the map's rows from both
    vocabulary shards and proposes without a gather; greedy and seeded sampling equal TP1's
    with the same map, greedy the target's."""
    import torch

    ids = torch.randperm(320, generator=torch.Generator().manual_seed(1))[:200]
    torch.save(ids, tmp_path / "map.pt")
    dflash = {"model_path": tiny_checkpoint("tiny-llama", root), "speculative_algorithm":
              "DFLASH", "speculative_draft_model_path": tiny_checkpoint("tiny-llama-dflash", root),
              "speculative_token_map": str(tmp_path / "map.pt")}
    target, _ = _generate(GREEDY, model_path=dflash["model_path"])
    for params in (GREEDY, SAMPLED):
        ref, _ = _generate(params, **dflash)
        tp2, engine = _generate(params, tp_size=2, **dflash)
        assert _ids(tp2) == _ids(ref)
        assert [o["meta_info"]["spec_accept_histogram"] for o in tp2] == \
            [o["meta_info"]["spec_accept_histogram"] for o in ref]
    assert _ids(ref) != _ids(target)  # the sampling really sampled
    greedy, _ = _generate(GREEDY, tp_size=2, **dflash)
    assert _ids(greedy) == _ids(target)
    assert engine.worker.draft_runner.model.lm_head_weight.shape[0] == 200


def test_tp2_mixed_chunked_prefill_and_logprobs_equal_tp1(root):
    """Followers replay rank 0's scheduling whatever it decides: arrivals riding in verify
    steps (MIXED), prompts prefilled in chunks, more prompts than running slots; then prompt
    and output logprobs (requests that run apart) from the gathered LM head."""
    kwargs = {"model_path": tiny_checkpoint("tiny-k3", root), "speculative_algorithm": "DFLASH",
              "speculative_draft_model_path": tiny_checkpoint("tiny-k3-dflash", root),
              "enable_mixed_chunk": True, "mixed_chunk_max_prefill_tokens": 16,
              "chunked_prefill_size": 8, "disable_decode_cuda_graph": True}
    prompts = [*PROMPTS, "A longer prompt that takes a few chunks to prefill", "x"]
    logprob = {"return_logprob": True, "top_logprobs_num": 2}

    def run(**extra):
        engine = Engine(**ENGINE, **kwargs, **extra)
        try:
            outs = engine.generate(prompts, GREEDY)
            stats = dict(engine.scheduler.stats)
            outs += engine.generate(PROMPTS[:2], GREEDY, **logprob, logprob_start_len=0)
            return outs, stats
        finally:
            engine.shutdown()

    (ref, _), (tp2, stats) = run(), run(tp_size=2)
    assert stats["mixed_steps"] > 0 and stats["chunked_prefill_steps"] > 0
    assert _ids(tp2) == _ids(ref)
    for r, t in zip(ref[-2:], tp2[-2:], strict=True):
        for key in ("input_token_logprobs", "output_token_logprobs", "output_top_logprobs"):
            got, want = _flat(t["meta_info"][key]), _flat(r["meta_info"][key])
            assert [v for v in got if not isinstance(v, float)] == \
                [v for v in want if not isinstance(v, float)], key  # token ids, None
            assert [v for v in got if isinstance(v, float)] == pytest.approx(
                [v for v in want if isinstance(v, float)], abs=1e-4), key
    assert len(_flat(ref[-1]["meta_info"]["input_token_logprobs"])) > 9


def test_tp2_chunk_pacer_decides_from_rank0s_step_times(root):
    """The chunk pacer steers the schedule by step times, which differ between ranks: the
    followers take rank 0's readings (at share 0.99 the decode steps owed move with every
    millisecond of a chunk step), so every rank runs the same forwards and the output equals
    one rank's."""
    kwargs = {"model_path": tiny_checkpoint("tiny-llama", root),
              "speculative_algorithm": "DFLASH",
              "speculative_draft_model_path": tiny_checkpoint("tiny-llama-dflash", root),
              "enable_mixed_chunk": True, "mixed_chunk_max_prefill_tokens": 16,
              "cuda_graph_tokens_mixed": [4, 8, 16], "chunked_prefill_size": 16,
              "chunked_prefill_decode_share": 0.99,
              "disable_decode_cuda_graph": True}
    prompts = [*PROMPTS, " ".join(["a longer prompt that takes many chunks to prefill"] * 6)]
    params = [{**GREEDY, "max_new_tokens": 60}] * 4 + [GREEDY]

    def run(**extra):
        engine = Engine(**ENGINE, **kwargs, **extra)
        calls, worker = [], engine.worker
        for name in ("decode", "mixed"):
            real = getattr(worker, name)

            def traced(*a, _real=real, _name=name, **kw):
                calls.append(kw.get("chunk") or _name)
                return _real(*a, **kw)
            setattr(worker, name, traced)
        try:
            return engine.generate(prompts, params), calls
        finally:
            engine.shutdown()

    (ref, _), (tp2, calls) = run(), run(tp_size=2)
    chunks = [i for i, c in enumerate(calls) if isinstance(c, int)]
    assert len(chunks) > 3
    assert "decode" in calls[chunks[0]:chunks[-1]], calls  # rank 0 owed decode steps
    assert _ids(tp2) == _ids(ref)


def test_tp4_replicates_kv_heads(root):
    """Two KV heads over four ranks: each rank holds the one its query head reads."""
    path = tiny_checkpoint("tiny-qwen3", root)
    ref, _ = _generate(GREEDY, PROMPTS[:2], model_path=path)
    tp4, engine = _generate(GREEDY, PROMPTS[:2], model_path=path, tp_size=4)
    assert _ids(tp4) == _ids(ref)
    assert engine.worker.model_runner.token_to_kv_pool.k_buffer[0].shape[1] == 1


def test_heads_that_do_not_divide_fail_clearly(root):
    with pytest.raises(ValueError, match="is not divisible by --tp-size 3"):
        Engine(**ENGINE, model_path=tiny_checkpoint("tiny-llama", root), tp_size=3)


if __name__ == "__main__":
    sys.exit(pytest.main([__file__, "-v"]))
