"""`lm-evaluation-harness`, installed on first use into a virtual environment of its own (a
`ToolFolder`: built beside its place, checked, renamed into place), for running its
`local-completions` model against our server.

The environment sees none of the calling one's packages (a venv made from a venv could only
see the base interpreter's): it holds lm-eval's `api` extra and transformers, which
`tokenizer_backend=huggingface` loads the tokenizer with, and no torch (the API models never
run one). It is run as `python -m lm_eval`, which works wherever the folder was built.
"""

from __future__ import annotations

import os
import subprocess
import venv
from pathlib import Path

from sglang_aux.srt.model_loader.model_cache import cache_dir
from sglang_aux.test.tool_folder import ToolFolder

# the api extra brings the HTTP client's retry package
LM_EVAL_REQUIREMENTS = ["lm-eval[api]", "transformers"]
LM_EVAL_MODULES = ("lm_eval.models.openai_completions", "transformers")
INSTALL_TIMEOUT_S = 900


def lm_eval_dir() -> Path:
    return Path(os.environ.get("SGLANG_AUX_LM_EVAL_DIR", cache_dir() / "lm-eval-venv"))


def install_lm_eval(target: Path | None = None) -> list[str]:
    """The command that runs lm-eval, its environment made on first use (a RuntimeError with
    pip's output when pip fails, e.g. without network; a `ToolImportError` when lm-eval is
    installed but does not import)."""
    folder = ToolFolder(target or lm_eval_dir(), _install, LM_EVAL_MODULES, _python,
                        lambda _: offline_env()).ready()
    return [*_python(folder), "-m", "lm_eval"]


def _python(folder: Path) -> list[str]:
    return [str(folder / "bin" / "python")]


def _install(folder: Path) -> None:
    venv.create(folder, with_pip=True)
    done = subprocess.run([*_python(folder), "-m", "pip", "install", "--quiet",
                           *LM_EVAL_REQUIREMENTS], capture_output=True, text=True,
                          timeout=INSTALL_TIMEOUT_S)
    if done.returncode != 0:
        raise RuntimeError(f"pip could not install {LM_EVAL_REQUIREMENTS}: "
                           f"{done.stderr.strip()[-2000:]}")


def offline_env() -> dict[str, str]:
    """lm_eval's environment: the Hugging Face hub is never asked (tasks read local files)."""
    return {**os.environ, "HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1"}
