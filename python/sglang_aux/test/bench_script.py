"""A benchmark script (`benchmark/...`, not a package) imported by its tests, as it runs when
run directly: its folder on sys.path for its sibling scripts, and registered in sys.modules
under its name (its dataclasses resolve their annotations there)."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType


def load_bench(script: Path) -> ModuleType:
    """The module of `script` (a .py file path), loaded anew."""
    if str(script.parent) not in sys.path:
        sys.path.insert(0, str(script.parent))
    spec = importlib.util.spec_from_file_location(script.stem, script)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module
