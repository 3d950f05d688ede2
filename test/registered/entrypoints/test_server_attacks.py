"""Attacks on a real server (tiny checkpoint, CPU, loopback), each bounded in time: no single
request or client can fail another request, stall the front end, hold its sockets or hide a
dead scheduler.

- integer sampling fields past int64 (and non-finite floats) get a 400 naming the field while
  other requests stream on, unchanged, and the prefix cache keeps its entries;
- huge prompts are refused in seconds (413 past the body limit, 400 past the characters the
  context can hold) while a normal request completes, and the front end's memory stays put;
- huge headers get 431, idle, trickling and kept-alive sockets are closed after their
  timeouts, a client that hangs up mid-upload is one log line;
- with --incremental-streaming-output the native stream sends deltas;
- /health_generate runs a generation; a dead scheduler turns /health and /health_generate to
  503, fails what is in flight, and the server exits non-zero.
"""

import asyncio
import json
import os
import select
import signal
import socket
import sys
import time
from collections.abc import Iterable
from concurrent.futures import ThreadPoolExecutor

import httpx
import pytest

from sglang_aux.srt.entrypoints.engine import Engine
from sglang_aux.srt.entrypoints.http_server import SCHEDULER_EXIT_CODE, create_app
from sglang_aux.srt.managers.tokenizer.tokenizer_manager import TokenizerManager
from sglang_aux.srt.server_args import ServerArgs
from sglang_aux.test.ci.ci_register import register_cpu_ci
from sglang_aux.test.runtime_utils import tiny_checkpoint
from sglang_aux.test.server_utils import launched_server_process

register_cpu_ci(est_time=60, suite="default")

CONTEXT = 1024
HEAD_LIMIT = 16 * 1024
READ_TIMEOUT_S = 2.0
KEEP_ALIVE_S = 1.0
CLOSE_SLACK_S = 3.0  # past a timeout, by when the socket must be closed
GREEDY = {"temperature": 0, "max_new_tokens": 60, "ignore_eos": True}
PROMPTS = ["The quick brown fox jumps over", "12 + 30 =", "Natalia sold clips to 48", "Hello"]
BAD_FIELDS = [  # (path, body, the field named in the 400)
    ("/generate", {"text": "hi", "sampling_params": {"seed": 2**64}}, "seed"),
    ("/generate", {"text": "hi", "sampling_params": {"seed": -(2**63) - 1}}, "seed"),
    ("/generate", {"text": "hi", "sampling_params": {"top_k": 2**63}}, "top_k"),
    ("/generate", {"text": "hi", "sampling_params": {"stop_token_ids": [2**64]}},
     "stop_token_ids"),
    ("/generate", {"text": "hi", "sampling_params": {"max_new_tokens": 2**64}},
     "max_new_tokens"),
    ("/v1/completions", {"prompt": "hi", "seed": 2**64}, "seed"),
    ("/v1/completions", {"prompt": "hi", "seed": -(2**70)}, "seed"),
    ("/v1/chat/completions", {"messages": [{"role": "user", "content": "hi"}],
                              "seed": 2**64}, "seed"),
]
NON_FINITE = [  # raw JSON: Python's json accepts these literals
    ("/generate", '{"text": "hi", "sampling_params": {"temperature": NaN}}', "temperature"),
    ("/generate", '{"text": "hi", "sampling_params": {"top_p": Infinity}}', "top_p"),
    ("/v1/completions", '{"prompt": "hi", "temperature": -Infinity}', "temperature"),
]


@pytest.fixture(scope="module")
def ckpt(tmp_path_factory):
    return tiny_checkpoint("tiny-llama", tmp_path_factory.mktemp("ckpt"))


def server_args(ckpt: str) -> list[str]:
    return ["--model-path", ckpt, "--device", "cpu", "--context-length", str(CONTEXT),
            "--max-total-tokens", "8192", "--max-running-requests", "16",
            "--cuda-graph-bs-decode", "1", "2", "4", "8", "16",
            "--incremental-streaming-output", "--max-request-head-bytes", str(HEAD_LIMIT),
            "--timeout-request-read", str(READ_TIMEOUT_S),
            "--timeout-keep-alive", str(KEEP_ALIVE_S)]


@pytest.fixture(scope="module")
def launched(ckpt, tmp_path_factory):
    log = tmp_path_factory.mktemp("log") / "server.log"
    with launched_server_process(server_args(ckpt), log) as (url, proc):
        yield url, proc, log


@pytest.fixture(scope="module")
def url(launched):
    return launched[0]


@pytest.fixture(scope="module")
def client(url):
    with httpx.Client(base_url=url, timeout=60) as c:
        yield c


def stream_events(response: httpx.Response) -> Iterable[dict]:
    for line in response.iter_lines():
        if line.startswith("data: {"):
            yield json.loads(line[len("data: "):])


def host_port(url: str) -> tuple[str, int]:
    host, port = url.removeprefix("http://").split(":")
    return host, int(port)


def raw_exchange(url: str, head: bytes, body: Iterable[bytes] = (),
                 timeout_s: float = 20.0) -> tuple[bytes, int]:
    """Send `head`, then `body` piece by piece until the server answers or closes; returns
    what it sent back until it closed (b"" when it closed without an answer: a refusal's
    headers and body may arrive in separate reads) and the bytes sent."""
    sent = 0
    with socket.create_connection(host_port(url), timeout=timeout_s) as s:
        deadline = time.monotonic() + timeout_s
        for piece in (head, *body):
            if select.select([s], [], [], 0)[0]:
                break
            try:
                s.sendall(piece)
            except (BrokenPipeError, ConnectionResetError):
                break
            sent += len(piece)
            assert time.monotonic() < deadline, "the server neither answered nor closed"
        answer = []
        try:
            while chunk := s.recv(65536):
                answer.append(chunk)
        except (ConnectionResetError, TimeoutError):
            pass  # a reset after the answer, or a connection left open: what came is kept
        return b"".join(answer), sent


def status_of(answer: bytes) -> int | None:
    return int(answer.split()[1]) if answer.startswith(b"HTTP/1.1 ") else None


def closed_within(s: socket.socket, limit_s: float) -> float | None:
    """Seconds until the server closed `s` (reading and dropping what it sent), None if it
    stayed open for `limit_s`."""
    start = time.monotonic()
    s.settimeout(limit_s)
    try:
        while s.recv(65536):
            pass
    except TimeoutError:
        return None
    except ConnectionResetError:
        pass
    return time.monotonic() - start


def test_bad_integer_fields_fail_alone_amid_streaming_requests(client):
    alone = [client.post("/generate", json={"text": p, "sampling_params": GREEDY}).json()
             for p in PROMPTS]
    cached = client.get("/get_server_info").json()["radix_cache_tokens"]
    assert cached > 0
    with httpx.Client(base_url=str(client.base_url), timeout=60) as streams:
        responses = [streams.stream("POST", "/generate", json={
            "text": p, "sampling_params": GREEDY, "stream": True}) for p in PROMPTS]
        opened = [r.__enter__() for r in responses]
        events = [stream_events(r) for r in opened]
        texts = [next(e)["text"] for e in events]  # every request is generating
        for path, body, field in BAD_FIELDS:
            r = client.post(path, json=body)
            assert r.status_code == 400, (body, r.text)
            assert field in r.json()["error"]["message"], r.text
        for path, raw, field in NON_FINITE:
            r = client.post(path, content=raw)
            assert r.status_code == 400 and field in r.json()["error"]["message"], r.text
        for i, e in enumerate(events):
            rest = list(e)
            texts[i] += "".join(c["text"] for c in rest)
            assert rest[-1]["meta_info"]["finish_reason"]["type"] == "length"
        for r in responses:
            r.__exit__(None, None, None)
    assert texts == [a["text"] for a in alone]
    assert client.get("/get_server_info").json()["radix_cache_tokens"] >= cached
    again = client.post("/generate", json={"text": PROMPTS[0], "sampling_params": GREEDY})
    assert again.json()["meta_info"]["cached_tokens"] > 0


def rss_bytes(pid: int) -> int:
    with open(f"/proc/{pid}/status") as f:
        kib = next(int(line.split()[1]) for line in f if line.startswith("VmRSS:"))
    return kib * 1024


def test_huge_prompts_are_refused_fast_while_a_normal_request_completes(launched, client):
    url, proc, _ = launched
    before = rss_bytes(proc.pid)
    huge = b"x" * (20 << 20)
    head = (b"POST /generate HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
            b"Content-Length: %d\r\n\r\n" % (len(huge) + 12))
    over_context = "y" * (1 << 20)  # under the body limit, over what the context holds
    start = time.monotonic()
    with ThreadPoolExecutor(9) as pool:
        big = [pool.submit(raw_exchange, url, head, [b'{"text": "', *[huge[i:i + 65536]
               for i in range(0, len(huge), 65536)], b'"}']) for _ in range(4)]
        long = [pool.submit(client.post, "/generate", json={"text": over_context})
                for _ in range(4)]
        normal = client.post("/generate", json={"text": "Hi", "sampling_params": {
            "temperature": 0, "max_new_tokens": 8}})
        normal_s = time.monotonic() - start
        answers = [f.result(timeout=60) for f in big]
        refusals = [f.result(timeout=60) for f in long]
    assert normal.status_code == 200 and len(normal.json()["output_ids"]) == 8
    assert normal_s < 10, normal_s
    for answer, sent in answers:
        assert status_of(answer) == 413 and b"max-request-body-bytes" in answer, answer[:300]
        assert sent < len(huge) // 2  # refused from its Content-Length, body unread
    for r in refusals:
        assert r.status_code == 400 and "characters" in r.json()["error"]["message"]
    assert time.monotonic() - start < 20
    assert rss_bytes(proc.pid) - before < 100 << 20


def test_a_chunked_body_over_the_limit_is_refused_while_it_arrives(url):
    head = (b"POST /generate HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
            b"Transfer-Encoding: chunked\r\n\r\n")
    piece = b"x" * 65536
    chunk = b"%x\r\n%s\r\n" % (len(piece), piece)
    answer, sent = raw_exchange(url, head, [chunk] * 3200)  # 200 MiB
    assert sent < 50 << 20  # the server stopped it long before
    assert answer == b"" or status_of(answer) == 413, answer[:300]


def test_huge_headers_are_refused(url):
    head = b"GET /health HTTP/1.1\r\nHost: x\r\nX-Big: "
    answer, sent = raw_exchange(url, head, [b"a" * 4096] * 12800)  # 50 MiB of header
    assert sent < 16 << 20  # the server stopped it (what it sent back or socket buffers hold)
    assert answer == b"" or status_of(answer) == 431, answer[:300]
    ok = httpx.get(f"{url}/health", headers={"X-Fine": "a" * 1000})
    assert ok.status_code == 200


def test_idle_trickling_and_kept_alive_sockets_are_closed(url):
    idle = [socket.create_connection(host_port(url)) for _ in range(20)]
    partial = socket.create_connection(host_port(url))
    partial.sendall(b"GET /health HTTP/1.1\r\nHost: x\r\n")
    trickle = socket.create_connection(host_port(url))
    with ThreadPoolExecutor(1) as pool:
        def drip() -> None:
            try:
                for _ in range(40):
                    trickle.sendall(b"X")
                    time.sleep(0.25)
            except OSError:
                pass

        pool.submit(drip)
        limit = READ_TIMEOUT_S + CLOSE_SLACK_S
        for s in [*idle, partial, trickle]:
            assert closed_within(s, limit) is not None
    kept = socket.create_connection(host_port(url))
    kept.sendall(b"GET /health HTTP/1.1\r\nHost: x\r\n\r\n")
    assert kept.recv(65536).startswith(b"HTTP/1.1 200")
    assert closed_within(kept, KEEP_ALIVE_S + CLOSE_SLACK_S) is not None
    for s in [*idle, partial, trickle, kept]:
        s.close()
    assert httpx.get(f"{url}/health").status_code == 200


def test_a_client_hanging_up_mid_upload_is_one_log_line(launched):
    url, _, log = launched
    marker = "disconnected while sending its request to /generate"
    seen = log.read_text().count(marker)
    with socket.create_connection(host_port(url)) as s:
        s.sendall(b"POST /generate HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                  b"Content-Length: 100000\r\n\r\n" + b'{"text": "' + b"a" * 1000)
    deadline = time.monotonic() + 10
    while log.read_text().count(marker) == seen and time.monotonic() < deadline:
        time.sleep(0.05)
    text = log.read_text()
    assert text.count(marker) == seen + 1
    assert "Traceback" not in text


def test_incremental_streaming_sends_deltas(client):
    body = {"text": PROMPTS[2], "sampling_params": {**GREEDY, "max_new_tokens": 16}}
    whole = client.post("/generate", json=body).json()
    with client.stream("POST", "/generate", json={**body, "stream": True}) as r:
        chunks = list(stream_events(r))
    assert len(chunks) > 2
    assert "".join(c["text"] for c in chunks) == whole["text"]
    assert [t for c in chunks for t in c["output_ids"]] == whole["output_ids"]
    assert all(len(c["output_ids"]) <= 1 for c in chunks)  # one token a step, no prefix
    # each event carries the logprob entries of its own tokens (the last one: all of them)
    with client.stream("POST", "/generate",
                       json={**body, "stream": True, "return_logprob": True}) as r:
        events = list(stream_events(r))[:-1]
    assert len(events) > 2
    assert all([e[1] for e in ev["meta_info"]["output_token_logprobs"]] == ev["output_ids"]
               for ev in events)


def test_health_generate_runs_a_generation(client):
    r = client.get("/health_generate")
    assert r.status_code == 200 and r.json() == {"status": "ok"}


def test_dead_scheduler_fails_in_flight_requests_and_the_server_exits(ckpt, tmp_path):
    with launched_server_process(server_args(ckpt), tmp_path / "server.log") as (url, proc), \
            httpx.Client(base_url=url, timeout=60) as client:
        child = client.get("/get_server_info").json()["scheduler_pid"]
        body = {"text": "Hi", "stream": True,
                "sampling_params": {**GREEDY, "max_new_tokens": 900}}
        with client.stream("POST", "/generate", json=body) as streamed:
            lines = streamed.iter_lines()
            assert next(lines).startswith("data: ")  # generating
            os.kill(child, signal.SIGKILL)
            rest = [line for line in lines if line]
        assert "scheduler process exited" in rest[-2] and rest[-1] == "data: [DONE]"
        while True:  # until it stops answering: never healthy again
            try:
                assert client.get("/health", timeout=5).status_code == 503
            except httpx.TransportError:
                break
        assert proc.wait(30) == SCHEDULER_EXIT_CODE


def test_health_answers_503_once_the_scheduler_process_is_gone(ckpt):
    """In process (a real scheduler process, the app without uvicorn), so nothing exits and
    the 503s can be read at leisure."""
    manager = TokenizerManager(ServerArgs(model_path=ckpt, device="cpu",
                                          max_total_tokens=2048, cuda_graph_bs_decode=[1]),
                               Engine)
    manager.start()

    async def run() -> None:
        transport = httpx.ASGITransport(app=create_app(manager))
        async with httpx.AsyncClient(transport=transport, base_url="http://app") as c:
            assert (await c.get("/health")).status_code == 200
            assert (await c.get("/health_generate")).status_code == 200
            os.kill(manager.scheduler_pid, signal.SIGKILL)
            deadline = time.monotonic() + 30
            while manager.alive and time.monotonic() < deadline:
                await asyncio.sleep(0.01)
            for path in ("/health", "/health_generate"):
                r = await c.get(path)
                assert r.status_code == 503, r.text
                assert "scheduler process exited" in r.json()["error"]["message"]

    try:
        asyncio.run(run())
    finally:
        manager.shutdown()


if __name__ == "__main__":
    sys.exit(pytest.main([__file__, "-q"]))
