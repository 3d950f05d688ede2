"""The real server runs its scheduler in a child process: /get_server_info reports the two
pids; a scheduler process killed mid-run fails the requests waiting on it (500, or an error
event on a stream), then the server exits with SCHEDULER_EXIT_CODE; a server told
to stop (SIGTERM) stops its scheduler process, and one killed outright leaves none behind
(the child exits once the front end's pipe closes)."""

import os
import re
import signal
import sys
import time
from concurrent.futures import ThreadPoolExecutor

import httpx
import pytest

from sglang_aux.srt.entrypoints.http_server import SCHEDULER_EXIT_CODE
from sglang_aux.test.ci.ci_register import register_cpu_ci
from sglang_aux.test.runtime_utils import tiny_checkpoint
from sglang_aux.test.server_utils import launched_server_process

register_cpu_ci(est_time=45, suite="default")

LONG = {"temperature": 0, "max_new_tokens": 900, "ignore_eos": True}
EXIT_WAIT_S = 30


@pytest.fixture(scope="module")
def logs(tmp_path_factory):
    return tmp_path_factory.mktemp("log")


@pytest.fixture(scope="module")
def launch(tmp_path_factory, logs):
    ckpt = tiny_checkpoint("tiny-llama", tmp_path_factory.mktemp("ckpt"))
    args = ["--model-path", ckpt, "--device", "cpu", "--max-total-tokens", "4096",
            "--cuda-graph-bs-decode", "1", "2"]
    return lambda name: launched_server_process(args, logs / f"{name}.log")


def _gone(pid: int) -> bool:
    """Whether `pid` has exited (a zombie nobody has reaped yet counts as exited)."""
    try:
        with open(f"/proc/{pid}/status") as f:
            return any(line.split()[:2] == ["State:", "Z"] for line in f)
    except FileNotFoundError:
        return True


def _wait_gone(pid: int) -> bool:
    deadline = time.monotonic() + EXIT_WAIT_S
    while not _gone(pid) and time.monotonic() < deadline:
        time.sleep(0.05)
    return _gone(pid)


def _requests_total(client: httpx.Client) -> float:
    text = client.get("/metrics").text
    return float(re.search(r"^sglang_aux:requests_total (\S+)$", text, re.M).group(1))


def test_sigterm_stops_the_scheduler_process(launch, logs):
    with launch("sigterm") as (url, proc):
        info = httpx.get(f"{url}/get_server_info").json()
        assert info["pid"] == proc.pid != info["scheduler_pid"]
        assert not _gone(info["scheduler_pid"])
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(EXIT_WAIT_S) == 128 + signal.SIGTERM
        assert _wait_gone(info["scheduler_pid"])
    log = (logs / "sigterm.log").read_text()
    assert "the scheduler process stopped (exit code 0)" in log  # told to, not orphaned
    assert "the front end went away" not in log


def test_a_killed_server_leaves_no_scheduler_process(launch, logs):
    with launch("sigkill") as (url, proc):
        child = httpx.get(f"{url}/get_server_info").json()["scheduler_pid"]
        proc.kill()
        proc.wait()
        assert _wait_gone(child), "the scheduler process outlived its server"
    assert "the front end went away" in (logs / "sigkill.log").read_text()


def test_a_dead_scheduler_process_fails_waiting_requests_and_stops_the_server(launch, logs):
    with launch("crash") as (url, proc), httpx.Client(base_url=url, timeout=60) as client:
        child = client.get("/get_server_info").json()["scheduler_pid"]
        body = {"text": "Hi", "sampling_params": LONG}
        with ThreadPoolExecutor(1) as pool, client.stream(
                "POST", "/generate", json={**body, "stream": True}) as streamed:
            lines = streamed.iter_lines()
            assert next(lines).startswith("data: ")  # generating
            waiting = pool.submit(client.post, "/generate", json=body)
            while _requests_total(client) < 2:  # both are in the scheduler's hands
                time.sleep(0.02)
            os.kill(child, signal.SIGKILL)
            rest = [line for line in lines if line]
            answer = waiting.result(timeout=60)
        assert answer.status_code == 500
        assert "scheduler process exited" in answer.json()["error"]["message"]
        assert rest[-1] == "data: [DONE]" and "scheduler process exited" in rest[-2]
        # a supervisor sees the server exit and restarts it
        assert proc.wait(EXIT_WAIT_S) == SCHEDULER_EXIT_CODE
    log = (logs / "crash.log").read_text()
    assert "stopping the server: its scheduler process is gone" in log


if __name__ == "__main__":
    sys.exit(pytest.main([__file__, "-q"]))
