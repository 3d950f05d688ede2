"""Opening a GGUF file with the `gguf` package and reading its metadata, with clear errors."""

from __future__ import annotations

from pathlib import Path
from typing import Any


class GGUFImportError(ValueError):
    """The file is not something this importer can turn into a model folder."""


def open_gguf(path: Path):
    """A `gguf.GGUFReader` over `path` (memory-mapped)."""
    try:
        from gguf import GGUFReader
    except ImportError as e:
        raise ImportError("reading GGUF files needs the `gguf` package: pip install 'gguf>=0.16'"
                          ) from e
    if not path.is_file():
        raise FileNotFoundError(f"GGUF file {path} does not exist")
    try:
        return GGUFReader(str(path))
    except (ValueError, OSError) as e:  # the reader checks the magic number and version
        raise GGUFImportError(f"{path} is not a readable GGUF file: {e}") from e


def meta(reader, key: str, default: Any = ...) -> Any:
    """Metadata value `key`; GGUFImportError when absent and no default is given."""
    field = reader.fields.get(key)
    if field is None:
        if default is ...:
            raise GGUFImportError(f"GGUF metadata lacks {key!r}")
        return default
    return field.contents()
