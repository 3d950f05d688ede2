"""Start `python -m sglang_aux.launch_server` in a subprocess for tests and wait until it
answers /health (SGLang's `popen_launch_server`)."""

from __future__ import annotations

import contextlib
import os
import socket
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path

HEALTH_POLL_S = 0.25


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@contextlib.contextmanager
def launched_server(args: list[str], log_path: Path, *, port: int | None = None,
                    timeout_s: float = 120.0) -> Iterator[str]:
    """Run the server with `args` (plus `--port`), yield its base URL once healthy, and kill
    it on exit. Output goes to `log_path` (a pipe nobody reads would stall the server); its
    tail is in the error when the server dies or never gets healthy."""
    with launched_server_process(args, log_path, port=port, timeout_s=timeout_s) as (url, _):
        yield url


@contextlib.contextmanager
def launched_server_process(args: list[str], log_path: Path, *, port: int | None = None,
                            timeout_s: float = 120.0
                            ) -> Iterator[tuple[str, subprocess.Popen]]:
    """`launched_server`, yielding the server's process too (to signal it)."""
    port = port or free_port()
    url = f"http://127.0.0.1:{port}"
    cmd = [sys.executable, "-m", "sglang_aux.launch_server", *args, "--port", str(port)]
    with open(log_path, "w") as log:
        proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT,
                                env={**os.environ, "PYTHONUNBUFFERED": "1"})
    try:
        deadline = time.monotonic() + timeout_s
        while True:
            if proc.poll() is not None or time.monotonic() > deadline:
                tail = log_path.read_text()[-3000:]
                raise RuntimeError(f"server did not become healthy ({cmd}):\n{tail}")
            try:
                with urllib.request.urlopen(f"{url}/health", timeout=5) as resp:
                    if resp.status == 200:
                        break
            except OSError:
                time.sleep(HEALTH_POLL_S)
        yield url, proc
    finally:
        proc.kill()
        proc.wait()
