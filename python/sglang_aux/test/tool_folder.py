"""A folder of tools that tests install on first use (lm-eval's virtual environment, SGLang's
client packages), trusted only once its modules have been imported from it.

The install runs in a temporary folder beside the final one (`model_cache.write_folder`); the
modules the tests run from it must import there before a stamp listing them is written and the
folder is renamed into place, so a failed or partial install leaves nothing behind. A stamped
folder is used after its stamp's modules import again; one that no longer imports, or an
install of ours without a stamp of this kind (an older one), is rebuilt. A folder that holds
files but no stamp at all is not ours to delete: the error names it.
"""

from __future__ import annotations

import shutil
import subprocess
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from sglang_aux.srt.model_loader.model_cache import write_folder

STAMP = ".installed"
IMPORT_TIMEOUT_S = 300
INSTALL_TIMEOUT_S = 900


class ToolImportError(ImportError):
    """The install finished but its modules do not import: a package is missing from the list
    to install (not a network failure, so the tests that need it fail instead of skipping)."""


@dataclass(frozen=True)
class ToolFolder:
    path: Path
    # fills the folder it is given; a RuntimeError when pip cannot (e.g. without network)
    install: Callable[[Path], None]
    modules: tuple[str, ...]  # what the tests import from it
    python: Callable[[Path], list[str]]  # the interpreter that imports them, for a folder
    env: Callable[[Path], dict[str, str]]  # its environment, for a folder

    def ready(self) -> Path:
        """`path`, installed and checked (built now unless a checked install is there)."""
        stamped = self._stamped_modules()
        if stamped and self._import_error(self.path, stamped) is None:
            return self.path
        self._remove_stale()
        return write_folder(self.path, self._build, keep_existing=True)

    def _stamped_modules(self) -> tuple[str, ...]:
        stamp = self.path / STAMP
        return tuple(stamp.read_text().split()) if stamp.is_file() else ()

    def _import_error(self, folder: Path, modules: tuple[str, ...]) -> str | None:
        done = subprocess.run([*self.python(folder), "-c", f"import {', '.join(modules)}"],
                              env=self.env(folder), capture_output=True, text=True,
                              timeout=IMPORT_TIMEOUT_S)
        return None if done.returncode == 0 else done.stderr.strip()[-2000:]

    def _remove_stale(self) -> None:
        if not self.path.is_dir() or not any(self.path.iterdir()):
            return  # write_folder's rename replaces an empty folder
        if not any(self.path.glob(f"{STAMP}*")):
            raise FileExistsError(f"{self.path} holds files but no {STAMP} stamp of a checked "
                                  "install: delete it, or choose another folder")
        shutil.rmtree(self.path)

    def _build(self, tmp: Path) -> None:
        self.install(tmp)
        error = self._import_error(tmp, self.modules)
        if error is not None:
            raise ToolImportError(f"installed for {self.path}, but {', '.join(self.modules)} "
                                  f"do not import: {error}")
        (tmp / STAMP).write_text("\n".join(self.modules) + "\n")


def pip_install_target(folder: Path, args: list[str], what: str) -> None:
    """`pip install --no-deps --target folder args` (an install step of a `ToolFolder`); a
    RuntimeError with pip's output, naming `what`, when pip fails."""
    done = subprocess.run([sys.executable, "-m", "pip", "install", "--quiet", "--no-deps",
                           "--target", str(folder), *args],
                          capture_output=True, text=True, timeout=INSTALL_TIMEOUT_S)
    if done.returncode != 0:
        raise RuntimeError(f"pip could not install {what}: {done.stderr.strip()[-2000:]}")
