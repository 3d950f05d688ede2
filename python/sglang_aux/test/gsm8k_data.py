"""Where the GSM8K files come from: `$SGLANG_AUX_GSM8K_DIR`, else the copy beside the checkout
(`../shared/data/gsm8k`), else the official files downloaded from the public GSM8K repository
on first use into the cache (`<cache>/gsm8k/`), sha256 checked and written atomically, as
SGLang's harness downloads them. Standard library only (the harness runs without torch)."""

from __future__ import annotations

import hashlib
import os
import tempfile
import urllib.error
import urllib.request
from pathlib import Path

from sglang_aux.srt.model_loader.model_cache import cache_dir

DATA_DIR_ENV = "SGLANG_AUX_GSM8K_DIR"
URL_ENV = "SGLANG_AUX_GSM8K_URL"  # another base URL serving test.jsonl and train.jsonl
OFFICIAL_URL = ("https://raw.githubusercontent.com/openai/grade-school-math/master/"
                "grade_school_math/data")
# sha256 of the official files (test: 1,319 questions, train: 7,473)
SHA256 = {
    "test": "3730d312f6e3440559ace48831e51066acaca737f6eabec99bccb9e4b3c39d14",
    "train": "17f347dc51477c50d4efb83959dbb7c56297aba886e5544ee2aaed3024813465",
}
REPO_DATA_DIR = Path(__file__).resolve().parents[3].parent / "shared" / "data" / "gsm8k"
DOWNLOAD_TIMEOUT_S = 60
_CHUNK = 1 << 20


def local_path(split: str) -> Path | None:
    """`$SGLANG_AUX_GSM8K_DIR/<split>.jsonl` (whether or not it exists: the variable wins),
    else the copy beside the checkout when present; never downloads."""
    if os.environ.get(DATA_DIR_ENV):
        return Path(os.environ[DATA_DIR_ENV]) / f"{split}.jsonl"
    path = REPO_DATA_DIR / f"{split}.jsonl"
    return path if path.is_file() else None


def data_paths(data_path: str | Path | None) -> tuple[Path, Path]:
    """The questions file and the shots file: `data_path` and `train.jsonl` beside it (the
    harness's `--data-path`), else `gsm8k_path("test")` and `gsm8k_path("train")`."""
    if data_path:
        return Path(data_path), Path(data_path).with_name("train.jsonl")
    return gsm8k_path("test"), gsm8k_path("train")


def download(url: str, dest: Path, sha256: str) -> Path:
    """`dest`, fetched from `url` into a temporary file beside it and renamed into place once
    its sha256 is `sha256`; on a mismatch or a failed transfer nothing is left behind."""
    dest.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{dest.name}.", suffix=".tmp", dir=dest.parent)
    try:
        digest = hashlib.sha256()
        with os.fdopen(fd, "wb") as out, urllib.request.urlopen(
                url, timeout=DOWNLOAD_TIMEOUT_S) as resp:
            while chunk := resp.read(_CHUNK):
                digest.update(chunk)
                out.write(chunk)
        if digest.hexdigest() != sha256:
            raise ValueError(f"{url}: sha256 {digest.hexdigest()} is not the expected {sha256}; "
                             f"nothing was written to {dest}")
        os.replace(tmp, dest)
    finally:
        Path(tmp).unlink(missing_ok=True)
    return dest


def gsm8k_path(split: str) -> Path:
    """The `split` ("test" or "train") file to read: `local_path`, else the cached download
    (fetched now when missing)."""
    if (path := local_path(split)) is not None:
        return path
    dest = cache_dir() / "gsm8k" / f"{split}.jsonl"
    if dest.is_file():
        return dest
    base = os.environ.get(URL_ENV, OFFICIAL_URL).rstrip("/")
    url = f"{base}/{split}.jsonl"
    print(f"downloading GSM8K {split}.jsonl from {base} to {dest}")
    try:
        return download(url, dest, SHA256[split])
    except urllib.error.URLError as e:
        raise ConnectionError(f"could not download {url} ({e.reason}); pass --data-path or set "
                              f"{DATA_DIR_ENV} to a folder holding test.jsonl and "
                              "train.jsonl") from None


def local_path_or_skip(split: str) -> Path:
    """For tests that need the real questions: `local_path(split)`, else a pytest skip (tests
    never download)."""
    path = local_path(split)
    if path is None or not path.is_file():
        import pytest

        pytest.skip(f"GSM8K {split}.jsonl is neither in ${DATA_DIR_ENV} nor at {REPO_DATA_DIR}")
    return path
