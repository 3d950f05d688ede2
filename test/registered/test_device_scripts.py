"""The one-call device scripts (scripts/device/*_candidates.sh) hold up before an H200 runs
them: each parses, each test file they name exists, and each bench they call accepts the flags
they give it (and qwen25_coder.sh's training that outlives its call runs, with a stand-in
trainer). The scripts run here with `python` standing in as a recorder of its arguments
(and FlashInfer's install, which reads .carry, skipped);
every recorded bench invocation is then parsed by that bench's own argument parser (stopped
right after parsing: no model loads). A renamed flag or a moved test would otherwise cost a
device call."""

import argparse
import itertools
import os
import re
import runpy
import shutil
import stat
import subprocess
import sys
from functools import partial
from pathlib import Path

import pytest

from sglang_aux.test.ci.ci_register import register_cpu_ci
from sglang_aux.test.gsm8k_data import local_path_or_skip
from sglang_aux.test.humaneval import read_problems

register_cpu_ci(est_time=60, suite="default")

REPO = Path(__file__).resolve().parents[2]
DEVICE = REPO / "scripts/device"
RUN = ["kernel_candidates.sh", "verify_candidates.sh", "flashinfer_candidates.sh",
       "fusion_candidates.sh", "draft_len_candidates.sh", "arrival_candidates.sh",
       "chunked_prefill.sh", "dspark_candidates.sh", "draft_vocab.sh", "blas_rows.sh"]
RECORDER = """#!/bin/sh
printf '%s\\0' "$@" >> "$RECORD"
printf '\\n' >> "$RECORD"
"""
# FlashInfer's install reads .carry, which a clone lacks: the staging script is skipped
BASH = """#!/bin/sh
case "$1" in scripts/device/stage_flashinfer.sh) exit 0;; esac
exec /bin/bash "$@"
"""


class _Parsed(Exception):
    pass


def _record(script: str, tmp_path: Path, **env_vars: str) -> list[list[str]]:
    """The argument lists `python` got while `script` ran (with `env_vars` set)."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir(exist_ok=True)
    for name, text in (("python", RECORDER), ("python3", RECORDER), ("bash", BASH)):
        shim = bin_dir / name
        shim.write_text(text)
        shim.chmod(shim.stat().st_mode | stat.S_IEXEC)
    record = tmp_path / f"{script}.args"
    env = {**os.environ, "PATH": f"{bin_dir}:{os.environ['PATH']}", "RECORD": str(record),
           **env_vars}
    subprocess.run(["/bin/bash", str(DEVICE / script), str(tmp_path / "out")], cwd=REPO, env=env,
                   check=True, capture_output=True, timeout=120)
    return [[a for a in line.split("\0") if a] for line in record.read_text().splitlines()]


def _parses(bench: Path, argv: list[str]) -> argparse.Namespace:
    """`bench`'s own parser over `argv`, stopped once it has parsed."""
    real = argparse.ArgumentParser.parse_args
    parsed = {}

    def parse_and_stop(self, args=None, namespace=None):
        parsed["args"] = real(self, args, namespace)
        raise _Parsed

    argparse.ArgumentParser.parse_args = parse_and_stop
    saved_argv, saved_path = sys.argv, list(sys.path)
    sys.argv, sys.path = [str(bench), *argv], [str(bench.parent), *sys.path]
    try:
        runpy.run_path(str(bench), run_name="__main__")
    except _Parsed:
        pass
    finally:
        argparse.ArgumentParser.parse_args = real
        sys.argv, sys.path[:] = saved_argv, saved_path
    if "args" not in parsed:
        raise AssertionError(f"{bench.name} never parsed its arguments")
    return parsed["args"]


@pytest.mark.parametrize("script", RUN)
def test_script_parses_and_names_existing_tests(script):
    text = (DEVICE / script).read_text()
    subprocess.run(["bash", "-n", str(DEVICE / script)], check=True)
    tests = re.findall(r"test/registered/[\w/]+\.py", text)
    assert tests and all((REPO / t).is_file() for t in tests), tests


@pytest.mark.parametrize("script", RUN)
def test_every_bench_call_is_accepted_by_its_parser(script, tmp_path):
    calls = _record(script, tmp_path)
    benches = [c for c in calls if c and c[0].endswith(".py")]
    pytests = [c for c in calls if c[:2] == ["-m", "pytest"]]
    assert benches and pytests, calls
    for call in pytests:
        for arg in call[2:]:
            if arg.startswith("test/"):
                assert (REPO / arg.split("::")[0]).is_file(), arg
    for bench, *argv in benches:
        args = _parses(REPO / bench, argv)
        out = getattr(args, "out", None)
        assert out is None or str(tmp_path) in out, (bench, out)  # results land under OUT


def test_the_offline_builds_cover_the_tiles_the_scripts_time(tmp_path):
    """sm90_builds compiles the candidates' tiles ahead (test_sm90_builds.py): the same ones
    the scripts pass."""
    from sglang_aux.test import sm90_builds

    calls = [c for s in RUN for c in _record(s, tmp_path)]

    def values(bench: str, flag: str) -> list[str]:
        [call] = [c for c in calls if c[0].endswith(bench) and flag in c]
        args = call[call.index(flag) + 1:]
        return args[: next((i for i, a in enumerate(args) if a.startswith("--")), len(args))]

    assert values("bench_gemv.py", "--row-configs") == sm90_builds.GEMV_TILE_CANDIDATES
    assert values("bench_decode_attention.py", "--single-pass") == [
        ":".join(map(str, tile)) for tile in sm90_builds.SINGLE_PASS_CANDIDATES]


def _train_step_runs(tmp_path: Path, **env_vars: str) -> tuple[list[list[str]], dict]:
    """train_step.sh's recorded calls, and each variant's train_dflash arguments by name, its
    samples file (the script's cut of the shipped ones) the shipped mix samples."""
    from sglang_aux.tools.dflash_training.recipes import MIX, shipped_samples

    calls = _record("train_step.sh", tmp_path, **env_vars)
    runs = {c[c.index("--out") + 1].rsplit("/", 1)[1]: c[2:] for c in calls
            if c[:2] == ["-m", "sglang_aux.tools.train_dflash"]}
    for argv in runs.values():
        argv[argv.index("--samples-file") + 1] = str(shipped_samples(MIX))
    return calls, runs


def test_the_training_step_profile_runs_each_variant_with_flags_train_dflash_takes(tmp_path):
    """train_step.sh: one profiled run of the mix recipe on the shaped preset a variant, each
    with flags the trainer's parser accepts and the variant's own ones."""
    from sglang_aux.srt.configs.presets import PRESETS
    from sglang_aux.tools.dflash_training import train_args

    calls, runs = _train_step_runs(tmp_path)
    assert list(runs) == ["base", "eager", "packed", "fused"], calls
    parsed = {}
    for name, argv in runs.items():
        parsed[name] = args = train_args.parse_args(argv)  # with the recipe's defaults
        assert args.target in PRESETS and args.recipe and args.profile_steps > 0, name
        assert int(args.mask_token) < PRESETS[args.target]["vocab_size"]
    assert parsed["base"].train_over_token_map and parsed["base"].batch_stream
    assert parsed["base"].context_bucket == 256
    # (compile None: the trainer's default, compiled on CUDA)
    assert [(p.compile, p.pack_context, p.fused_adam) for p in parsed.values()] == [
        (None, False, False), (False, False, False), (None, True, False), (None, False, True)]
    (table,) = [c for c in calls if c[0].endswith("train_step_table.py")]
    assert table[1] == str(tmp_path / "out")  # (no base.log under the recorder: no --base)


def test_the_documented_training_step_variants_parse(tmp_path):
    """Every `VARIANTS='...'` the plans give train_step.sh (docs/benchmarks.md section 10,
    docs/dspark.md) runs each variant with flags the trainer's parser accepts, each variant
    a distinct training: a typo there would cost a device call."""
    from sglang_aux.tools.dflash_training import train_args

    plans = {}
    for doc in ("docs/benchmarks.md", "docs/dspark.md"):
        section = (REPO / doc).read_text()
        if doc.endswith("benchmarks.md"):
            section = section[section.index("## 10. Not measured yet"):]
        plans[doc] = re.findall(r"(?<!SEARCH_)VARIANTS='([^']+)'", section)
    assert plans["docs/benchmarks.md"] and plans["docs/dspark.md"], plans
    for doc, found in plans.items():
        for variants in found:
            calls, runs = _train_step_runs(tmp_path, VARIANTS=variants)
            assert list(runs) == [v.split("=", 1)[0] for v in variants.split()], (doc, calls)
            seen = {}
            for name, argv in runs.items():
                args = vars(train_args.parse_args(argv))
                key = tuple(sorted((k, repr(v)) for k, v in args.items()
                                   if k not in ("out", "command")))
                assert key not in seen, f"{doc}: {name} trains what {seen.get(key)} trains"
                seen[key] = name
            (tmp_path / "train_step.sh.args").unlink()


def test_prepare_carry_makes_the_carried_data_folders(tmp_path):
    """`prepare_carry.sh` on a fresh checkout: GSM8K's two files and HumanEval's problems in
    .carry/ (wheels apart: PyPI), a folder already there kept; without GSM8K, one line."""
    local_path_or_skip("train")
    local_path_or_skip("test")
    repo = tmp_path / "repo"
    (repo / "scripts/device").mkdir(parents=True)
    shutil.copy(REPO / "scripts/device/prepare_carry.sh", repo / "scripts/device/")
    gsm8k = local_path_or_skip("train").parent
    env = {**os.environ, "NO_WHEELS": "1", "SGLANG_AUX_GSM8K_DIR": str(gsm8k)}
    run = partial(subprocess.run, ["bash", "scripts/device/prepare_carry.sh"], cwd=repo,
                  capture_output=True, text=True, timeout=60)
    r = run(env=env)
    assert r.returncode == 0, r.stderr
    for f in ("train.jsonl", "test.jsonl"):
        assert (repo / ".carry/gsm8k" / f).read_bytes() == (gsm8k / f).read_bytes()
    assert len(read_problems(repo / ".carry/humaneval/HumanEval.jsonl.gz")) == 164
    (repo / ".carry/gsm8k/test.jsonl").write_text("kept\n")
    assert run(env=env).returncode == 0
    assert (repo / ".carry/gsm8k/test.jsonl").read_text() == "kept\n"
    shutil.rmtree(repo / ".carry/gsm8k")
    r = run(env={**env, "SGLANG_AUX_GSM8K_DIR": str(tmp_path / "none")})
    assert r.returncode == 1
    assert r.stderr == f"no {tmp_path / 'none'}/train.jsonl: set SGLANG_AUX_GSM8K_DIR\n"


def test_a_removed_flag_is_caught():
    bench = REPO / "benchmark/spec_decode/bench_graph_replay.py"
    assert _parses(bench, ["--draft-bs", "1", "32"]).draft_bs == [1, 32]
    with pytest.raises(SystemExit):  # the removed block GEMV candidate's flag
        _parses(bench, ["--block-gemv"])


if __name__ == "__main__":
    sys.exit(pytest.main([__file__, "-q"]))


# A stand-in for the device's python3 in qwen25_coder.sh (PY): train_dflash logs two steps
# STEP_S apart, or the second once STOP_FILE exists (between them, with --snapshot-every-s, a
# snapshot of 20 random MiB), and writes a 20 MiB draft where its recipe's name resolves; the
# recipe search writes its table after STEP_S; pip does nothing; `-c` (the draft's folder) is
# the real interpreter.
TRAINER = """#!/bin/bash
case "$1 $2" in
  "-m pip") exit 0 ;;
  "-m sglang_aux.tools.train_dflash")
    while [ $# -gt 0 ]; do
      [ "$1" = --recipe ] && recipe=$2; [ "$1" = --samples-file ] && s=$2
      [ "$1" = --init-from ] && echo "init from $2: $(cat "$2/README.md")"
      [ "$1" = --snapshot-every-s ] && every=$2; shift
    done
    echo "reading $s"; sleep 1; echo "step 100/200 loss 1.0"
    if [ -n "$every" ]; then  # a snapshot of step 100, as train_dflash writes it
      n=$SGLANG_AUX_CACHE/drafts/$recipe.snapshots/step-00000100; mkdir -p "$n"
      echo '{}' > "$n/config.json"; head -c 20971520 /dev/urandom > "$n/model.safetensors"
      echo "snapshot of step 100 every $every s"
    fi
    if [ -n "${STOP_FILE:-}" ]; then  # until the test says so
      while [ ! -f "$STOP_FILE" ]; do sleep 0.1; done
    else
      sleep "$STEP_S"
    fi
    echo "step 200/200 loss 0.5"
    d=$SGLANG_AUX_CACHE/drafts/$recipe; mkdir -p "$d"; echo '{}' > "$d/config.json"
    echo "# card" > "$d/README.md"; head -c 20971520 /dev/zero > "$d/model.safetensors" ;;
  "-m sglang_aux.tools.dflash_recipe_search")
    while [ $# -gt 0 ]; do
      [ "$1" = --root ] && root=$2; [ "$1" = --samples-file ] && s=$2
      case "$1" in --variant=*) echo "variant [${1#--variant=}]" ;; esac; shift
    done
    [ -f "$s" ] && echo "samples $s"
    [ -f "$root/search.json" ] && echo "state $(cat "$root/search.json")" \
      && cp "$root/search.json" "$root/seen.json"
    echo "step 100/200 loss 1.0"; sleep "$STEP_S"; mkdir -p "$root/base" "$root/wide"
    echo "| base | measured |" > "$root/search.md"; echo '{}' > "$root/search.json"
    head -c 20971520 /dev/urandom > "$root/base/model.safetensors"
    echo '{}' > "$root/wide/config.json"; echo ckpt > "$root/base.checkpoint.pt"
    echo "every variant measured" ;;
  *) exec "$REAL_PY" "$@" ;;
esac
"""


def _phase(env: dict, tmp_path: Path, phase: str, wait: int) -> tuple[str, Path]:
    """A call of qwen25_coder.sh PHASE (WAIT=wait) into a fresh OUT: its output and OUT."""
    out = tmp_path / f"out-{phase}-{wait}"
    for i in itertools.count(2):  # a call repeated: an OUT of its own too
        if not out.exists():
            break
        out = tmp_path / f"out-{phase}-{wait}-{i}"
    r = subprocess.run(["bash", "scripts/device/qwen25_coder.sh", phase, str(out)], cwd=REPO,
                       env={**env, "WAIT": str(wait)}, capture_output=True, text=True,
                       timeout=60)
    assert r.returncode == 0, r.stderr
    return r.stdout, out


def test_detached_training_outlives_its_call_and_packs_the_draft(tmp_path):
    """`qwen25_coder.sh train-start` leaves the trainer running in a session of its own after
    the call returns (the device keeps such a process); `train-wait` reports it still training,
    then packs the draft once it ends: its card and the first SEND_PARTS of its 16 MiB parts,
    the next call the rest, which rebuild the draft byte for byte. The trainer reads the
    recipe's shipped samples."""
    py = tmp_path / "py"
    py.write_text(TRAINER)
    py.chmod(0o755)
    env = {**os.environ, "PY": str(py), "REAL_PY": sys.executable, "WORK": str(tmp_path / "w"),
           "SGLANG_AUX_CACHE": str(tmp_path / "cache"), "STEP_S": "12", "SEND_PARTS": "1",
           "DRAFT": "qwen2.5-coder-1.5b-instruct-dflash-b16", "SNAPSHOT_S": ""}
    (tmp_path / "w").mkdir()

    call = partial(_phase, env, tmp_path)

    started, _ = call("train-start", 2)
    assert "step 100/200" in started  # its log is read as it grows
    assert "step 200/200" not in started  # the call returned before the trainer's last step
    waiting, out = call("train-wait", 1)
    assert "still training" in waiting and not list(out.iterdir())
    done, out = call("train-wait", 45)
    assert "step 200/200" in done and "trainer exited 0" in done
    assert (out / "draft_README.md").read_text() == "# card\n"
    first = sorted(out.glob("draft.tar.part-*"))
    _, rest_out = call("train-wait", 1)
    rest = sorted(rest_out.glob("draft.tar.part-*"))
    assert len(first) == 1 and len(rest) == 1
    log = (tmp_path / "w/train.log").read_text()
    assert "data/qwen2.5-coder-1.5b-instruct-dflash-b16.samples.jsonl.xz" in log
    unpacked = tmp_path / "unpacked"
    unpacked.mkdir()
    subprocess.run(f"cat {' '.join(map(str, first + rest))} | tar x -C {unpacked}", shell=True,
                   check=True)
    draft = tmp_path / "cache/drafts" / env["DRAFT"]
    got = unpacked / env["DRAFT"] / "model.safetensors"
    assert got.read_bytes() == (draft / "model.safetensors").read_bytes()


def test_a_running_training_sends_its_newest_snapshot_home(tmp_path):
    """While the detached trainer runs (`--snapshot-every-s`, 120 s unless SNAPSHOT_S says
    otherwise), each `train-wait` call sends SEND_PARTS of its newest snapshot's 16 MiB parts,
    snapshot.txt naming it beside the first, and packs a snapshot once; `draft-in` on a fresh
    machine carries the parts in where the draft's name resolves, byte for byte, and refuses
    a draft's parts and a snapshot's together."""
    py = tmp_path / "py"
    py.write_text(TRAINER)
    py.chmod(0o755)
    draft = "qwen2.5-coder-1.5b-instruct-dflash-b16"
    env = {**os.environ, "PY": str(py), "REAL_PY": sys.executable, "WORK": str(tmp_path / "w"),
           "SGLANG_AUX_CACHE": str(tmp_path / "cache"), "SEND_PARTS": "1", "DRAFT": draft,
           "STOP_FILE": str(tmp_path / "stop")}
    (tmp_path / "w").mkdir()
    call = partial(_phase, env, tmp_path)
    call("train-start", 3)
    said, first = call("train-wait", 1)
    assert "still training" in said and "snapshot of step 100 every 120 s" in said
    assert (first / "snapshot.txt").read_text() == "step-00000100: 2 parts\n"
    assert sorted(p.name for p in first.iterdir()) == ["snapshot.tar.part-aa", "snapshot.txt"]
    said, second = call("train-wait", 1)
    assert "still training" in said
    assert sorted(p.name for p in second.iterdir()) == ["snapshot.tar.part-ab"]
    said, third = call("train-wait", 1)
    assert "still training" in said and not list(third.iterdir())  # sent once
    snapshot = tmp_path / "cache/drafts" / f"{draft}.snapshots/step-00000100"
    original = (snapshot / "model.safetensors").read_bytes()
    (tmp_path / "stop").touch()
    done, _ = call("train-wait", 40)
    assert "trainer exited 0" in done
    carried = tmp_path / "carried"
    (carried / "1").mkdir(parents=True)
    for part in (first / "snapshot.tar.part-aa", second / "snapshot.tar.part-ab"):
        shutil.copy(part, carried / "1" / part.name)
    later = {**env, "WORK": str(tmp_path / "w2"), "SGLANG_AUX_CACHE": str(tmp_path / "cache2"),
             "DRAFT_PARTS_DIR": str(carried), "DRAFT_PARTS": "2"}
    (tmp_path / "w2").mkdir()
    _phase(later, tmp_path, "draft-in", 1)
    got = tmp_path / "cache2/drafts" / draft / "model.safetensors"
    assert got.read_bytes() == original
    shutil.copy(first / "snapshot.tar.part-aa", carried / "1" / "draft.tar.part-aa")
    (tmp_path / "w3").mkdir()
    r = subprocess.run(["bash", "scripts/device/qwen25_coder.sh", "draft-in",
                        str(tmp_path / "out-mixed")], cwd=REPO,
                       env={**later, "WORK": str(tmp_path / "w3")}, capture_output=True,
                       text=True, timeout=60)
    assert r.returncode == 1
    assert "holds parts of more than one tar (draft snapshot)" in r.stderr


def test_a_warm_start_trains_from_the_carried_draft(tmp_path):
    """WARM_START=1: `train` starts from the draft on the machine (`draft-in` put it where its
    name resolves), copied aside before the training writes its own there."""
    py = tmp_path / "py"
    py.write_text(TRAINER)
    py.chmod(0o755)
    env = {**os.environ, "PY": str(py), "REAL_PY": sys.executable, "WORK": str(tmp_path / "w"),
           "SGLANG_AUX_CACHE": str(tmp_path / "cache"), "STEP_S": "0", "SEND_PARTS": "0",
           "DRAFT": "qwen2.5-coder-1.5b-instruct-dflash-b16", "CUDA_TESTS": "0"}
    (tmp_path / "w").mkdir()
    _phase(env, tmp_path, "train", 1)  # a first session's draft
    assert "init from" not in (tmp_path / "w/train.log").read_text()
    draft = tmp_path / "cache/drafts" / env["DRAFT"]
    (draft / "README.md").write_text("# the first session's card\n")
    _phase({**env, "WARM_START": "1"}, tmp_path, "train", 2)
    log = (tmp_path / "w/train.log").read_text()
    assert f"init from {tmp_path}/w/warm-start: # the first session's card" in log
    assert (draft / "README.md").read_text() == "# card\n"  # the new training's, written over


def test_detached_search_outlives_its_call_and_returns_its_table(tmp_path):
    """`search-start` / `search-wait`: the same for the recipe search, whose table comes back
    once it has ended."""
    py = tmp_path / "py"
    py.write_text(TRAINER)
    py.chmod(0o755)
    env = {**os.environ, "PY": str(py), "REAL_PY": sys.executable, "WORK": str(tmp_path),
           "STEP_S": "8", "DRAFT": "qwen2.5-coder-1.5b-instruct-dflash-b16"}

    call = partial(_phase, env, tmp_path)

    call("search-start", 1)
    waiting, out = call("search-wait", 1)
    assert "still searching" in waiting and not (out / "search.md").exists()
    done, out = call("search-wait", 30)
    assert "every variant measured" in done and "still" not in done
    assert (out / "search.md").read_text() == "| base | measured |\n"
    log = subprocess.run(["xz", "-dc", str(out / "search.log.xz")], capture_output=True,
                         text=True, check=True).stdout
    assert "step 100/200 loss 1.0" in log and "every variant measured" in log


def test_the_searchs_drafts_come_back_and_are_carried_in(tmp_path):
    """Once the search has ended, `search-wait` sends its drafts' part list and SEND_PARTS of
    their 16 MiB parts, `search-parts` the rest (not the resume checkpoints); carried back in
    over two calls (`search-in`), the last one unpacks every variant where the search left it,
    byte for byte."""
    py = tmp_path / "py"
    py.write_text(TRAINER)
    py.chmod(0o755)
    work = tmp_path / "w"
    work.mkdir()
    env = {**os.environ, "PY": str(py), "REAL_PY": sys.executable, "WORK": str(work),
           "STEP_S": "1", "SEND_PARTS": "1", "DRAFT": "qwen2.5-coder-1.5b-instruct-dflash-b16"}
    call = partial(_phase, env, tmp_path)
    call("search-start", 1)
    _, first = call("search-wait", 30)
    names = (first / "search-parts.txt").read_text().split()
    assert names == ["base.tar.part-aa", "base.tar.part-ab", "wide.tar.part-aa"]
    assert sorted(p.name for p in first.glob("*.tar.part-*")) == ["base.tar.part-aa"]
    _, rest = _phase({**env, "SEND_PARTS": "6"}, tmp_path, "search-parts", 1)
    assert sorted(p.name for p in rest.glob("*.tar.part-*")) == names[1:]
    original = (work / "search/base/model.safetensors").read_bytes()
    shutil.rmtree(work / "search")
    carried = tmp_path / "carried"
    for i, (src, files) in enumerate(((first, ["search-parts.txt", names[0]]),
                                      (rest, names[1:]))):
        (carried / str(i)).mkdir(parents=True)
        for f in files:
            shutil.copy(src / f, carried / str(i) / f)
        said, _ = _phase({**env, "SEARCH_PARTS_DIR": str(carried)}, tmp_path, "search-in", i)
        if i == 0:
            assert "parts so far: 2" in said and not (work / "search").exists()
    assert (work / "search/base/model.safetensors").read_bytes() == original
    assert (work / "search/wide/config.json").read_text() == "{}\n"


def test_a_carried_search_state_is_continued_not_overwritten(tmp_path):
    """SEARCH_STATE (an earlier session's search.json, carried) seeds a machine that has no
    search yet, for `search-start` and for `search`; a search already on the machine is kept."""
    py = tmp_path / "py"
    py.write_text(TRAINER)
    py.chmod(0o755)
    state = tmp_path / "carried-search.json"
    state.write_text('{"carried": 1}')
    env = {**os.environ, "PY": str(py), "REAL_PY": sys.executable, "WORK": str(tmp_path / "w"),
           "STEP_S": "1", "DRAFT": "qwen2.5-coder-1.5b-instruct-dflash-b16",
           "SEARCH_STATE": os.path.relpath(state, REPO)}  # relative, as .carry/ is
    (tmp_path / "w").mkdir()
    call = partial(_phase, env, tmp_path)
    call("search-start", 1)
    call("search-wait", 30)
    assert 'state {"carried": 1}' in (tmp_path / "w/search.log").read_text()
    call("search", 1)  # the machine's own state ('{}', the search above wrote it) goes on
    assert (tmp_path / "w/search/seen.json").read_text() == "{}\n"
    (tmp_path / "w2").mkdir()
    _phase({**env, "WORK": str(tmp_path / "w2")}, tmp_path, "search", 2)
    assert (tmp_path / "w2/search/seen.json").read_text() == '{"carried": 1}'


def test_a_detached_search_reads_the_shipped_samples(tmp_path):
    """A recipe's shipped samples reach the detached job (a DSpark recipe's are its DFlash
    recipe's); samples `gen` wrote on the machine win; SEARCH_VARIANTS' commas join one
    variant's flags."""
    py = tmp_path / "py"
    py.write_text(TRAINER)
    py.chmod(0o755)
    env = {**os.environ, "PY": str(py), "REAL_PY": sys.executable, "WORK": str(tmp_path),
           "STEP_S": "1", "DRAFT": "qwen2.5-coder-1.5b-instruct-dspark-b15-gsm8k",
           "SEARCH_VARIANTS": "base= wide=--num-layers=5,--intermediate-size=8960"}
    call = partial(_phase, env, tmp_path)
    call("search-start", 1)
    done, _ = call("search-wait", 30)
    assert "every variant measured" in done
    log = (tmp_path / "search.log").read_text()
    shipped = "python/sglang_aux/data/qwen2.5-coder-1.5b-instruct-dflash-b16-gsm8k.samples.jsonl.xz"
    assert f"samples {shipped}\n" in log
    generated = tmp_path / f"samples-{env['DRAFT']}.jsonl"
    generated.write_text('{"prompt_ids": [1, 2], "output_ids": [3]}\n')
    call("search-start", 1)
    call("search-wait", 30)
    log = (tmp_path / "search.log").read_text()
    assert f"samples {generated}\n" in log
    # a variant's flags joined by commas reach the search as one variant
    assert "variant [base=]\nvariant [wide=--num-layers=5 --intermediate-size=8960]\n" in log
