"""The model cache: a built-in folder appears whole or not at all (a writer killed before its
rename, or after writing config.json only, leaves nothing a later start accepts, and that start
rebuilds it); a damaged folder (truncated model.safetensors, tokenizer.json or config.json, a
missing file) fails naming the file, the cause and the fix; the CLI tools write atomically too
and refuse a folder that holds files."""

import json
import multiprocessing
import os
import re
import signal
import sys
from pathlib import Path

import pytest

from sglang_aux.srt.model_loader.builtin import resolve_model, resolve_model_path
from sglang_aux.srt.model_loader.model_cache import ModelFileError, write_folder
from sglang_aux.srt.model_loader.preset_checkpoint import write_checkpoint
from sglang_aux.srt.server_args import ServerArgs
from sglang_aux.test.ci.ci_register import register_cpu_ci

register_cpu_ci(est_time=20, suite="default")

PRESET = "tiny-llama"


@pytest.fixture
def cache(tmp_path, monkeypatch) -> Path:
    monkeypatch.setenv("SGLANG_AUX_CACHE", str(tmp_path / "cache"))
    return tmp_path / "cache"


def _load(model_path: str = PRESET) -> None:
    resolve_model(ServerArgs(model_path=model_path, device="cpu"))


def _die_while_writing(cache: str, after: str) -> None:
    """A real process killed inside its folder write: after config.json, or after every file
    but before the rename."""
    os.environ["SGLANG_AUX_CACHE"] = cache

    def write(tmp: Path) -> None:
        if after == "config":
            (tmp / "config.json").write_text("{}")
        else:
            write_checkpoint(PRESET, tmp)
        os.kill(os.getpid(), signal.SIGKILL)

    write_folder(Path(cache) / PRESET, write, keep_existing=True)


@pytest.mark.parametrize("after", ["config", "all_files"])
def test_a_writer_killed_mid_write_leaves_nothing_a_start_accepts(cache, after):
    proc = multiprocessing.get_context("spawn").Process(target=_die_while_writing,
                                                        args=(str(cache), after))
    proc.start()
    proc.join(60)
    assert proc.exitcode == -signal.SIGKILL
    assert not (cache / PRESET).exists()
    assert [p.name.startswith(f".{PRESET}.") for p in cache.iterdir()] == [True]
    _load()  # the next start writes the folder and loads it
    assert sorted(p.name for p in (cache / PRESET).iterdir()) == [
        "config.json", "model.safetensors", "tokenizer.json", "tokenizer_config.json"]


def test_a_folder_left_without_config_by_an_older_version_is_rebuilt(cache):
    stale = cache / PRESET
    stale.mkdir(parents=True)
    (stale / "model.safetensors").write_bytes(b"\0" * 10)
    _load()
    assert json.loads((stale / "config.json").read_text())["architectures"] == [
        "LlamaForCausalLM"]


def test_a_concurrent_writer_that_finished_first_is_kept(cache):
    first = resolve_model_path(PRESET)
    before = (Path(first) / "model.safetensors").stat().st_mtime_ns
    write_checkpoint(PRESET, first, seed=1, keep_existing=True)
    assert (Path(first) / "model.safetensors").stat().st_mtime_ns == before
    assert [p.name for p in cache.iterdir()] == [PRESET]  # no temporary folder left


@pytest.mark.parametrize("file, keep, cause", [
    ("model.safetensors", 5000, "truncated or damaged: 5,000 bytes where its header describes"),
    ("model.safetensors", 4, "4 bytes, too short for a safetensors header"),
    ("model.safetensors", 64, "truncated: 64 bytes, shorter than its own"),
    ("tokenizer.json", 1000, "not valid JSON .*: the file is truncated or damaged"),
    ("tokenizer_config.json", 10, "not valid JSON"),
    ("config.json", 10, "not valid JSON"),
    ("model.safetensors", None, "the file is missing"),
    ("tokenizer.json", None, "the file is missing"),
])
def test_a_damaged_cache_folder_names_the_file_the_cause_and_the_fix(cache, file, keep, cause):
    folder = Path(resolve_model_path(PRESET))
    path = folder / file
    if keep is None:
        path.unlink()
    else:
        path.write_bytes(path.read_bytes()[:keep])
    with pytest.raises(ModelFileError) as err:
        _load()
    message = str(err.value)
    assert message.startswith(f"{path}: ")
    assert f"delete {folder} and start again" in message
    assert re.search(cause, message), message


def test_a_damaged_user_folder_says_to_restore_the_file(tmp_path):
    folder = write_checkpoint(PRESET, tmp_path / "mine")
    weights = folder / "model.safetensors"
    weights.write_bytes(weights.read_bytes()[:-1])
    with pytest.raises(ModelFileError, match=r"model.safetensors: truncated .* restore "
                                             r"model.safetensors in .*mine \(copy or download"):
        _load(str(folder))


def test_the_cli_tools_refuse_a_folder_that_holds_files(tmp_path):
    out = write_checkpoint(PRESET, tmp_path / "out")
    with pytest.raises(FileExistsError, match="already holds files: delete it or choose"):
        write_checkpoint(PRESET, out)
    empty = tmp_path / "empty"
    empty.mkdir()
    assert (write_checkpoint(PRESET, empty) / "config.json").is_file()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["empty", "out"]


if __name__ == "__main__":
    sys.exit(pytest.main([__file__, "-q"]))
