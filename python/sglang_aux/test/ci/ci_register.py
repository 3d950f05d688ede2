"""Markers that `test/run_suite.py` reads from registered test files.

The calls are no-ops when the test runs; the runner parses them statically (AST) so that a
file is scheduled without being imported.
"""


def register_cpu_ci(est_time: float, suite: str = "default", **_: object) -> None:
    """Marks a test file for CPU CI. `est_time` is its expected wall time in seconds."""


def register_cuda_ci(est_time: float, suite: str = "default", **_: object) -> None:
    """Marks a test file for CUDA CI (run on the lent H200)."""
