"""Tensor parallelism through the real HTTP server, on the CPU with gloo, in real processes:
`--tp-size 2` (DFlash) serves the same greedy tokens as the offline Engine at `--tp-size 1`;
two launch_server processes as two nodes (`--nnodes 2 --node-rank 0/1`) serve the same as
one; a rank killed mid-request fails that request naming the rank and ends the server in
bounded time, and one that dies at start fails start-up naming it; a node that never joins
fails start-up with a clear error after `--dist-timeout`."""

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest

from sglang_aux.srt.entrypoints.engine import Engine
from sglang_aux.srt.managers.tokenizer.scheduler_handle import SchedulerGone
from sglang_aux.srt.managers.tokenizer.tokenizer_manager import TokenizerManager
from sglang_aux.srt.server_args import ServerArgs
from sglang_aux.test.ci.ci_register import register_cpu_ci
from sglang_aux.test.runtime_utils import tiny_checkpoint
from sglang_aux.test.server_utils import free_port, launched_server, launched_server_process

register_cpu_ci(est_time=90, suite="default")

PROMPTS = ["Hello", "The quick brown fox jumps over", "12 + 30 ="]
GREEDY = {"temperature": 0, "max_new_tokens": 12, "ignore_eos": True}
CONTEXT = 1024
END_WITHIN_S = 30  # a dead rank or a missing node ends the server within this
JOIN_TIMEOUT_S = 3


@pytest.fixture(scope="module")
def ckpts(tmp_path_factory):
    root = tmp_path_factory.mktemp("ckpt")
    return tiny_checkpoint("tiny-llama", root), tiny_checkpoint("tiny-llama-dflash", root)


@pytest.fixture(scope="module")
def server_args(ckpts):
    target, draft = ckpts
    return ["--model-path", target, "--speculative-algorithm", "DFLASH",
            "--speculative-draft-model-path", draft, "--device", "cpu",
            "--context-length", str(CONTEXT), "--max-total-tokens", "4096",
            "--cuda-graph-bs-decode", "1", "2", "4", "--dist-timeout", "60"]


@pytest.fixture(scope="module")
def reference(ckpts):
    """Greedy output ids of PROMPTS from the offline Engine on one rank."""
    engine = Engine(model_path=ckpts[0], device="cpu", context_length=CONTEXT,
                    max_total_tokens=4096, cuda_graph_bs_decode=[1, 2, 4])
    return [o["output_ids"] for o in engine.generate(PROMPTS, GREEDY)]


def _served(url: str) -> list[list[int]]:
    with httpx.Client(base_url=url, timeout=120) as c:
        outs = [c.post("/generate", json={"text": p, "sampling_params": GREEDY}).json()
                for p in PROMPTS]
    assert all(o["meta_info"]["spec_verify_ct"] > 0 for o in outs)
    return [o["output_ids"] for o in outs]


def test_tp2_server_equals_tp1_engine(server_args, reference, tmp_path):
    with launched_server([*server_args, "--tp-size", "2"], tmp_path / "server.log") as url:
        assert _served(url) == reference
        with httpx.Client(base_url=url, timeout=120) as c:
            out = c.post("/v1/completions", json={"prompt": PROMPTS[1], "temperature": 0,
                                                  "max_tokens": 12,
                                                  "ignore_eos": True}).json()
        assert out["choices"][0]["text"]
        assert out["usage"]["completion_tokens"] == 12


def test_two_nodes_serve_as_one(server_args, reference, tmp_path):
    nodes = [*server_args, "--tp-size", "2", "--nnodes", "2",
             "--dist-init-addr", f"127.0.0.1:{free_port()}"]
    log1 = tmp_path / "node1.log"
    with open(log1, "w") as log:
        node1 = subprocess.Popen([sys.executable, "-m", "sglang_aux.launch_server", *nodes,
                                  "--node-rank", "1"], stdout=log, stderr=subprocess.STDOUT)
    try:
        with launched_server([*nodes, "--node-rank", "0"], tmp_path / "node0.log") as url:
            assert _served(url) == reference
            assert node1.poll() is None  # node 1 serves no HTTP: it runs rank 1 only
        # node 0 stopped (its rank 0 gone): node 1's rank ends, and node 1 with it
        node1.wait(END_WITHIN_S)
    finally:
        node1.kill()
        node1.wait()
    assert "runs tensor-parallel ranks [1]" in log1.read_text()


def _children(pid: int) -> list[int]:
    """Child pids of `pid` (Linux /proc)."""
    kids = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                stat = (entry / "stat").read_text()
            except OSError:
                continue
            if int(stat.rsplit(")", 1)[1].split()[1]) == pid:
                kids.append(int(entry.name))
    return kids


def _follower_pid(server_pid: int, scheduler_pid: int) -> int:
    """The rank-1 process: the server's spawned child that is not the scheduler."""
    for pid in _children(server_pid):
        cmdline = Path(f"/proc/{pid}/cmdline").read_bytes()
        if pid != scheduler_pid and b"spawn_main" in cmdline:
            return pid
    raise AssertionError(f"no follower among {_children(server_pid)}")


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc")
def test_rank_death_mid_request_ends_the_server(server_args, tmp_path):
    log = tmp_path / "server.log"
    with launched_server_process([*server_args, "--tp-size", "2"], log) as (url, proc):
        with httpx.Client(base_url=url, timeout=120) as c:
            info = c.get("/get_server_info").json()
            follower = _follower_pid(proc.pid, info["scheduler_pid"])
            long = {"text": PROMPTS[0], "stream": True,
                    "sampling_params": {**GREEDY, "max_new_tokens": CONTEXT - 16}}
            events = []
            start = None
            with c.stream("POST", "/generate", json=long) as resp:
                for line in resp.iter_lines():
                    if not line.startswith("data: ") or line == "data: [DONE]":
                        continue
                    events.append(json.loads(line[len("data: "):]))
                    if len(events) == 2:  # decoding: kill rank 1
                        os.kill(follower, signal.SIGKILL)
                        start = time.monotonic()
        assert start is not None, events
        error = events[-1].get("error", {})
        assert "tensor-parallel" in error.get("message", ""), events[-1]
        assert "finish_reason" not in events[-1].get("meta_info", {}) or \
            events[-1]["meta_info"]["finish_reason"]["type"] != "length"
        proc.wait(END_WITHIN_S)
        assert proc.returncode != 0
        assert time.monotonic() - start < END_WITHIN_S
    assert "tensor-parallel" in log.read_text()


def rank1_dies_at_start(args: ServerArgs, tp_rank: int | None = None) -> Engine:
    """An engine factory whose rank 1 dies before joining (as a crash loading its shard
    would); rank 0 is left waiting for it in the rendezvous."""
    if tp_rank == 1:
        os._exit(3)
    return Engine(args, tp_rank=tp_rank)


def test_rank_that_dies_at_start_fails_startup_naming_it(ckpts):
    args = ServerArgs(model_path=ckpts[0], device="cpu", max_total_tokens=2048, tp_size=2,
                      cuda_graph_bs_decode=[1], dist_timeout=600)
    manager = TokenizerManager(args, rank1_dies_at_start)
    start = time.monotonic()
    with pytest.raises(SchedulerGone, match=r"rank process sglang_aux-tp1 \(pid \d+\) exited "
                                            r"with code 3, so the scheduler process exited"):
        manager.start()
    assert time.monotonic() - start < END_WITHIN_S  # not the 600 s rendezvous timeout
    manager.shutdown()


def test_node_that_never_joins_fails_startup(server_args, tmp_path):
    start = time.monotonic()
    run = subprocess.run([sys.executable, "-m", "sglang_aux.launch_server", *server_args,
                          "--tp-size", "2", "--nnodes", "2", "--node-rank", "0",
                          "--dist-init-addr", f"127.0.0.1:{free_port()}",
                          "--dist-timeout", str(JOIN_TIMEOUT_S), "--port", str(free_port())],
                         capture_output=True, text=True, timeout=120)
    assert run.returncode != 0
    assert time.monotonic() - start < 60
    assert ("tensor-parallel rank 0 of 2: the group at 127.0.0.1" in run.stderr
            and f"did not form within {JOIN_TIMEOUT_S} s" in run.stderr), run.stderr[-3000:]
    assert "1/2 clients joined" in run.stderr


if __name__ == "__main__":
    sys.exit(pytest.main([__file__, "-v"]))
