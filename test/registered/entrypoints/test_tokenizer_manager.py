"""The front end over the scheduler process, without HTTP: requests submitted from an event
loop come back with the offline Engine's output, prompts tokenize on pool threads, the prefix
cache is flushed between steps and only when idle, a failing step fails the request in flight
while the process keeps serving (KV returned, the cache emptied of what the failed step may
have left, counters right), seeds without a request seed follow the Engine's, a scheduler
process that dies fails the requests waiting on it, and start()/shutdown() leave no process
behind."""

import asyncio
import os
import signal
import sys
import threading

import pytest

from sglang_aux.srt.entrypoints.engine import Engine
from sglang_aux.srt.managers.tokenizer.request_stream import RequestFailed
from sglang_aux.srt.managers.tokenizer.scheduler_handle import SchedulerGone
from sglang_aux.srt.managers.tokenizer.tokenizer_manager import TokenizerManager
from sglang_aux.srt.server_args import ServerArgs
from sglang_aux.test.ci.ci_register import register_cpu_ci
from sglang_aux.test.runtime_utils import tiny_checkpoint

register_cpu_ci(est_time=40, suite="default")

GREEDY = {"temperature": 0, "max_new_tokens": 8, "ignore_eos": True}
FAILING_MAX_NEW_TOKENS = 7  # a request asking for this many makes its first decode step fail
SAMPLED = {"temperature": 1.0, "max_new_tokens": 8, "ignore_eos": True}


def failing_engine(args: ServerArgs) -> Engine:
    """An Engine (built in the scheduler process) whose step raises once a request asking
    for FAILING_MAX_NEW_TOKENS tokens holds KV (it is running, with an output token)."""
    engine = Engine(args)
    sched, real_step = engine.scheduler, engine.scheduler.step

    def step():
        if any(r.sampling_params.max_new_tokens == FAILING_MAX_NEW_TOKENS and r.output_ids
               for r in sched.running):
            raise RuntimeError("boom")
        real_step()

    sched.step = step
    return engine


def exiting_engine(args: ServerArgs) -> Engine:
    os._exit(3)  # dies without a word, as a crash in native code would


@pytest.fixture(scope="module")
def args(tmp_path_factory):
    return ServerArgs(model_path=tiny_checkpoint("tiny-llama", tmp_path_factory.mktemp("c")),
                      device="cpu", max_total_tokens=2048, cuda_graph_bs_decode=[1, 2])


@pytest.fixture(scope="module")
def server(args):
    manager = TokenizerManager(args, make_engine=failing_engine)
    manager.start()
    yield manager
    manager.shutdown()


def test_the_scheduler_runs_in_another_process(server):
    info = asyncio.run(server.engine_info())
    assert info["scheduler_pid"] == server.scheduler_pid == server.spec.pid != os.getpid()


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
    with pytest.raises(ValueError, match="empty"):  # validated before it is sent
        asyncio.run(server.submit(text="", sampling_params=GREEDY))
    with pytest.raises(ValueError, match="the context holds 1024"):  # the engine's limit
        asyncio.run(server.submit(text="x" * 1100, sampling_params=GREEDY))


def test_prompts_tokenize_off_the_event_loop(server, monkeypatch):
    tokenizer, threads = server.tokenizer, []
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


def _all_kv_free(server) -> bool:
    info = asyncio.run(server.engine_info())
    return info["available_kv_tokens"] == info["max_total_num_tokens"]


def test_flush_cache_waits_for_idle(server):
    async def run():
        stream = await server.submit(text="Hello there", sampling_params=GREEDY)
        busy = await server.flush_cache()  # sent behind the request: it is waiting
        out = await stream.result()
        again = await (await server.submit(text="Hello there", sampling_params=GREEDY)).result()
        return busy, out, again, await server.flush_cache(), await server.flush_cache()

    busy, out, again, freed, nothing = asyncio.run(run())
    assert busy is None
    assert again["output_ids"] == out["output_ids"] and again["meta_info"]["cached_tokens"] > 0
    assert freed >= again["meta_info"]["prompt_tokens"] and nothing == 0
    assert _all_kv_free(server)


def test_failed_step_fails_its_request_and_the_process_keeps_serving(server):
    failed_before = server.metrics.requests_failed
    failing = {**GREEDY, "max_new_tokens": FAILING_MAX_NEW_TOKENS}

    async def run():
        with pytest.raises(RequestFailed, match="boom"):
            await (await server.submit(text="Hi", sampling_params=failing)).result()
        return await (await server.submit(text="Hi", sampling_params=GREEDY)).result()

    out = asyncio.run(run())
    assert len(out["output_ids"]) == GREEDY["max_new_tokens"]
    assert out["meta_info"]["cached_tokens"] == 0, "the failed request's KV stayed cached"
    assert server.metrics.requests_failed == failed_before + 1
    info = asyncio.run(server.engine_info())  # answered between steps: the answer came first
    assert info["num_running_reqs"] == info["num_queue_reqs"] == 0
    assert asyncio.run(server.flush_cache()) > 0  # the second request's KV
    assert _all_kv_free(server), "the failed request kept its KV"


def test_seeds_follow_the_engine_and_shutdown_leaves_no_process(args):
    ref = Engine(args).generate(["Hello", "Hi"], SAMPLED)  # seeds drawn from random_seed
    manager = TokenizerManager(args, Engine)
    manager.start()

    async def run():
        return [await (await manager.submit(text=t, sampling_params=SAMPLED)).result()
                for t in ("Hello", "Hi")]

    outs = asyncio.run(run())
    assert [o["output_ids"] for o in outs] == [r["output_ids"] for r in ref]
    process = manager.scheduler.process
    manager.shutdown()
    assert not process.is_alive() and process.exitcode == 0  # left its loop on "stop"


def test_a_dead_scheduler_process_fails_waiting_and_later_requests(args):
    manager = TokenizerManager(args, Engine)
    manager.start()

    async def run():
        stream = await manager.submit(text="Hi", sampling_params={**GREEDY,
                                                                   "max_new_tokens": 900})
        events = aiter(stream)
        await anext(events)  # generating
        os.kill(manager.scheduler_pid, signal.SIGKILL)

        async def drain():  # updates posted before the kill may still be queued
            async for delta in events:
                assert delta.output is None, "the request finished although its process died"

        with pytest.raises(RequestFailed, match=r"exited \(exit code -9\)"):
            await asyncio.wait_for(drain(), timeout=30)
        with pytest.raises(SchedulerGone, match="exited"):
            await manager.submit(text="Hi", sampling_params=GREEDY)
        with pytest.raises(SchedulerGone, match="exited"):
            await manager.flush_cache()

    asyncio.run(run())
    assert manager.metrics.requests_failed == 1
    manager.shutdown()


def test_startup_failure_surfaces_the_error(args, tmp_path):
    missing = ServerArgs(model_path=str(tmp_path / "missing"), device="cpu")
    manager = TokenizerManager(missing, Engine)
    with pytest.raises(FileNotFoundError, match="neither a folder nor a built-in model") as e:
        manager.start()
    assert any("raised in the scheduler process" in n for n in e.value.__notes__)
    assert not manager.scheduler.process.is_alive()
    manager = TokenizerManager(args, make_engine=exiting_engine)
    with pytest.raises(SchedulerGone, match=r"exited \(exit code 3\) before its engine"):
        manager.start()
    manager.shutdown()


if __name__ == "__main__":
    sys.exit(pytest.main([__file__, "-q"]))
