"""A follower rank that dies before the rendezvous fails rank 0 at once, naming the follower's
error, in real processes on the CPU with gloo: rank 0 of an offline `Engine` (which started
the follower and waits for it in the rendezvous) and the HTTP front end (which started it
beside the scheduler process). `--dist-timeout` stays at 600 s: the test would time out long
before a rank 0 that waited for it."""

import os
import signal
import sys
import time

import pytest

from sglang_aux.srt.entrypoints.engine import Engine
from sglang_aux.srt.managers.scheduler.tp_ranks import start_followers, with_rendezvous
from sglang_aux.srt.managers.tokenizer.scheduler_handle import SchedulerGone
from sglang_aux.srt.managers.tokenizer.tokenizer_manager import TokenizerManager
from sglang_aux.srt.server_args import ServerArgs
from sglang_aux.test.ci.ci_register import register_cpu_ci
from sglang_aux.test.runtime_utils import tiny_checkpoint

register_cpu_ci(est_time=40, suite="default")

FAIL_WITHIN_S = 60  # process start-up on a loaded CI machine; the rendezvous waits 600 s
SHARD_ERROR = "shard 1 of the checkpoint is unreadable"


class Rank1RaisesEngine(Engine):
    """Rank 1 raises before it joins the group (as a failed load of its shard would)."""

    def __init__(self, server_args: ServerArgs | None = None, *, tp_rank: int | None = None,
                 **kwargs):
        if tp_rank == 1:
            raise OSError(SHARD_ERROR)
        super().__init__(server_args, tp_rank=tp_rank, **kwargs)


class Rank1KilledEngine(Engine):
    """Rank 1 is killed (SIGKILL: nothing reported) before it joins the group."""

    def __init__(self, server_args: ServerArgs | None = None, *, tp_rank: int | None = None,
                 **kwargs):
        if tp_rank == 1:
            os.kill(os.getpid(), signal.SIGKILL)
        super().__init__(server_args, tp_rank=tp_rank, **kwargs)


def rank1_raises(args: ServerArgs, tp_rank: int | None = None) -> Engine:
    return Rank1RaisesEngine(args, tp_rank=tp_rank)


@pytest.fixture(scope="module")
def args(tmp_path_factory):
    return ServerArgs(model_path=tiny_checkpoint("tiny-llama", tmp_path_factory.mktemp("ckpt")),
                      device="cpu", max_total_tokens=2048, cuda_graph_bs_decode=[1],
                      tp_size=2, dist_timeout=600)


@pytest.mark.parametrize("engine,named", [
    (Rank1RaisesEngine, rf"exited with code 1 raising OSError: {SHARD_ERROR}"),
    (Rank1KilledEngine, r"was killed by signal 9"),
])
def test_engine_rank0_fails_at_once_naming_the_follower(args, engine, named):
    start = time.monotonic()
    with pytest.raises(RuntimeError, match=r"tensor-parallel rank 0 of 2: tensor-parallel rank "
                                           rf"process sglang_aux-tp1 \(pid \d+\) {named}, "
                                           r"before the group at 127\.0\.0\.1:\d+ formed"):
        engine(args)
    assert time.monotonic() - start < FAIL_WITHIN_S


def test_front_end_fails_startup_naming_the_follower_error(args):
    manager = TokenizerManager(args, rank1_raises)
    start = time.monotonic()
    try:
        with pytest.raises(SchedulerGone, match=rf"sglang_aux-tp1 \(pid \d+\) exited with code 1 "
                                                rf"raising OSError: {SHARD_ERROR}, so the "
                                                r"scheduler process exited"):
            manager.start()
        assert time.monotonic() - start < FAIL_WITHIN_S
    finally:
        manager.shutdown()


def test_a_follower_failure_reads_the_same_twice(args):
    """The report is read once and kept: the reason does not lose the error on a second ask."""
    (follower,) = start_followers(with_rendezvous(args), rank1_raises, range(1, 2))
    follower.process.join(FAIL_WITHIN_S)
    first = follower.failure()
    assert SHARD_ERROR in first and follower.failure() == first


if __name__ == "__main__":
    sys.exit(pytest.main([__file__, "-v"]))
