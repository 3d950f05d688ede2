"""The draft vocabulary (`--speculative-token-map`, `speculative/token_map.py`) end to end on
CPU, for DFlash and DSpark drafts: SGLang's file read and refused where it would be wrong; the
cut head is the target's rows, also across two gloo ranks (each holds a vocabulary shard); a
map of every id in another order proposes exactly what no map does (greedy and seeded sampling
alike: the same tokens, the same accept counts); a map without the tokens the target writes
keeps the output the target's and accepts nothing; its DRAFT_BLOCK graphs' logits are H wide
at every captured size and a padded one; the tool writes a map the flag reads."""

import multiprocessing as mp
import re
import sys

import pytest
import torch

from sglang_aux.srt.distributed.parallel_state import (
    destroy_distributed_environment,
    init_distributed_environment,
)
from sglang_aux.srt.entrypoints.engine import Engine
from sglang_aux.srt.model_loader.builtin import trained_draft_dir
from sglang_aux.srt.model_loader.model_cache import CACHE_ENV
from sglang_aux.srt.server_args import ServerArgs
from sglang_aux.srt.speculative.token_map import cut_lm_head, load_token_map
from sglang_aux.test.ci.ci_register import register_cpu_ci
from sglang_aux.test.runtime_utils import (
    CAPTURED_BS,
    SPEC_ENGINE_KW,
    SPEC_PROMPTS,
    STAGGERED,
    assert_kv_all_back,
    assert_spec_counts,
    pair_checkpoints,
)
from sglang_aux.test.server_utils import free_port
from sglang_aux.tools import build_token_map
from sglang_aux.tools.dflash_training.data import Sample, save_samples

register_cpu_ci(est_time=60, suite="default")

DRAFTS = {"DFLASH": "tiny-llama-dflash", "DSPARK": "tiny-llama-dspark"}
VOCAB = 320  # the tiny presets'
NOT_IDS = "needs a non-empty 1-D list of integer token ids, got"
SAMPLED = [{"temperature": 0.9, "top_p": 0.9, "max_new_tokens": n, "ignore_eos": True,
            "sampling_seed": 7 + n} for n in (26, 19, 12, 6)]


@pytest.fixture(scope="module")
def ckpts(tmp_path_factory):
    return pair_checkpoints(tmp_path_factory.mktemp("ckpt"), {}, "tiny-llama", *DRAFTS.values())


def _engine(ckpts, algorithm: str, token_map: str | None = None, **kw) -> Engine:
    return Engine(model_path=ckpts["tiny-llama"], speculative_algorithm=algorithm,
                  speculative_draft_model_path=ckpts[DRAFTS[algorithm]],
                  speculative_token_map=token_map, **{**SPEC_ENGINE_KW, **kw})


def _save(path, ids) -> str:
    torch.save(ids, path)
    return str(path)


def _meta(outs: list[dict]) -> list[tuple]:
    return [(o["output_ids"], o["meta_info"]["spec_accept_histogram"]) for o in outs]


def test_the_file_is_read_as_sglang_writes_it(tmp_path):
    ids = torch.tensor([7, 3, 300, 0], dtype=torch.int32)
    got = load_token_map(_save(tmp_path / "t.pt", ids), VOCAB)
    assert got.dtype == torch.int64 and got.tolist() == [7, 3, 300, 0]  # the file's order
    assert load_token_map(_save(tmp_path / "l.pt", [5, 1]), VOCAB).tolist() == [5, 1]


@pytest.mark.parametrize("ids,match", [
    (torch.tensor([1, 320]), r"id 320 is outside the target's vocabulary \[0, 320\) \(1 such"),
    (torch.tensor([-1, 2]), r"id -1 is outside"),
    (torch.tensor([4, 9, 4, 9, 4]), r"id 4 is listed more than once \(3 repeats\)"),
    (torch.tensor([[1, 2]]), rf"{NOT_IDS} torch.int64 \(1, 2\)"),
    (torch.tensor([1.0, 2.0]), rf"{NOT_IDS} torch.float32 \(2,\)"),
    (torch.tensor([], dtype=torch.int64), rf"{NOT_IDS} torch.int64 \(0,\)"),
    ({"ids": [1]}, r"holds dict, not a tensor or list"),
])
def test_a_wrong_map_is_refused_naming_what(tmp_path, ids, match):
    path = _save(tmp_path / "bad.pt", ids)
    with pytest.raises(ValueError, match=rf"--speculative-token-map {path}: {match}"):
        load_token_map(path, VOCAB)


def test_a_missing_or_foreign_file_is_refused(tmp_path, monkeypatch):
    monkeypatch.setitem(sys.modules, "huggingface_hub", None)  # no hub client installed
    with pytest.raises(FileNotFoundError, match=r"nope/hot\.pt: no such file \(a hub path "
                                                r"REPO/FILE needs huggingface_hub"):
        load_token_map("nope/hot.pt", VOCAB)
    text = tmp_path / "ids.txt"
    text.write_text("1 2 3\n")
    with pytest.raises(ValueError, match=r"ids\.txt: not a tensor or list of token ids saved "
                                         r"with torch\.save"):
        load_token_map(str(text), VOCAB)


def test_a_built_in_drafts_map_is_named_by_the_draft(tmp_path, monkeypatch):
    """`NAME/freq_32768.pt` reads the file beside the built-in draft NAME (where train_dflash
    writes it), before any hub: a draft without the file, or not trained here, is named."""
    monkeypatch.setenv(CACHE_ENV, str(tmp_path))
    monkeypatch.setitem(sys.modules, "huggingface_hub", None)
    name = "qwen2.5-coder-1.5b-instruct-dflash-b16"
    with pytest.raises(FileNotFoundError, match=rf"draft '{re.escape(name)}' is not trained on "
                                                "this machine"):
        load_token_map(f"{name}/freq_32768.pt", VOCAB)
    folder = trained_draft_dir(name)
    folder.mkdir(parents=True)
    (folder / "config.json").write_text("{}")
    with pytest.raises(FileNotFoundError, match=rf"the draft '{re.escape(name)}' \({folder}\) "
                                                r"has no freq_32768\.pt"):
        load_token_map(f"{name}/freq_32768.pt", VOCAB)
    _save(folder / "freq_32768.pt", torch.tensor([5, 1, 300]))
    assert load_token_map(f"{name}/freq_32768.pt", VOCAB).tolist() == [5, 1, 300]


def test_the_cut_head_is_the_target_rows_on_one_rank():
    head = torch.randn(VOCAB, 16, dtype=torch.bfloat16)
    ids = torch.tensor([300, 2, 17])
    assert torch.equal(cut_lm_head(head, ids, VOCAB), head[ids])
    with pytest.raises(ValueError, match=r"LM head shard \(319, 16\) does not hold this rank's "
                                         r"vocabulary rows \[0, 320\)"):
        cut_lm_head(head[1:], ids, VOCAB)


def _rank(rank: int, port: int, full: torch.Tensor, ids: torch.Tensor, out) -> None:
    init_distributed_environment(world_size=2, rank=rank, local_rank=rank, device="cpu",
                                 dist_init_addr=f"127.0.0.1:{port}", timeout_s=60)
    try:
        shard = full[rank * VOCAB // 2:(rank + 1) * VOCAB // 2]
        out.put((rank, cut_lm_head(shard, ids, VOCAB)))
    finally:
        destroy_distributed_environment()


def test_the_cut_head_gathers_each_ranks_rows_exactly():
    """Two real processes, each with half of the vocabulary's rows: both hold `full[ids]`
    exactly (the ids from both halves, in the map's order)."""
    full = torch.randn(VOCAB, 8, dtype=torch.bfloat16)
    ids = torch.tensor([200, 3, 161, 159, 0, 319])
    ctx = mp.get_context("spawn")
    out, port = ctx.Queue(), free_port()
    procs = [ctx.Process(target=_rank, args=(r, port, full, ids, out)) for r in range(2)]
    for p in procs:
        p.start()
    got = dict(out.get(timeout=120) for _ in procs)
    for p in procs:
        p.join(60)
        assert p.exitcode == 0
    for rank in range(2):
        assert torch.equal(got[rank], full[ids]), rank


@pytest.mark.parametrize("algorithm", list(DRAFTS))
@pytest.mark.parametrize("params", [STAGGERED, SAMPLED], ids=["greedy", "sampled"])
def test_a_map_of_every_id_proposes_what_no_map_does(ckpts, tmp_path, algorithm, params):
    """Every id, the identity order for seeded sampling (its draw walks the map's columns) and
    a shuffled order for greedy: the same tokens and accept counts as the full head (and, for
    DSpark, the full Markov head), at batch sizes 4, 3 (padded to 4), 2 and 1."""
    order = torch.arange(VOCAB) if params is SAMPLED \
        else torch.randperm(VOCAB, generator=torch.Generator().manual_seed(0))
    plain_engine = _engine(ckpts, algorithm)
    plain = plain_engine.generate(SPEC_PROMPTS, params)
    engine = _engine(ckpts, algorithm, _save(tmp_path / "all.pt", order))
    mapped = engine.generate(SPEC_PROMPTS, params)
    assert _meta(mapped) == _meta(plain)
    draft = engine.worker.draft_runner.model
    assert torch.equal(draft.lm_head_weight,
                       engine.worker.target_runner.model.lm_head_weight[order])
    if algorithm == "DSPARK":
        full = plain_engine.worker.draft_runner.model.markov_head.markov_w2.weight
        assert torch.equal(draft.markov_head.markov_w2.weight, full[order])
    assert_kv_all_back(engine)


@pytest.mark.parametrize("algorithm", list(DRAFTS))
def test_a_small_map_stays_lossless_and_its_graphs_are_h_wide(ckpts, tmp_path, algorithm):
    """The draft may propose 40 of the 320 ids, none of those the target writes: the output is
    still the target's, no proposal is accepted, the last ones are map ids, and the draft
    graphs' logits buffer is 40 wide."""
    target_only = Engine(model_path=ckpts["tiny-llama"], **SPEC_ENGINE_KW).generate(
        SPEC_PROMPTS, STAGGERED)
    written = {t for o in target_only for t in o["output_ids"]}
    ids = torch.tensor([t for t in range(VOCAB) if t not in written][:40])
    assert len(ids) == 40
    engine = _engine(ckpts, algorithm, _save(tmp_path / "small.pt", ids))
    engine.worker.proposals.tokens.fill_(-1)
    outs = engine.generate(SPEC_PROMPTS, STAGGERED)
    for ref, out in zip(target_only, outs, strict=True):
        assert out["output_ids"] == ref["output_ids"]
        assert_spec_counts(out["meta_info"], engine.worker.verify_width)
        assert out["meta_info"]["spec_accepted_drafts"] == 0  # it can propose nothing written
    # the last draft step's (one request's) proposals: map ids
    assert torch.isin(engine.worker.proposals.tokens[0], ids).all()
    graphs = engine.worker.draft_runner.step_graphs
    assert sorted({x.step_bs for x in graphs.layouts}) == CAPTURED_BS
    assert graphs.buffers.next_token_logits_buffer.shape[-1] == 40
    assert_kv_all_back(engine)


def test_the_flag_is_refused_without_a_draft(tmp_path):
    path = _save(tmp_path / "m.pt", [1, 2])
    with pytest.raises(ValueError, match=r"--speculative-token-map only act"):
        ServerArgs(model_path="tiny-llama", device="cpu", speculative_algorithm="NONE",
                   speculative_token_map=path)


def test_the_tool_writes_a_map_the_flag_reads(tmp_path, capsys):
    samples = tmp_path / "s.jsonl"
    save_samples([Sample([1], [9, 9, 9, 4, 4, 7]), Sample([1], [4, 9, 2])], samples)
    out = tmp_path / "hot.pt"
    ids = build_token_map.main(["--samples", str(samples), "--size", "3", "--keep", "300",
                                "--out", str(out)])
    assert ids == [300, 9, 4]  # kept first, then by count (9: 4 times, 4: 3)
    assert load_token_map(str(out), VOCAB).tolist() == ids
    assert "3 ids, 77.78% of the 9 tokens" in capsys.readouterr().out
    with pytest.raises(SystemExit):
        build_token_map.main(["--samples", str(samples), "--keep", "5", "5", "--out", str(out)])


if __name__ == "__main__":
    sys.exit(pytest.main([__file__, "-q"]))
