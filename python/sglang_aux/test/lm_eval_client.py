"""`lm-evaluation-harness` (`lm-eval[api]`), installed on first use into a virtual environment
that sees this one's packages (torch, transformers, ... are not installed twice), for running
its `local-completions` model against our server."""

from __future__ import annotations

import os
import subprocess
import venv
from pathlib import Path

LM_EVAL_REQUIREMENT = "lm-eval[api]"  # the api extra brings the HTTP client's retry package
DEFAULT_DIR = Path.home() / ".cache" / "sglang_aux" / "lm-eval-venv"
INSTALL_TIMEOUT_S = 900


def lm_eval_dir() -> Path:
    return Path(os.environ.get("SGLANG_AUX_LM_EVAL_DIR", DEFAULT_DIR))


def install_lm_eval(target: Path | None = None) -> Path:
    """The `lm_eval` command of a virtual environment holding lm-eval, made there on first use
    (a RuntimeError with pip's output when that fails, e.g. without network)."""
    target = target or lm_eval_dir()
    command = target / "bin" / "lm_eval"
    marker = target / ".installed"
    if not marker.is_file():
        venv.create(target, system_site_packages=True, with_pip=True, clear=True)
        pip = [str(target / "bin" / "python"), "-m", "pip", "install", "--quiet"]
        done = subprocess.run([*pip, LM_EVAL_REQUIREMENT], capture_output=True, text=True,
                              timeout=INSTALL_TIMEOUT_S)
        if done.returncode != 0 or not command.is_file():
            raise RuntimeError(f"pip could not install {LM_EVAL_REQUIREMENT}: "
                               f"{done.stderr.strip()[-2000:]}")
        marker.write_text("ok\n")
    return command


def offline_env() -> dict[str, str]:
    """lm_eval's environment: the Hugging Face hub is never asked (tasks read local files)."""
    return {**os.environ, "HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1"}
