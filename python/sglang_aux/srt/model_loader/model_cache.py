"""The model cache's folders: written atomically, checked file by file before they load.

A folder is written into a temporary sibling and renamed into place, so a crash at any point
leaves either no folder or a complete one. Reading, a folder that is damaged anyway (an older
partial write, a truncated copy) fails with an error naming the file, the cause and the fix.
"""

from __future__ import annotations

import errno
import json
import os
import shutil
import struct
import tempfile
from collections.abc import Callable
from pathlib import Path

CACHE_ENV = "SGLANG_AUX_CACHE"
_HEADER_LEN_BYTES = 8  # a safetensors file opens with its header's length, u64 little-endian


class ModelFileError(OSError):
    """A model folder's file is missing or damaged; the message says which and how to fix it."""


def cache_dir() -> Path:
    return Path(os.environ.get(CACHE_ENV, Path.home() / ".cache" / "sglang_aux"))


def _in_cache(folder: Path) -> bool:
    return folder.resolve().is_relative_to(cache_dir().resolve())


def model_file_error(path: Path, cause: str) -> ModelFileError:
    folder = path.parent
    if _in_cache(folder):
        fix = f"delete {folder} and start again: a built-in model is rebuilt on first use"
    else:
        fix = f"restore {path.name} in {folder} (copy or download the model folder again)"
    return ModelFileError(f"{path}: {cause}; {fix}")


def write_folder(out: Path, write: Callable[[Path], object], *, keep_existing: bool) -> Path:
    """`out`, filled by `write(tmp)` in a temporary folder beside it and then renamed into place
    (replacing an empty `out`). An `out` with files is kept when `keep_existing` (the cache:
    another process finished first), else a FileExistsError."""
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{out.name}.", suffix=".tmp", dir=out.parent))
    try:
        write(tmp)
        os.rename(tmp, out)
    except OSError as e:
        if e.errno not in (errno.ENOTEMPTY, errno.EEXIST):
            raise
        if not keep_existing:
            raise FileExistsError(f"{out} already holds files: delete it or choose another "
                                  "folder") from None
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return out


def _check_json(path: Path, required: bool = True) -> None:
    if not path.is_file():
        if required:
            raise model_file_error(path, "the file is missing")
        return
    try:
        json.loads(path.read_bytes())
    except ValueError as e:  # JSONDecodeError and UnicodeDecodeError
        raise model_file_error(path, f"not valid JSON ({e}): the file is truncated or "
                                     "damaged") from None


def _check_safetensors(path: Path) -> None:
    """The header parses and the file is as long as the header's last tensor says."""
    size = path.stat().st_size
    with path.open("rb") as f:
        raw = f.read(_HEADER_LEN_BYTES)
        if len(raw) < _HEADER_LEN_BYTES:
            raise model_file_error(path, f"{size} bytes, too short for a safetensors header")
        (header_len,) = struct.unpack("<Q", raw)
        if _HEADER_LEN_BYTES + header_len > size:
            raise model_file_error(path, f"truncated: {size:,} bytes, shorter than its own "
                                         f"{header_len:,}-byte header")
        try:
            header = json.loads(f.read(header_len))
        except ValueError as e:
            raise model_file_error(path, f"its header is not valid JSON ({e})") from None
    data_len = max((t["data_offsets"][1] for k, t in header.items() if k != "__metadata__"),
                   default=0)
    expected = _HEADER_LEN_BYTES + header_len + data_len
    if size != expected:
        raise model_file_error(path, f"truncated or damaged: {size:,} bytes where its header "
                                     f"describes {expected:,}")


def check_model_folder(folder: str | Path, *, weights: bool) -> None:
    """ModelFileError unless `config.json` parses and, with `weights`, every
    `*.safetensors` file (at least one) is whole."""
    folder = Path(folder)
    _check_json(folder / "config.json")
    if not weights:
        return
    files = sorted(folder.glob("*.safetensors"))
    if not files:
        raise model_file_error(folder / "model.safetensors", "the file is missing")
    for path in files:
        _check_safetensors(path)


def check_tokenizer_folder(folder: str | Path) -> None:
    """ModelFileError unless `tokenizer.json` (and `tokenizer_config.json`, when there) parse."""
    folder = Path(folder)
    _check_json(folder / "tokenizer.json")
    _check_json(folder / "tokenizer_config.json", required=False)
