"""The scheduler thread in-process: requests submitted from an event loop come back through it
with the offline Engine's output, the prefix cache is flushed between steps and only when
idle, and a failing step fails the request in flight while the thread keeps serving (KV
returned, the cache emptied of what the failed step may have left, counters right)."""

import asyncio
import sys
import threading
import time

import pytest

from sglang_aux.srt.managers.request_stream import RequestFailed
from sglang_aux.srt.managers.scheduler_thread import SchedulerThread
from sglang_aux.srt.server_args import ServerArgs
from sglang_aux.test.ci.ci_register import register_cpu_ci
from sglang_aux.test.runtime_utils import tiny_checkpoint

register_cpu_ci(est_time=15, suite="default")

GREEDY = {"temperature": 0, "max_new_tokens": 8, "ignore_eos": True}


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    args = ServerArgs(model_path=tiny_checkpoint("tiny-llama", tmp_path_factory.mktemp("c")),
                      device="cpu", max_total_tokens=2048, cuda_graph_bs_decode=[1, 2])
    thread = SchedulerThread(args)
    thread.start()
    yield thread
    thread.shutdown()


def test_requests_round_trip_and_stream(server):
    async def run():
        whole = await (await server.submit(text="Hello", sampling_params=GREEDY)).result()
        deltas = [d async for d in await server.submit(text="Hello", sampling_params=GREEDY)]
        return whole, deltas

    whole, deltas = asyncio.run(run())
    assert len(whole["output_ids"]) == GREEDY["max_new_tokens"]
    assert [t for d in deltas for t in d.output_ids] == whole["output_ids"]
    assert "".join(d.text for d in deltas) == whole["text"]
    assert deltas[-1].output is not None and all(d.output is None for d in deltas[:-1])
    with pytest.raises(ValueError, match="empty"):  # validated before it reaches the thread
        asyncio.run(server.submit(text="", sampling_params=GREEDY))


def test_prompts_tokenize_off_the_event_loop(server, monkeypatch):
    tokenizer, threads = server.engine.tokenizer, []
    encode = tokenizer.encode

    def recording(text):
        threads.append(threading.current_thread().name)
        return encode(text)

    monkeypatch.setattr(tokenizer, "encode", recording)

    async def run():
        loop_thread = threading.current_thread().name
        outs = await asyncio.gather(*[(await server.submit(text=t, sampling_params=GREEDY))
                                      .result() for t in ("Hello", "Hi there", "12 + 30 =")])
        return loop_thread, outs

    loop_thread, outs = asyncio.run(run())
    assert len(threads) == 3 and all(t.startswith("tokenize") for t in threads), threads
    assert loop_thread not in threads
    assert [o["meta_info"]["prompt_tokens"] for o in outs] == [5, 8, 9]  # byte-level tokens


def test_flush_cache_waits_for_idle(server):
    async def run():
        stream = await server.submit(text="Hello there", sampling_params=GREEDY)
        busy = await server.flush_cache()  # queued behind the request: it is waiting
        out = await stream.result()
        again = await (await server.submit(text="Hello there", sampling_params=GREEDY)).result()
        return busy, out, again, await server.flush_cache(), await server.flush_cache()

    busy, out, again, freed, nothing = asyncio.run(run())
    assert busy is None
    assert again["output_ids"] == out["output_ids"] and again["meta_info"]["cached_tokens"] > 0
    assert freed >= again["meta_info"]["prompt_tokens"] and nothing == 0
    alloc = server.engine.worker.model_runner.token_to_kv_pool_allocator
    assert alloc.available_size() == alloc.size


def test_failed_step_fails_its_request_and_the_thread_keeps_serving(server, monkeypatch):
    sched, real_step = server.engine.scheduler, server.engine.scheduler.step
    calls = []

    def flaky_step():  # the second step is the first decode: the request holds KV by then
        calls.append(1)
        if len(calls) == 2:
            raise RuntimeError("boom")
        real_step()

    monkeypatch.setattr(sched, "step", flaky_step)
    failed_before = server.metrics.requests_failed

    async def run():
        with pytest.raises(RequestFailed, match="boom"):
            await (await server.submit(text="Hi", sampling_params=GREEDY)).result()
        return await (await server.submit(text="Hi", sampling_params=GREEDY)).result()

    out = asyncio.run(run())
    assert len(out["output_ids"]) == GREEDY["max_new_tokens"]
    assert out["meta_info"]["cached_tokens"] == 0, "the failed request's KV stayed cached"
    assert server.metrics.requests_failed == failed_before + 1
    deadline = time.monotonic() + 10  # the answer can arrive before its step has returned
    while sched.has_work() and time.monotonic() < deadline:
        time.sleep(0.01)
    assert not sched.running and not sched.waiting
    assert asyncio.run(server.flush_cache()) > 0  # the second request's KV
    alloc = server.engine.worker.model_runner.token_to_kv_pool_allocator
    assert alloc.available_size() == alloc.size, "the failed request kept its KV"


if __name__ == "__main__":
    sys.exit(pytest.main([__file__, "-q"]))
