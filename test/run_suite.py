"""Runs the registered tests of one hardware kind.

    python3 test/run_suite.py --hw cpu [--suite default] [--list] [--timeout-per-file 1200]

A file under test/registered/ joins a run through a module-level `register_cpu_ci(...)` or
`register_cuda_ci(...)` call, read here from the file's syntax tree without importing it.
Each file runs in its own pytest process so one crash cannot take the others down.
"""

from __future__ import annotations

import argparse
import ast
import os
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parent
REGISTERED = ROOT / "registered"
MARKERS = {"cpu": "register_cpu_ci", "cuda": "register_cuda_ci"}


@dataclass(frozen=True)
class TestFile:
    path: Path
    est_time: float
    suite: str


def _literal(node: ast.AST, default):
    try:
        return ast.literal_eval(node)
    except ValueError:
        return default


def registrations(path: Path, hw: str) -> list[TestFile]:
    tree = ast.parse(path.read_text(), filename=str(path))
    found = []
    for node in tree.body:
        if not (isinstance(node, ast.Expr) and isinstance(node.value, ast.Call)):
            continue
        func = node.value.func
        name = getattr(func, "id", getattr(func, "attr", None))
        if name != MARKERS[hw]:
            continue
        kwargs = {k.arg: _literal(k.value, None) for k in node.value.keywords}
        args = [_literal(a, None) for a in node.value.args]
        est = kwargs.get("est_time", args[0] if args else 60)
        suite = kwargs.get("suite", args[1] if len(args) > 1 else "default")
        found.append(TestFile(path, float(est), suite))
    return found


def collect(hw: str, suite: str) -> list[TestFile]:
    files = sorted(p for p in REGISTERED.rglob("*.py")
                   if p.name not in ("__init__.py", "conftest.py"))
    return [t for p in files for t in registrations(p, hw) if t.suite == suite]


def main() -> int:
    parser = argparse.ArgumentParser(description="Run registered tests")
    parser.add_argument("--hw", choices=sorted(MARKERS), required=True)
    parser.add_argument("--suite", default="default")
    parser.add_argument("--list", action="store_true", help="print the files and exit")
    parser.add_argument("--timeout-per-file", type=int, default=1200)
    args = parser.parse_args()
    tests = collect(args.hw, args.suite)
    total_est = sum(t.est_time for t in tests)
    print(f"{len(tests)} {args.hw} test files in suite {args.suite!r}, estimated {total_est:.0f} s")
    if args.list:
        for t in tests:
            print(f"  {t.est_time:6.0f}s  {t.path.relative_to(ROOT.parent)}")
        return 0
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT.parent / "python"),
                                                      env.get("PYTHONPATH")]))
    if args.hw == "cpu":
        # torch's CPU exp / cos are sometimes ~1e-4 off on a worker thread's share of a
        # tensor (about 1 process in 10 at 2 threads, never at 1; docs/testing.md): the tests
        # that compare float32 results exactly would fail by chance
        env.setdefault("OMP_NUM_THREADS", "1")
    failed = []
    start = time.perf_counter()
    for t in tests:
        rel = t.path.relative_to(ROOT.parent)
        print(f"\n=== {rel} (est {t.est_time:.0f} s)", flush=True)
        t0 = time.perf_counter()
        try:
            rc = subprocess.run([sys.executable, "-m", "pytest", "-q", str(t.path)], env=env,
                                timeout=args.timeout_per_file).returncode
        except subprocess.TimeoutExpired:
            rc = -1
            print(f"timed out after {args.timeout_per_file} s")
        print(f"=== {rel}: {'ok' if rc == 0 else f'FAILED (rc={rc})'} in "
              f"{time.perf_counter() - t0:.1f} s", flush=True)
        if rc != 0:
            failed.append(str(rel))
    print(f"\n{len(tests) - len(failed)}/{len(tests)} files passed in "
          f"{time.perf_counter() - start:.0f} s")
    for f in failed:
        print(f"  FAILED {f}")
    return 1 if failed or not tests else 0


if __name__ == "__main__":
    sys.exit(main())
