"""Packages of python/sglang_aux import downwards.

A package is a directory of python/sglang_aux (`srt.layers`, `srt.layers.attention`, ...; the
root's own files are `sglang_aux`). An edge A -> B is an import in a file of A of a module of
B, wherever it is: at module level, under `if TYPE_CHECKING:` (a type checker follows it, and
a newcomer reading the file does too), or inside a function (it runs when the function does).
The graph must have no cycle, and every edge must go down the layer order
docs/architecture.md lists.
"""

from __future__ import annotations

import ast
import re
from collections import defaultdict, deque
from itertools import pairwise
from pathlib import Path

from sglang_aux.test.ci.ci_register import register_cpu_ci

register_cpu_ci(est_time=5, suite="default")

REPO = Path(__file__).resolve().parents[2]
SOURCES = REPO / "python"
ARCHITECTURE = REPO / "docs" / "architecture.md"
ROOT_PACKAGE = "sglang_aux"

Edges = dict[tuple[str, str], set[str]]  # (importer, imported) -> importing files


def _module_file(sources: Path, module: str) -> Path | None:
    path = sources.joinpath(*module.split("."))
    if (path / "__init__.py").is_file():
        return path / "__init__.py"
    return path.with_suffix(".py") if path.with_suffix(".py").is_file() else None


def _package_of(sources: Path, file: Path) -> str:
    return ".".join(file.parent.relative_to(sources / ROOT_PACKAGE).parts) or ROOT_PACKAGE


def _imports(tree: ast.Module):
    """Every import statement of the module: at module level, in class bodies, `if` / `try`
    blocks and function bodies alike."""
    return (node for node in ast.walk(tree) if isinstance(node, (ast.Import, ast.ImportFrom)))


def _imported_modules(node: ast.Import | ast.ImportFrom, module: str, is_init: bool) -> list[str]:
    if isinstance(node, ast.Import):
        return [alias.name for alias in node.names]
    base = node.module or ""
    if node.level:
        parts = module.split(".")
        parts = parts[: len(parts) - node.level + (1 if is_init else 0)]
        base = ".".join([*parts, base] if base else parts)
    # `from pkg import name`: the submodule pkg.name when there is one, else pkg itself
    return [f"{base}.{alias.name}" for alias in node.names] + [base]


def package_graph(sources: Path) -> Edges:
    edges: Edges = defaultdict(set)
    for file in sorted((sources / ROOT_PACKAGE).rglob("*.py")):
        is_init = file.name == "__init__.py"
        module = ".".join(file.relative_to(sources).with_suffix("").parts)
        module = module.removesuffix(".__init__")
        importer = _package_of(sources, file)
        for node in _imports(ast.parse(file.read_text(), filename=str(file))):
            names = _imported_modules(node, module, is_init)
            targets = [_module_file(sources, n) for n in names if n.split(".")[0] == ROOT_PACKAGE]
            if isinstance(node, ast.ImportFrom):  # the base only when no name is a submodule
                found = [t for t in targets[:-1] if t is not None]
                targets = found or targets[-1:]
            for target in filter(None, targets):
                imported = _package_of(sources, target)
                if imported != importer:
                    edges[importer, imported].add(file.relative_to(sources).as_posix())
    return dict(edges)


def find_cycle(edges: Edges) -> list[str] | None:
    """One shortest cycle `[a, b, ..., a]` of the graph, None when it has none."""
    adjacent: dict[str, set[str]] = defaultdict(set)
    for a, b in edges:
        adjacent[a].add(b)
    best: list[str] | None = None
    for start in sorted(adjacent):
        parent: dict[str, str | None] = {start: None}
        queue = deque([start])
        while queue:  # breadth first: the first way back to `start` is a shortest one
            a = queue.popleft()
            if start in adjacent[a]:
                path = [a]
                while (up := parent[path[-1]]) is not None:
                    path.append(up)
                cycle = [*reversed(path), start]
                if best is None or len(cycle) < len(best):
                    best = cycle
                break
            for b in sorted(adjacent[a] - parent.keys()):
                parent[b] = a
                queue.append(b)
    return best


def describe_edges(pairs: list[tuple[str, str]], edges: Edges) -> str:
    return "\n".join(f"  {a} -> {b}: {', '.join(sorted(edges[a, b]))}" for a, b in pairs)


def describe_cycle(cycle: list[str], edges: Edges) -> str:
    return (f"import cycle between packages {' -> '.join(cycle)}; the importing files:\n"
            + describe_edges(list(pairwise(cycle)), edges))


def layer_order(doc: Path) -> list[str]:
    """The packages the `## Package layers` section of `doc` lists, bottom first."""
    section = doc.read_text().split("## Package layers", 1)[1].split("\n## ", 1)[0]
    return re.findall(r"^\d+\. `([\w.]+)`", section, flags=re.MULTILINE)


def test_no_import_cycle_between_packages():
    edges = package_graph(SOURCES)
    assert len(edges) > 50, "the scan found too few imports to be reading the sources"
    cycle = find_cycle(edges)
    assert cycle is None, describe_cycle(cycle, edges)


def test_imports_go_down_the_documented_layers():
    edges = package_graph(SOURCES)
    order = layer_order(ARCHITECTURE)
    assert len(order) == len(set(order)), f"a package is listed twice in {ARCHITECTURE}"
    packages = {p for edge in edges for p in edge} | {
        _package_of(SOURCES, f) for f in (SOURCES / ROOT_PACKAGE).rglob("*.py")}
    assert packages == set(order), (
        f"{ARCHITECTURE.name} must list every package once: unlisted "
        f"{sorted(packages - set(order))}, gone {sorted(set(order) - packages)}")
    rank = {p: i for i, p in enumerate(order)}
    upward = sorted((a, b) for a, b in edges if rank[a] < rank[b])
    assert not upward, (f"imports up the layer order of {ARCHITECTURE.name}:\n"
                        + describe_edges(upward, edges))


def _write(root: Path, rel: str, text: str) -> None:
    path = root / ROOT_PACKAGE / rel
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)


def test_a_cycle_is_found_and_named(tmp_path):
    _write(tmp_path, "__init__.py", "")
    for pkg in ("low", "mid", "top"):
        _write(tmp_path, f"{pkg}/__init__.py", "")
    _write(tmp_path, "low/state.py", "import os\n")
    _write(tmp_path, "mid/layer.py", "from sglang_aux.low import state\n")
    # only a type checker reads this import: still an edge
    _write(tmp_path, "low/typed.py", "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n"
                                     "    from sglang_aux.mid.layer import X\n")
    # a relative import is an edge, and so is one inside a function
    _write(tmp_path, "top/run.py", "from ..mid import layer\n")
    _write(tmp_path, "top/lazy.py", "def f():\n    from sglang_aux.low import typed\n")
    edges = package_graph(tmp_path)
    assert edges == {("mid", "low"): {"sglang_aux/mid/layer.py"},
                     ("low", "mid"): {"sglang_aux/low/typed.py"},
                     ("top", "mid"): {"sglang_aux/top/run.py"},
                     ("top", "low"): {"sglang_aux/top/lazy.py"}}
    cycle = find_cycle(edges)
    assert cycle in (["low", "mid", "low"], ["mid", "low", "mid"])
    message = describe_cycle(cycle, edges)
    assert "sglang_aux/low/typed.py" in message and "sglang_aux/mid/layer.py" in message

    del edges["low", "mid"]
    assert find_cycle(edges) is None


def test_a_long_cycle_is_found():
    edges = {("a", "b"): {"a.py"}, ("b", "c"): {"b.py"}, ("c", "d"): {"c.py"},
             ("d", "b"): {"d.py"}, ("a", "d"): {"a2.py"}}
    assert find_cycle(edges) == ["b", "c", "d", "b"]


if __name__ == "__main__":
    import sys

    import pytest

    sys.exit(pytest.main([__file__, "-v"]))
