"""`ChunkPacer` (`--chunked-prefill-decode-share`): against a step cost that grows with the
chunk and its prefix, full chunks with the decode steps it owes between them keep the decode
rate at the share (one decode step over at most) and prefill faster than half the unpaced
rate; the steps owed follow the formula, nothing is owed before a chunk and a decode step
are read or for a new prompt's first chunk, chunks take the largest size within the
caller's limit, a follower decides from the leader's readings, and a bad share or size list
is refused naming it; the server flag is validated before any model loads."""

import argparse
import sys

import pytest

from sglang_aux.srt.managers.scheduler.chunk_pacer import ChunkPacer
from sglang_aux.srt.server_args import ServerArgs
from sglang_aux.test.ci.ci_register import register_cpu_ci

register_cpu_ci(est_time=5, suite="default")

SIZES = [32, 64, 128, 256, 512]
DECODE_MS = 3.0


def step_ms(tokens: int, prefix: int) -> float:
    """A mixed step: the decode step, a fixed 0.5 ms, and per chunk token a cost that grows
    with the prefix (attention), about the shape measured on an H100."""
    return DECODE_MS + 0.5 + tokens * (0.007 + 1.2e-6 * prefix)


def prefill(pacer: ChunkPacer | None, prompt: int, limit: int = 512) -> tuple[float, float]:
    """A `prompt`-token prefill beside a running batch: each chunk's step, then the decode
    steps `pacer` owes (none without one), counted as the scheduler does, at the chunk's
    launch, before its own step is read. (The decode rate kept, prompt tokens per ms.)"""
    if pacer is not None:
        pacer.observe(0, DECODE_MS)
        pacer.new_prompt()
    done = steps = 0
    total_ms = 0.0
    while done < prompt:
        n = min(pacer.chunk_tokens(limit) if pacer else limit, prompt - done)
        ms = step_ms(n, done)
        owed = 0
        if pacer is not None:
            owed = pacer.decode_steps_owed()
            pacer.observe(n, ms)
        total_ms += ms + owed * DECODE_MS
        steps += 1 + owed
        done += n
    return steps / total_ms * DECODE_MS, prompt / total_ms


def test_owed_decode_steps_keep_the_share_at_more_than_half_the_prefill_rate():
    """Each step pays the mixed step's fixed cost for a full chunk, so keeping half the decode
    rate costs less than half the prefill rate."""
    kept, rate = prefill(ChunkPacer(0.5, SIZES, cuda=False), 32000)
    unpaced_kept, unpaced_rate = prefill(None, 32000)
    assert unpaced_kept < 0.3, unpaced_kept  # the cost model needs pacing
    # ceil: at most one decode step more than the share needs, after a 7- to 27-ms chunk step
    assert 0.5 <= kept < 0.6, kept
    assert 0.5 * unpaced_rate < rate < unpaced_rate, (rate, unpaced_rate)


def test_chunks_take_the_largest_size_within_the_limit():
    pacer = ChunkPacer(0.5, SIZES, cuda=False)
    pacer.observe(0, DECODE_MS)
    pacer.new_prompt()
    for ms in (None, 20.0, 3.5):
        if ms is not None:
            pacer.observe(512, ms)  # step times never move the size
        assert pacer.chunk_tokens(512) == 512
    assert pacer.chunk_tokens(4096) == 512  # the largest size a mixed forward takes
    assert pacer.chunk_tokens(100) == 64  # the budget bounds it
    assert pacer.chunk_tokens(16) == 16  # below every size: the limit itself


def test_nothing_is_owed_without_a_decode_reading():
    pacer = ChunkPacer(0.5, SIZES, cuda=False)
    pacer.new_prompt()
    pacer.observe(512, 100.0)  # no decode step timed yet: nothing to compare it with
    assert pacer.decode_steps_owed() == 0
    pacer.observe(0, DECODE_MS)
    assert pacer.decode_steps_owed() > 0


def test_host_spans_are_read_when_the_step_completes():
    pacer = ChunkPacer(0.5, SIZES, cuda=False)
    step = object()
    pacer.start()
    pacer.timed(step, 0)
    assert pacer.decode_ms is None
    pacer.completed(object())  # a step never timed: nothing changes
    assert pacer.decode_ms is None
    pacer.completed(step)
    assert pacer.decode_ms is not None and pacer.decode_ms >= 0
    assert [pacer.time_decode() for _ in range(9)] == [True] + [False] * 7 + [True]


def test_decode_steps_owed_keep_the_share_and_no_more():
    pacer = ChunkPacer(0.5, SIZES, cuda=False)
    pacer.new_prompt()
    assert pacer.decode_steps_owed() == 0  # nothing read
    pacer.observe(0, DECODE_MS)
    pacer.observe(512, 14.9)  # the H100's 512-token mixed step deep in a 32k prompt
    owed = pacer.decode_steps_owed()
    assert owed == 3  # ceil((0.5 * 14.9 - 3) / (3 * 0.5)) = ceil(2.97)
    # the chunk's step and the decode steps after it keep half the decode rate; one fewer not
    assert (owed + 1) * DECODE_MS / (14.9 + owed * DECODE_MS) >= 0.5
    assert owed * DECODE_MS / (14.9 + (owed - 1) * DECODE_MS) < 0.5
    pacer.observe(512, 4.0)  # a chunk step shorter than decode step / share owes nothing
    assert pacer.decode_steps_owed() == 0
    pacer.observe(512, 14.9)
    pacer.new_prompt()  # a new prompt's first chunk owes nothing for the last prompt's
    assert pacer.decode_steps_owed() == 0


def test_a_leader_keeps_its_readings_and_a_follower_times_nothing():
    leader = ChunkPacer(0.5, SIZES, cuda=False, role="leader")
    follower = ChunkPacer(0.5, SIZES, cuda=False, role="follower")
    leader.new_prompt()
    follower.new_prompt()
    leader.observe(0, DECODE_MS)
    leader.observe(512, 20.0)
    readings = leader.take_readings()
    assert readings == [(0, DECODE_MS), (512, 20.0)] and leader.take_readings() == []
    step = object()
    follower.start()
    follower.timed(step, 0)
    follower.completed(step)  # its own time is never read
    assert follower.decode_ms is None
    for tokens, ms in readings:  # the leader's, replayed
        follower.observe(tokens, ms)
    assert follower.decode_steps_owed() == 5 == leader.decode_steps_owed()  # ceil(4.67)
    assert follower.take_readings() == []  # a follower sends nothing


class _Group:
    """Two ranks' broadcast in one process: rank 0's sends queue up for rank 1's receives."""

    def __init__(self, sent: list, rank: int):
        self.world_size, self.rank, self.sent = 2, rank, sent

    def broadcast_object(self, obj=None):
        if self.rank == 0:
            self.sent.append(obj)
            return obj
        return self.sent.pop(0)


class _Scheduler:
    """What the broadcast touches of a scheduler: its pacer, its step, its update hook."""

    def __init__(self, role_pacer: ChunkPacer):
        self.chunk_pacer, self.on_update, self.steps = role_pacer, None, 0

    def step(self) -> None:
        self.steps += 1


def test_under_tensor_parallelism_followers_decide_from_rank0s_readings():
    """The pacer steers by step times, which differ between ranks; each turn carries rank 0's
    readings and a follower reads no time of its own, so both decide alike (the engine test
    beside it: test_tp2_chunk_pacer_decides_from_rank0s_step_times)."""
    from sglang_aux.srt.managers.scheduler.tp_step_broadcast import (
        FollowerLoop,
        ReplayPacerReadings,
        StepBroadcast,
        Turn,
    )

    sent: list = []
    lead = _Scheduler(ChunkPacer(0.5, SIZES, cuda=False))
    follow = _Scheduler(ChunkPacer(0.5, SIZES, cuda=False))
    broadcast = StepBroadcast(lead, _Group(sent, 0))
    loop = FollowerLoop(follow, _Group(sent, 1))
    assert (lead.chunk_pacer.role, follow.chunk_pacer.role) == ("leader", "follower")
    for pacer in (lead.chunk_pacer, follow.chunk_pacer):
        pacer.new_prompt()
    lead.chunk_pacer.observe(0, DECODE_MS)
    lead.chunk_pacer.observe(512, 20.0)
    broadcast.step()
    broadcast.stop()
    assert sent[0] == Turn([ReplayPacerReadings(((0, DECODE_MS), (512, 20.0)))])
    loop.run()  # applies rank 0's turn, steps, then stops
    assert follow.steps == lead.steps == 1
    assert follow.chunk_pacer.decode_ms == lead.chunk_pacer.decode_ms == DECODE_MS
    assert follow.chunk_pacer.decode_steps_owed() == lead.chunk_pacer.decode_steps_owed() == 5


@pytest.mark.parametrize("share", [0.0, 1.0, -0.1])
def test_bad_share_or_sizes_are_refused(share):
    with pytest.raises(ValueError, match="decode-share"):
        ChunkPacer(share, SIZES, cuda=False)
    with pytest.raises(ValueError, match="ascending"):
        ChunkPacer(0.5, [64, 32], cuda=False)


@pytest.mark.parametrize("share", [1.0, -0.5])
def test_the_flag_is_validated(share):
    with pytest.raises(ValueError, match="--chunked-prefill-decode-share"):
        ServerArgs(model_path="tiny-llama", chunked_prefill_decode_share=share)
    parser = argparse.ArgumentParser()
    ServerArgs.add_cli_args(parser)
    args = ServerArgs.from_cli_args(parser.parse_args(["--chunked-prefill-decode-share", "0"]))
    assert args.chunked_prefill_decode_share == 0.0  # 0: off, accepted
    assert ServerArgs().chunked_prefill_decode_share == 0.5


if __name__ == "__main__":
    sys.exit(pytest.main([__file__, "-v"]))
