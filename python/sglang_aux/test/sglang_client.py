"""SGLang 0.5.23's own client tools (its GSM8K harness, `bench_serving`), installed beside our
package without SGLang's runtime or CUDA dependencies, for running them against our server.

`pip install --no-deps --target DIR` of the `sglang` wheel and the pure-Python (or small
binary) packages its client modules import. `bench_serving`'s import chain reaches
`torchvision` through SGLang's multimodal configs, which it never calls for text: a stand-in
package (`torchvision_standin`) satisfies those imports. `client_env()` gives the environment
that runs `python -m sglang.test.few_shot_gsm8k` and `python -m sglang.bench_serving` with
them. The folder is a `ToolFolder`: installed beside its place and used only once those modules
import from it.
"""

from __future__ import annotations

import os
import sys
import tarfile
from collections.abc import Callable
from pathlib import Path

from sglang_aux.srt.model_loader.model_cache import cache_dir
from sglang_aux.test.tool_folder import ToolFolder, pip_install_target

SGLANG_VERSION = "0.5.23"
# What `sglang.test.few_shot_gsm8k` and `sglang.bench_serving` import beyond the `[test]`
# extra's closure (torch, transformers, numpy, requests, tqdm, openai, ...), found by importing
# them in a fresh virtual environment holding only that.
CLIENT_PACKAGES = [
    f"sglang=={SGLANG_VERSION}", "pybase64", "pillow", "msgspec", "pyzmq", "aiohttp",
    "multidict", "yarl", "propcache", "aiohappyeyeballs", "aiosignal", "frozenlist",
    "datasets", "multiprocess", "pandas", "pyarrow", "dill", "xxhash", "apache-tvm-ffi",
    "sentencepiece", "compressed-tensors", "loguru", "orjson", "python-dateutil",
    "ipython", "traitlets",
]
CLIENT_MODULES = ("sglang.test.few_shot_gsm8k", "sglang.bench_serving")
_STANDIN_ROOT = "torchvision_standin"

# Any attribute of the stand-in modules is a class whose attributes are their own names
# (InterpolationMode.BICUBIC, ...); the version is older than any transformers checks for, so
# transformers never takes torchvision's paths.
_STANDIN_SOURCE = '''"""A torchvision stand-in: sglang's text clients import it, never call it."""
__version__ = "0.0.0"


class _Names(type):
    def __getattr__(cls, name):
        return name


def __getattr__(name):
    return _Names(name, (), {})
'''
_STANDIN_MODULES = ["torchvision/__init__.py", "torchvision/transforms/__init__.py",
                    "torchvision/transforms/functional.py",
                    "torchvision/transforms/v2/__init__.py",
                    "torchvision/transforms/v2/functional.py"]


def client_dir() -> Path:
    return Path(os.environ.get("SGLANG_AUX_SGLANG_CLIENT_DIR",
                               cache_dir() / f"sglang-{SGLANG_VERSION}-client"))


def install_client(target: Path | None = None) -> Path:
    """The folder holding SGLang's client packages, installed there on first use (a
    RuntimeError with pip's output when pip fails, e.g. without network; a `ToolImportError`
    when the modules do not import). A folder `install_offline` made is kept as it is: its
    stamp names the GSM8K harness only, and the device machine has no index to rebuild from."""
    return _folder(target, _install_online, CLIENT_MODULES).ready()


def install_offline(source: Path, target: Path | None = None) -> Path:
    """The same folder from files carried to a machine without a package index
    (`scripts/device/fetch_sglang_client.sh`): the wheels, and SGLang's Python sources; they
    cover the GSM8K harness."""

    def install(folder: Path) -> None:
        pip_install_target(folder, ["--no-index", *sorted(str(p) for p in source.glob("*.whl"))],
                     "the carried wheels")
        with tarfile.open(source / f"sglang-{SGLANG_VERSION}-py.tgz") as sources:
            sources.extractall(folder, filter="data")
        _add_standin(folder)

    return _folder(target, install, CLIENT_MODULES[:1]).ready()


def _folder(target: Path | None, install: Callable[[Path], None],
            modules: tuple[str, ...]) -> ToolFolder:
    return ToolFolder(target or client_dir(), install, modules, lambda _: [sys.executable],
                      client_env)


def _install_online(folder: Path) -> None:
    pip_install_target(folder, CLIENT_PACKAGES, CLIENT_PACKAGES[0])
    _add_standin(folder)


def _add_standin(folder: Path) -> None:
    for module in _STANDIN_MODULES:
        path = folder / _STANDIN_ROOT / module
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(_STANDIN_SOURCE)


def client_env(target: Path) -> dict[str, str]:
    """The environment in which `python -m sglang...` runs SGLang's client modules (ours
    stay importable; the stand-in comes last, so a real torchvision wins)."""
    paths = [str(target), os.environ.get("PYTHONPATH", ""), str(target / _STANDIN_ROOT)]
    return {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in paths if p)}


if __name__ == "__main__":
    import argparse

    parser = argparse.ArgumentParser(description="install SGLang's client modules")
    parser.add_argument("--offline", type=Path, help="a folder from fetch_sglang_client.sh")
    args = parser.parse_args()
    print(install_offline(args.offline) if args.offline else install_client())
