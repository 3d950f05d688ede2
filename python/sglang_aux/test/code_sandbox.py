"""Run untrusted Python (a model's completion and its tests) in a subprocess of its own: no
network (a network namespace of its own through `unshare -n` when the machine allows one,
and in any case an audit hook that ends the program at its first socket call), a CPU-time,
wall-time and memory limit, its own temporary directory, an isolated interpreter (`-I`) and
an empty environment. A crash, hang or memory hog fails that program alone, with a verdict
saying which. This bounds what a mistaken completion does; it is no defence against code
written to escape it."""

from __future__ import annotations

import functools
import os
import resource
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from typing import Literal

Verdict = Literal["passed", "failed", "timeout", "out_of_memory", "network", "crashed"]

# Exit statuses the runner below uses to say why a program ended.
FAILED_EXIT = 1  # an exception (an assertion of the tests, an error of the code)
MEMORY_EXIT = 3
NETWORK_EXIT = 4
DEFAULT_TIMEOUT_S = 10.0  # wall time; CPU time is limited to the same
DEFAULT_MEMORY_BYTES = 1 << 30  # address space: the interpreter takes ~20 MB of it
OUTPUT_TAIL_CHARS = 500
# Runs the program file given as its argument. The audit hook is set before any of the
# program runs; `os._exit` so that no handler of the program's can turn a verdict around.
RUNNER = f"""
import os, sys, traceback
def _no_network(event, args):
    if event.startswith("socket."):
        os._exit({NETWORK_EXIT})
sys.addaudithook(_no_network)
source = open(sys.argv[1]).read()
try:
    exec(compile(source, "program.py", "exec"), {{"__name__": "__main__"}})
except MemoryError:
    os._exit({MEMORY_EXIT})
except BaseException:
    traceback.print_exc()
    sys.stderr.flush()
    os._exit({FAILED_EXIT})
sys.stdout.flush()
os._exit(0)
"""


@dataclass(frozen=True)
class ExecutionResult:
    verdict: Verdict
    seconds: float
    output: str  # the tail of its stderr (the traceback of a failure)

    @property
    def passed(self) -> bool:
        return self.verdict == "passed"


@functools.cache
def network_namespace_prefix() -> tuple[str, ...]:
    """`unshare -n` (with `-r` when not root) when it runs here, else nothing (the audit
    hook alone then keeps the program off the network)."""
    if shutil.which("unshare") is None:
        return ()
    prefix = ("unshare", "-n") if os.geteuid() == 0 else ("unshare", "-n", "-r")
    try:
        ok = subprocess.run([*prefix, "true"], capture_output=True, timeout=10).returncode == 0
    except (OSError, subprocess.TimeoutExpired):
        ok = False
    return prefix if ok else ()


def _limits(cpu_s: int, memory_bytes: int) -> None:
    """In the child, before exec: its own process group (killed whole on a hang) and limits."""
    os.setsid()
    resource.setrlimit(resource.RLIMIT_CPU, (cpu_s, cpu_s))
    resource.setrlimit(resource.RLIMIT_AS, (memory_bytes, memory_bytes))
    resource.setrlimit(resource.RLIMIT_FSIZE, (memory_bytes, memory_bytes))
    resource.setrlimit(resource.RLIMIT_CORE, (0, 0))


def _verdict(returncode: int) -> Verdict:
    if returncode == 0:
        return "passed"
    if returncode == -signal.SIGXCPU or returncode == -signal.SIGKILL:
        return "timeout"  # over the CPU limit (SIGXCPU, then SIGKILL at the hard limit)
    if returncode < 0:
        return "crashed"  # a signal: segfault, abort, ...
    return {MEMORY_EXIT: "out_of_memory", NETWORK_EXIT: "network"}.get(returncode, "failed")


def run_program(source: str, *, timeout_s: float = DEFAULT_TIMEOUT_S,
                memory_bytes: int = DEFAULT_MEMORY_BYTES) -> ExecutionResult:
    """Run `source` as a program under the limits; passed when it ends without an
    exception."""
    with tempfile.TemporaryDirectory(prefix="sandbox-") as tmp:
        path = os.path.join(tmp, "program.py")
        with open(path, "w") as f:
            f.write(source)
        cmd = [*network_namespace_prefix(), sys.executable, "-I", "-c", RUNNER, path]
        start = time.perf_counter()
        proc = subprocess.Popen(
            cmd, cwd=tmp, env={"PATH": os.defpath, "HOME": tmp, "TMPDIR": tmp},
            stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
            preexec_fn=functools.partial(_limits, max(1, round(timeout_s)), memory_bytes))
        try:
            _, err = proc.communicate(timeout=timeout_s)
            verdict = _verdict(proc.returncode)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            _, err = proc.communicate()
            verdict = "timeout"
        seconds = time.perf_counter() - start
    return ExecutionResult(verdict, seconds, err.decode(errors="replace")[-OUTPUT_TAIL_CHARS:])
