"""The DFlash recipe search (tools/dflash_recipe_search.py) on the CPU with the tiny smoke
recipe: two variants trained on one samples file and measured on held-out GSM8K prompts into
one table; variants share the features of one set of target layers and train as alone; a
variant cut mid-training resumes its checkpoint in the next call; a finished search trains
nothing again; bad input (a variant name, two of one name, two that train the same draft, a
missing samples file, a state from another search or from a recipe whose defaults moved)
stops with one line."""

import json
import sys

import pytest
import torch
from safetensors.torch import load_file

from sglang_aux.srt.configs.acceptance_profile import DRAFT_PROFILE
from sglang_aux.test.ci.ci_register import register_cpu_ci
from sglang_aux.test.gsm8k_data import local_path_or_skip
from sglang_aux.test.runtime_utils import tiny_checkpoint
from sglang_aux.tools import dflash_recipe_search as search
from sglang_aux.tools import train_dflash
from sglang_aux.tools.dflash_training.export import TRAINING_RECORD

register_cpu_ci(est_time=40, suite="default")


@pytest.fixture(scope="module")
def samples(tmp_path_factory):
    local_path_or_skip("train")
    local_path_or_skip("test")
    root = tmp_path_factory.mktemp("search")
    target = tiny_checkpoint("tiny-llama", root)
    path = root / "samples.jsonl.xz"
    train_dflash.main(["--smoke", "--target", target, "--phase", "data", "--samples-file",
                       str(path), "--num-samples", "4"])
    return target, path


def _argv(root, samples, *variants, steps=4):
    target, path = samples
    return ["--samples-file", str(path), "--root", str(root), "--steps", str(steps),
            "--common", f"--smoke --target {target}", "--eval-tasks", "gsm8k",
            "--eval-num-prompts", "2", *[f"--variant={v}" for v in variants]]


def test_two_variants_trained_measured_and_tabled(samples, tmp_path, capsys, monkeypatch):
    root = tmp_path / "s"
    # "cut" stops after 2 of its 4 steps in the first call (as a deadline would)
    argv = _argv(root, samples, "base=", "cut=--num-layers 2 --max-run-steps 2")
    assert search.main(argv) is False
    state = json.loads((root / search.STATE).read_text())
    assert state["variants"]["base"]["status"] == "measured"
    assert state["variants"]["cut"]["status"] == "training"
    assert "run the same command again" in capsys.readouterr().out
    assert search.main(argv) is True
    state = json.loads((root / search.STATE).read_text())
    base, cut = state["variants"]["base"], state["variants"]["cut"]
    assert base["runs"] == 1 and cut["runs"] == 2 and cut["status"] == "measured"
    for v in (base, cut):
        hist = v["accept_histogram"]["gsm8k"]
        assert sum(hist) > 0 and v["accept_per_step"]["gsm8k"] == pytest.approx(
            sum((a + 1) * n for a, n in enumerate(hist)) / sum(hist), abs=1e-4)
    layers = [json.loads((root / n / "config.json").read_text())["num_hidden_layers"]
              for n in ("base", "cut")]
    assert layers == [1, 2]  # the smoke recipe's one layer, and the variant's two
    # each variant's own steps' pace (its training record: the seconds of the steps alone,
    # over both runs of `cut`, none of the engine's or the features')
    for name, v in (("base", base), ("cut", cut)):
        record = json.loads((root / name / TRAINING_RECORD).read_text())
        assert record["steps"] == 4 and 0 < record["train_seconds"] < v["train_seconds"]
        assert v["step_ms"] == round(1e3 * record["train_seconds"] / 4, 1)
    table = (root / search.TABLE).read_text()
    assert "| variant | flags | status | runs | train s | ms a step | gsm8k |" in table
    assert f" | {base['step_ms']:.1f} | {base['accept_per_step']['gsm8k']:.3f} |" in table
    assert "| base | `(recipe)` | measured | 1 |" in table
    assert "| cut | `--num-layers 2 --max-run-steps 2` | measured | 2 |" in table
    assert "every variant measured" in capsys.readouterr().out
    # done: nothing trains or evaluates again
    monkeypatch.setattr(train_dflash, "main", lambda *_a: pytest.fail("ran train_dflash"))
    assert search.main(argv) is True


def test_a_carried_state_keeps_what_it_measured_and_trains_again_what_stayed(
        samples, tmp_path, capsys):
    """search.json alone carried to a fresh root (a later device session): the measured variant
    is kept as it was; the one whose checkpoint stayed behind trains again from step 0, and so
    does one whose trained draft stayed behind."""
    first, later = tmp_path / "first", tmp_path / "later"
    argv = _argv(first, samples, "base=", "cut=--num-layers 2 --max-run-steps 2")
    assert search.main(argv) is False
    later.mkdir()
    state = json.loads((first / search.STATE).read_text())
    (later / search.STATE).write_text(json.dumps(state))
    moved = [a if a != str(first) else str(later) for a in argv]
    assert search.main(moved) is False  # cut: 2 of 4 steps again, from step 0
    out = capsys.readouterr().out
    assert "search: cut: its checkpoint is not under" in out and "base:" not in out
    again = json.loads((later / search.STATE).read_text())
    assert again["variants"]["base"] == state["variants"]["base"]  # kept, not trained again
    assert not (later / "base").exists()
    assert again["variants"]["cut"]["runs"] == 1  # counted from 0, not the first root's 1 + 1
    # a trained draft left behind is trained again too (status back to training, runs 0)
    state["variants"]["cut"]["status"] = "trained"
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    (elsewhere / search.STATE).write_text(json.dumps(state))
    loaded = search.Search(search.parse_args(
        [a if a != str(first) else str(elsewhere) for a in argv]))
    cut = loaded.state["variants"]["cut"]
    assert (cut["status"], cut["runs"], cut["train_seconds"]) == ("training", 0, 0.0)
    assert "search: cut: its draft is not under" in capsys.readouterr().out
    assert loaded.state["variants"]["base"]["status"] == "measured"


def test_variants_share_the_features_and_train_as_alone(samples, tmp_path, monkeypatch):
    """One process extracts the samples' features once for the variants that read the same
    target layers, again for one that reads others (whose features replace them), and a
    variant trained on kept features gets the weights it gets alone, bitwise."""
    layers = []
    real = train_dflash.extract_by_source
    monkeypatch.setattr(train_dflash, "extract_by_source",
                        lambda *a, **kw: layers.append(list(a[2])) or real(*a, **kw))
    root = tmp_path / "s"
    assert search.main(_argv(root, samples, "base=", "lr=--lr 3e-3", "aux=--num-aux-layers 1",
                             "lr2=--lr 2e-3")) is True
    assert len(layers) == 3 and layers[0] == layers[2] != layers[1]  # base (lr kept), aux, lr2
    target, path = samples
    alone = tmp_path / "alone"
    train_dflash.main(["--smoke", "--target", target, "--out", str(alone), "--phase", "train",
                       "--samples-file", str(path), "--resume", "--steps", "4",
                       "--lr", "3e-3"])
    assert len(layers) == 4
    kept, own = load_file(root / "lr" / "model.safetensors"), load_file(alone / "model.safetensors")
    assert kept.keys() == own.keys() and all(torch.equal(kept[k], own[k]) for k in kept)
    card = (root / "lr" / "README.md").read_text()
    assert "features (kept from an earlier run)" in card


def test_a_dspark_variant_is_trained_and_measured_as_dspark(samples, tmp_path):
    """DSpark beside DFlash on one recipe's samples (issue 41's comparison): the DSpark
    variant writes a DSpark draft and its evaluation runs the DSpark worker."""
    root = tmp_path / "s"
    assert search.main(_argv(root, samples, "dflash=",
                             "dspark=--algorithm dspark --block-size 3")) is True
    state = json.loads((root / search.STATE).read_text())
    for name, arch in (("dflash", "DFlashDraftModel"), ("dspark", "DSparkDraftModel")):
        assert json.loads((root / name / "config.json").read_text())["architectures"] == [arch]
        assert state["variants"][name]["status"] == "measured"
        assert sum(state["variants"][name]["accept_histogram"]["gsm8k"]) > 0
    assert "--speculative-algorithm DSPARK" in (root / "dspark" / "README.md").read_text()
    # measured by the DSpark worker: 3 proposals and the anchor a step (DFlash's block 3: 3)
    assert json.loads((root / "dspark" / DRAFT_PROFILE).read_text())["verify_width"] == 4


def test_every_variant_may_compile_its_steps(samples, tmp_path, monkeypatch):
    """The search raises Dynamo's per-function graph limit to COMPILES_PER_VARIANT a variant
    before training: a search of more draft shapes than the default 8 graphs would otherwise
    train its later variants eagerly (at half the pace, compiled on CUDA)."""
    seen = []
    monkeypatch.setattr(search.Search, "_train_dflash", lambda self, name, *flags: seen.append(
        torch._dynamo.config.recompile_limit))
    variants = [f"layers{n}=--num-layers {n}" for n in range(1, 4)]
    # the config module's own patch: pytest 9.2's monkeypatch undo deletes the config
    # attribute, which torch then hides from every later reader in the process
    with torch._dynamo.config.patch(recompile_limit=8):
        search.main(_argv(tmp_path / "s", samples, *variants))  # the stand-in's None: cut there
        assert torch._dynamo.config.recompile_limit == 8  # the search's raise ends with it
    assert seen == [3 * search.COMPILES_PER_VARIANT] and 3 * search.COMPILES_PER_VARIANT > 8


def test_each_training_leaves_time_for_every_waiting_evaluation(samples, tmp_path, monkeypatch):
    """Under a deadline the second variant's training keeps two evaluations' reserve (its own
    and the first's, trained but not yet measured), so both are measured before it: on the
    2026-12-06 H100 run one reserve let the second training eat the first's evaluation time."""
    budgets = []
    real = search.Search._train_dflash

    def recording(self, name, *flags):
        if "--eval-only" not in flags:
            budgets.append(float(flags[flags.index("--deadline-s") + 1]))
        return real(self, name, *flags)

    monkeypatch.setattr(search.Search, "_train_dflash", recording)
    argv = _argv(tmp_path / "s", samples, "a=", "b=--lr 3e-3")
    assert search.main([*argv, "--deadline-s", "3000", "--eval-reserve-s", "1000"]) is True
    assert len(budgets) == 2
    assert 1900 < budgets[0] <= 2000 and budgets[1] <= budgets[0] - 1000 < 1000 + 5


@pytest.mark.parametrize("variants, says", [
    (["bad name="], "expected NAME=FLAGS"),
    (["noequals"], "expected NAME=FLAGS"),
    (["a=--lr 1", "a=--lr 2"], "--variant names must differ"),
    (["a=--lr '1"], "No closing quotation"),
    (["base=", "lr=--lr 1e-3"], "--variant lr='--lr 1e-3' trains what --variant base='' "
                                "trains"),
])
def test_bad_variants_are_one_line(samples, tmp_path, variants, says):
    with pytest.raises(SystemExit) as e:
        search.main(_argv(tmp_path, samples, *variants))
    assert "\n" not in str(e.value) and says in str(e.value)


def test_missing_samples_and_another_searchs_state_are_one_line(samples, tmp_path):
    target, _ = samples
    with pytest.raises(SystemExit) as e:
        search.main(_argv(tmp_path, (target, tmp_path / "none.jsonl"), "a="))
    assert "--samples-file" in str(e.value) and "no such file" in str(e.value)
    (tmp_path / search.STATE).write_text(json.dumps(
        {"recipe": None, "samples_file": str(samples[1]), "steps": 99,
         "common": f"--smoke --target {target}", "variants": {}}))
    with pytest.raises(SystemExit) as e:
        search.main(_argv(tmp_path, samples, "a="))
    assert f"{tmp_path / search.STATE}: a search with steps 99, not 4" in str(e.value)
    # a recipe whose defaults moved since (the mix took --train-over-token-map): its base=
    # would not be the draft measured
    from sglang_aux.tools.dflash_training.recipes import MIX, RECIPES
    before = {**json.loads(json.dumps(RECIPES[MIX])), "train_over_token_map": False}
    state = {"recipe": MIX, "samples_file": str(samples[1]), "steps": 4,
             "common": f"--smoke --target {target}", "variants": {}}
    argv = [*_argv(tmp_path, samples, "a="), "--recipe", MIX]
    for recorded, says in ((before, "a search with recipe_defaults.train_over_token_map "
                                    "False, not True"),
                           (None, "a search from before the recipe's defaults were recorded")):
        (tmp_path / search.STATE).write_text(json.dumps(
            {**state, **({"recipe_defaults": recorded} if recorded else {})}))
        with pytest.raises(SystemExit) as e:
            search.main(argv)
        assert says in str(e.value) and "\n" not in str(e.value), str(e.value)
    (tmp_path / search.STATE).write_text("{oops")
    with pytest.raises(SystemExit) as e:
        search.main(_argv(tmp_path, samples, "a="))
    assert "not a search state" in str(e.value) and "\n" not in str(e.value)


if __name__ == "__main__":
    sys.exit(pytest.main([__file__, "-q"]))
