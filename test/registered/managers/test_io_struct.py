"""The messages between the front end and the scheduler process, through a real scheduler loop
on pipes in this process (tiny-llama on CPU): each kind is one frozen dataclass, the loop
answers typed messages (every update of a step in one `StepOutput`, a `Reply` per question),
none of them holds a tensor, and an unknown message is an error naming its type."""

import dataclasses
import multiprocessing
import pickle
import sys
import threading
from multiprocessing.connection import Connection

import pytest

from sglang_aux.srt.entrypoints.engine import Engine
from sglang_aux.srt.managers.io_struct import (
    AbortRequest,
    AddRequest,
    FlushCacheRequest,
    InfoRequest,
    Reply,
    RequestAborted,
    StepOutput,
    Stop,
)
from sglang_aux.srt.managers.scheduler.scheduler_process import SchedulerLoop
from sglang_aux.test.ci.ci_register import register_cpu_ci
from sglang_aux.test.runtime_utils import tiny_checkpoint

register_cpu_ci(est_time=10, suite="default")

GREEDY = {"temperature": 0, "max_new_tokens": 6, "ignore_eos": True}


@pytest.fixture(scope="module")
def engine(tmp_path_factory):
    return Engine(model_path=tiny_checkpoint("tiny-llama", tmp_path_factory.mktemp("ckpt")),
                  device="cpu", max_total_tokens=1024, cuda_graph_bs_decode=[1, 2])


def _loop(engine: Engine, *commands) -> tuple[SchedulerLoop, Connection, Connection]:
    """A scheduler loop with `commands` waiting for it; the ends that send it more and read
    what it sends back."""
    commands_in, commands_out = multiprocessing.Pipe(duplex=False)
    outputs_in, outputs_out = multiprocessing.Pipe(duplex=False)
    for command in commands:
        commands_out.send(command)
    return SchedulerLoop(engine, commands_in, outputs_out), commands_out, outputs_in


def _serve(engine: Engine, *commands) -> list:
    """Run a scheduler loop over `commands` (ending with Stop); the messages it sent back."""
    loop, _, outputs = _loop(engine, *commands)
    loop.run()
    messages = []
    while outputs.poll():
        messages.append(outputs.recv())
    return messages


def _add(engine: Engine, rid: str, text: str) -> AddRequest:
    req = engine.make_request(text=text, sampling_params=GREEDY, rid=rid)
    return AddRequest(req.rid, req.origin_input_ids, req.sampling_params, req.seed, req.logprob)


def test_a_request_and_questions_are_answered_in_typed_messages(engine):
    want = engine.generate("Hello there", GREEDY)["output_ids"]
    loop, commands, outputs = _loop(engine, _add(engine, "a", "Hello there"), InfoRequest(7))
    thread = threading.Thread(target=loop.run)
    thread.start()
    messages = [outputs.recv()]
    while not (isinstance(messages[-1], StepOutput) and messages[-1].updates[-1].finished):
        messages.append(outputs.recv())
    commands.send(Stop())
    thread.join(60)
    assert not thread.is_alive()
    steps = [m for m in messages if isinstance(m, StepOutput)]
    assert [out.rid for s in steps for out in s.updates] == ["a"] * len(steps)
    assert [i for s in steps for out in s.updates for i in out.new_ids] == want
    assert steps[-1].updates[-1].finished.finished_reason["type"] == "length"
    (reply,) = [m for m in messages if isinstance(m, Reply)]
    assert reply.reply_id == 7 and reply.value["max_total_num_tokens"] > 0
    for message in messages:
        assert dataclasses.is_dataclass(message) and type(message).__dataclass_params__.frozen
        assert b"torch" not in pickle.dumps(message), f"{type(message).__name__} holds a tensor"


def test_an_abort_is_confirmed_and_flush_answers(engine):
    messages = _serve(engine, _add(engine, "b", "Hi"), AbortRequest("b"),
                      AbortRequest("never-sent"), FlushCacheRequest(1), Stop())
    assert messages == [RequestAborted("b"), Reply(1, messages[1].value)]
    assert isinstance(messages[1].value, int)  # slots freed: nothing waits or runs


def test_an_unknown_message_is_an_error_naming_its_type(engine):
    with pytest.raises(TypeError, match="unknown scheduler command tuple"):
        _serve(engine, ("add", "c", [1, 2]))  # the untyped form of before
    with pytest.raises(dataclasses.FrozenInstanceError):
        Stop().reason = "x"


if __name__ == "__main__":
    sys.exit(pytest.main([__file__, "-q"]))
