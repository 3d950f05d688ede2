"""Training over several runs (`training_checkpoint.py`, `train_dflash --resume`): k steps in
one run and the rest in the next give the weights of one uninterrupted run, bitwise (fp32,
CPU); the checkpoint is written every N steps and at a run's end; a checkpoint of another run,
or a file that is none, is refused in one line naming it."""

import sys
from dataclasses import replace
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file
from torch import nn

from sglang_aux.srt.configs.presets import MASK_TOKEN_ID, PRESETS
from sglang_aux.test.ci.ci_register import register_cpu_ci
from sglang_aux.test.gsm8k_data import local_path_or_skip
from sglang_aux.test.runtime_utils import tiny_checkpoint
from sglang_aux.tools import train_dflash
from sglang_aux.tools.dflash_training.data import BadInputError, Sample
from sglang_aux.tools.dflash_training.export import draft_config, new_draft
from sglang_aux.tools.dflash_training.sequence_set import SequenceSet
from sglang_aux.tools.dflash_training.snapshot import (
    latest_snapshot,
    snapshot_name,
    snapshots_dir,
)
from sglang_aux.tools.dflash_training.trainer import TrainConfig, Trainer
from sglang_aux.tools.dflash_training.training_checkpoint import (
    TrainingCheckpoint,
    run_fingerprint,
)

register_cpu_ci(est_time=25, suite="default")

CFG = TrainConfig(steps=9, batch_size=2, anchors_per_seq=3, log_every=4)
HIDDEN = PRESETS["tiny-llama"]["hidden_size"]


def _samples() -> list[Sample]:
    g = torch.Generator().manual_seed(0)
    return [Sample(torch.randint(0, 256, (p,), generator=g).tolist(),
                   torch.randint(0, 256, (n,), generator=g).tolist())
            for p, n in [(6, 12), (9, 7), (4, 15)]]


def _trainer(samples: list[Sample], cfg: TrainConfig = CFG) -> tuple[Trainer, SequenceSet]:
    """A fresh tiny draft's trainer (the same every call) and random aux rows as its data."""
    config = draft_config(PRESETS["tiny-llama"], num_layers=1, num_aux_layers=2, block_size=4,
                          mask_token_id=MASK_TOKEN_ID)
    g = torch.Generator().manual_seed(1)
    aux = [torch.randn(len(s.ids), 2 * HIDDEN, generator=g) for s in samples]
    embed = nn.Embedding(PRESETS["tiny-llama"]["vocab_size"], HIDDEN)
    with torch.no_grad():
        embed.weight.copy_(torch.randn(embed.weight.shape, generator=g))
    trainer = Trainer(new_draft(config, torch.device("cpu"), seed=0), embed,
                      torch.randn(embed.weight.shape, generator=g), MASK_TOKEN_ID, cfg)
    return trainer, SequenceSet(samples, aux, torch.device("cpu"))


def _checkpoint(path: Path, samples: list[Sample], cfg: TrainConfig = CFG) -> TrainingCheckpoint:
    config = draft_config(PRESETS["tiny-llama"], num_layers=1, num_aux_layers=2, block_size=4,
                          mask_token_id=MASK_TOKEN_ID)
    return TrainingCheckpoint(path, run_fingerprint(recipe=None, algorithm="dflash",
                                                    target="tiny-llama", draft_config=config,
                                                    cfg=cfg, samples=samples))


# batches drawn from length groups (16 and 24 rows: two groups of the three sequences)
GROUPED = replace(CFG, context_bucket=8, group_by_length=True)


@pytest.mark.parametrize("first_run,cfg", [(1, CFG), (4, CFG), (8, CFG), (4, GROUPED)])
def test_two_runs_give_the_weights_of_one(tmp_path, first_run, cfg):
    samples = _samples()
    whole, data = _trainer(samples, cfg)
    done = whole.fit(data)
    assert done["steps"] == cfg.steps and done["done"]

    ckpt = _checkpoint(tmp_path / "run.pt", samples, cfg)
    first, data = _trainer(samples, cfg)
    stopped = first.fit(data, checkpoint=lambda: ckpt.save(first), max_run_steps=first_run)
    assert (stopped["steps"], stopped["done"]) == (first_run, False)
    second, data = _trainer(samples, cfg)  # a new process: fresh draft, optimizer and generator
    assert ckpt.load(second) and second.num_steps == first_run
    rest = second.fit(data, checkpoint=lambda: ckpt.save(second))
    assert (rest["steps"], rest["done"]) == (cfg.steps, True)
    assert rest["train_seconds"] > stopped["train_seconds"]
    for (name, a), b in zip(whole.draft.state_dict().items(),
                            second.draft.state_dict().values(), strict=True):
        assert torch.equal(a, b), name
    assert second.lr == whole.lr


def test_checkpoint_every_n_steps_and_at_the_end(tmp_path):
    samples = _samples()
    trainer, data = _trainer(samples)
    ckpt = _checkpoint(tmp_path / "run.pt", samples)
    saved = []

    def save():
        ckpt.save(trainer)
        saved.append(trainer.num_steps)

    trainer.fit(data, checkpoint=save, checkpoint_every=2, max_run_steps=5)
    assert saved == [2, 4, 5]
    trainer.fit(data, checkpoint=save, checkpoint_every=2)
    assert saved == [2, 4, 5, 6, 8, 9]
    assert not list(tmp_path.glob(".tmp.*"))  # written through a temporary file, renamed


def test_checkpoint_of_another_run_or_none_is_refused(tmp_path):
    samples = _samples()
    trainer, data = _trainer(samples)
    path = tmp_path / "run.pt"
    _checkpoint(path, samples).save(trainer)
    with pytest.raises(BadInputError, match=rf"^{path}: a checkpoint of another run \(train.lr:"
                       r" 0.001 in the checkpoint, 0.002 now\)"):
        _checkpoint(path, samples, replace(CFG, lr=2e-3)).load(trainer)
    with pytest.raises(BadInputError, match="another run \\(data: '"):
        _checkpoint(path, samples[:2] + [Sample([1, 2], [3, 4])]).load(trainer)
    # what a run may change (its log) is not the run
    assert _checkpoint(path, samples, replace(CFG, log_every=1)).load(trainer)
    assert not _checkpoint(tmp_path / "absent.pt", samples).load(trainer)
    path.write_bytes(path.read_bytes()[:1000])  # cut short
    with pytest.raises(BadInputError, match=rf"^{path}: not a training checkpoint") as e:
        _checkpoint(path, samples).load(trainer)
    assert "\n" not in str(e.value)


def test_resume_over_runs_of_the_smoke_recipe(tmp_path):
    """`train_dflash --resume`: a run ended after 3 steps writes no draft; the next continues
    its checkpoint, and the draft equals the uninterrupted run's, bitwise; a run with another
    learning rate stops in one line naming the checkpoint."""
    local_path_or_skip("train")
    local_path_or_skip("test")
    target = str(tiny_checkpoint("tiny-llama", tmp_path / "ckpt"))
    samples = tmp_path / "samples.jsonl.xz"
    common = ["--smoke", "--target", target, "--num-samples", "4", "--steps", "7",
              "--samples-file", str(samples)]
    assert train_dflash.main([*common, "--phase", "data"]) == samples
    whole = train_dflash.main([*common, "--phase", "train", "--out", str(tmp_path / "whole")])
    out = tmp_path / "resumed"
    resumed = [*common, "--phase", "train", "--out", str(out), "--resume"]
    assert train_dflash.main([*resumed, "--max-run-steps", "3"]) is None
    assert not out.exists() and Path(f"{out}.checkpoint.pt").is_file()
    with pytest.raises(SystemExit, match=rf"^train_dflash: error: {out}.checkpoint.pt: a "
                       r"checkpoint of another run \(train.lr: 0.001 in the checkpoint, 0.003 "
                       r"now\)"):
        train_dflash.main([*resumed, "--lr", "3e-3"])
    assert train_dflash.main(resumed) == out
    a, b = load_file(whole / "model.safetensors"), load_file(out / "model.safetensors")
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
    assert "7 steps" in (out / "README.md").read_text()


def _smoke_samples(tmp_path: Path) -> list[str]:
    """train_dflash's flags for a tiny target's samples, generated here once."""
    local_path_or_skip("train")
    local_path_or_skip("test")
    target = str(tiny_checkpoint("tiny-llama", tmp_path / "ckpt"))
    samples = tmp_path / "samples.jsonl.xz"
    common = ["--smoke", "--target", target, "--num-samples", "4", "--samples-file",
              str(samples)]
    assert train_dflash.main([*common, "--phase", "data"]) == samples
    return common


def test_init_from_starts_from_a_written_drafts_weights(tmp_path):
    """`train_dflash --init-from DIR` (a draft trained on over device sessions): with a zero
    learning rate the written draft is the folder's weights exactly, where a fresh start is
    not; its card names where it started; a resumed run started from other weights, a folder
    of another draft shape or no draft at all stops in one line naming the file."""
    common = _smoke_samples(tmp_path)
    first = train_dflash.main([*common, "--phase", "train", "--steps", "6",
                               "--out", str(tmp_path / "first")])
    still = [*common, "--phase", "train", "--steps", "2", "--lr", "0"]
    went_on = train_dflash.main([*still, "--init-from", str(first),
                                 "--out", str(tmp_path / "went_on")])
    fresh = train_dflash.main([*still, "--out", str(tmp_path / "fresh")])
    a, b = load_file(first / "model.safetensors"), load_file(went_on / "model.safetensors")
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
    c = load_file(fresh / "model.safetensors")
    assert not all(torch.equal(a[k], c[k]) for k in a)
    card = (went_on / "README.md").read_text()
    assert f"Started from the weights of `{first}` (sha256 " in card
    assert "Their training: 6 steps x 4 sequences x 4 blocks, AdamW lr 0.001" in card
    assert "- Training: 2 steps" in card
    # a checkpoint of a run started from other weights (here: from none) is another run's
    resumed = [*still, "--out", str(tmp_path / "r"), "--resume"]
    assert train_dflash.main([*resumed, "--max-run-steps", "1"]) is None
    with pytest.raises(SystemExit, match=r"^train_dflash: error: .*r.checkpoint.pt: a "
                       r"checkpoint of another run \(init: None in the checkpoint, '"):
        train_dflash.main([*resumed, "--init-from", str(first)])
    with pytest.raises(SystemExit, match=rf"^train_dflash: error: --init-from "
                       rf"{first}/config.json: num_hidden_layers is 1, this training's draft "
                       r"has 2$"):
        train_dflash.main([*still, "--num-layers", "2", "--init-from", str(first),
                           "--out", str(tmp_path / "x")])
    with pytest.raises(SystemExit, match=rf"^train_dflash: error: --init-from {tmp_path}: no "
                       r"config.json \(not a draft folder\)$"):
        train_dflash.main([*still, "--init-from", str(tmp_path), "--out", str(tmp_path / "y")])
    (first / "model.safetensors").write_bytes(b"not safetensors" * 4)
    with pytest.raises(SystemExit, match=rf"^train_dflash: error: --init-from {first}: Error "
                       r"while deserializing header"):
        train_dflash.main([*still, "--init-from", str(first), "--out", str(tmp_path / "w")])
    (first / "model.safetensors").unlink()
    with pytest.raises(SystemExit, match=rf"^train_dflash: error: --init-from {first}: no "
                       r"\*.safetensors file"):
        train_dflash.main([*still, "--init-from", str(first), "--out", str(tmp_path / "z")])


if __name__ == "__main__":
    sys.exit(pytest.main([__file__, "-q"]))


@pytest.mark.parametrize("algorithm", ["dflash", "dspark"])
def test_snapshots_leave_a_draft_a_later_training_starts_from(tmp_path, algorithm):
    """`--snapshot-every-s` (here after every step): the newest two snapshots stay, each a
    draft folder; the last step's holds the finished draft's weights exactly (DSpark's heads
    too) and a card saying what it is; an earlier training's snapshots are gone;
    `--init-from` an earlier snapshot with a zero learning rate writes its weights exactly. A
    negative interval is refused."""
    common = [*_smoke_samples(tmp_path), "--algorithm", algorithm]
    out = tmp_path / "draft"
    stale = snapshots_dir(out) / snapshot_name(99)  # an earlier, longer training's
    stale.mkdir(parents=True)
    assert latest_snapshot(out) == stale
    assert train_dflash.main([*common, "--phase", "train", "--steps", "6", "--out", str(out),
                              "--snapshot-every-s", "1e-9"]) == out
    kept = sorted(p.name for p in snapshots_dir(out).iterdir())
    assert kept == [snapshot_name(5), snapshot_name(6)] == ["step-00000005", "step-00000006"]
    last = latest_snapshot(out)
    a, b = load_file(out / "model.safetensors"), load_file(last / "model.safetensors")
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
    assert ("markov_head.markov_w1.weight" in a) == (algorithm == "dspark")
    assert (last / "config.json").read_text() == (out / "config.json").read_text()
    card = (last / "README.md").read_text()
    assert card.startswith("# draft, step 6 of 6\n") and "--snapshot-every-s 1e-9" in card
    earlier = snapshots_dir(out) / snapshot_name(5)
    went_on = train_dflash.main([*common, "--phase", "train", "--steps", "2", "--lr", "0",
                                 "--init-from", str(earlier), "--out", str(tmp_path / "on")])
    c, d = load_file(earlier / "model.safetensors"), load_file(went_on / "model.safetensors")
    assert not all(torch.equal(a[k], c[k]) for k in a)  # step 5's weights, not step 6's
    assert all(torch.equal(c[k], d[k]) for k in c)
    assert not snapshots_dir(tmp_path / "on").exists()  # none asked for
    with pytest.raises(SystemExit):
        train_dflash.main([*common, "--snapshot-every-s", "-1"])
