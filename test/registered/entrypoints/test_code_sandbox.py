"""The sandboxed runner that scores HumanEval completions (`test/code_sandbox.py`): each kind
of program gets its own verdict, fast, and a bad one harms nothing beyond itself."""

import time

import pytest

from sglang_aux.test.ci.ci_register import register_cpu_ci
from sglang_aux.test.code_sandbox import network_namespace_prefix, run_program

register_cpu_ci(est_time=8, suite="default")

TIMEOUT_S = 2.0
MEMORY = 256 << 20

PROGRAMS = {
    "passed": "def add(a, b):\n    return a + b\nassert add(2, 3) == 5\n",
    "failed": "def add(a, b):\n    return a - b\nassert add(2, 3) == 5, 'wrong sum'\n",
    "timeout": "while True:\n    pass\n",
    "out_of_memory": "x = bytearray(1 << 30)\n",
    "network": "import socket\nsocket.create_connection(('127.0.0.1', 9), timeout=1)\n",
    "crashed": "import os\nos.abort()\n",
}


@pytest.mark.parametrize("verdict", sorted(PROGRAMS))
def test_each_program_gets_its_verdict(verdict):
    result = run_program(PROGRAMS[verdict], timeout_s=TIMEOUT_S, memory_bytes=MEMORY)
    assert result.verdict == verdict, result
    assert result.seconds < TIMEOUT_S + 1.5
    assert result.passed == (verdict == "passed")


def test_a_failure_carries_its_traceback():
    result = run_program(PROGRAMS["failed"], timeout_s=TIMEOUT_S)
    assert "AssertionError: wrong sum" in result.output


def test_a_sleeping_program_is_ended_at_the_wall_time_limit():
    start = time.perf_counter()
    result = run_program("import time\ntime.sleep(60)\n", timeout_s=1.0)
    assert result.verdict == "timeout"
    assert time.perf_counter() - start < 3.0


def test_a_forked_child_is_ended_with_its_parent():
    # the child holds the pipe open: only killing the whole process group ends the wait
    program = "import os, time\nif os.fork() == 0:\n    time.sleep(60)\ntime.sleep(60)\n"
    start = time.perf_counter()
    assert run_program(program, timeout_s=1.0).verdict == "timeout"
    assert time.perf_counter() - start < 3.0


def test_exit_calls_and_caught_exceptions_do_not_pass():
    assert run_program("import sys\nsys.exit(0)\n").verdict == "failed"
    hidden = "try:\n    import socket\n    socket.socket()\nexcept BaseException:\n    pass\n"
    assert run_program(hidden).verdict == "network"


def test_the_program_runs_in_its_own_empty_directory_and_environment():
    program = ("import os\nassert os.listdir('.') == ['program.py'], os.listdir('.')\n"
               "assert 'PYTHONPATH' not in os.environ\nopen('out.txt', 'w').write('x')\n")
    assert run_program(program).verdict == "passed"


def test_network_namespace_when_the_machine_has_one():
    prefix = network_namespace_prefix()
    assert prefix == () or prefix[:2] == ("unshare", "-n")


if __name__ == "__main__":
    import sys

    sys.exit(pytest.main([__file__, "-q"]))
