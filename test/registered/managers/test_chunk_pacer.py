"""`ChunkPacer` (`--chunked-prefill-decode-share`): against a step cost that grows with the
chunk and its prefix, the chunks it picks keep every step after the first few within
`decode step / share` (5% over at most, its reading a step late) while the cost allows and
the decode rate kept at the share, grow back when steps are cheap, start each new
prompt from the largest size, never pass the caller's limit, and a bad share or size list is
refused naming it; the server flag is validated before any model loads."""

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


def prefill(pacer: ChunkPacer, prompt: int, limit: int = 512, lag: int = 1) -> list[tuple]:
    """Chunks of a `prompt`-token prefill, each step's ms read `lag` steps later (overlap)."""
    pacer.new_prompt()
    done, steps, unread = 0, [], []
    while done < prompt:
        n = min(pacer.chunk_tokens(limit), prompt - done)
        ms = step_ms(n, done)
        steps.append((n, done, ms))
        unread.append((n, ms))
        if len(unread) > lag:
            pacer.observe(*unread.pop(0))
        done += n
    return steps


def test_steps_stay_within_the_share_after_the_first_few():
    pacer = ChunkPacer(0.5, SIZES, cuda=False)
    for _ in range(3):
        pacer.observe(0, DECODE_MS)
    steps = prefill(pacer, 32000)
    target = DECODE_MS / 0.5
    assert steps[0][0] == 512  # a new prompt starts at the largest size
    late = [ms for n, done, ms in steps[6:] if step_ms(SIZES[0], done) <= target]
    # a reading comes a step late (overlap), so a step may pass the bound by one prefix's
    # growth before its size drops
    assert late and max(late) <= 1.05 * target, max(late)
    sizes = [n for n, _, _ in steps]
    assert min(sizes) < 128 and sizes[-2] <= sizes[5]  # deep in the prompt, smaller chunks
    # the decode rate kept: tokens per step over step time, against decode steps alone
    kept = len(steps) / sum(ms for *_, ms in steps) * DECODE_MS
    assert kept >= 0.5, kept


def test_cheap_steps_grow_back_and_the_limit_holds():
    pacer = ChunkPacer(0.5, SIZES, cuda=False)
    pacer.observe(0, DECODE_MS)
    pacer.new_prompt()
    assert pacer.chunk_tokens(512) == 512
    pacer.observe(512, 20.0)
    assert pacer.chunk_tokens(512) == 256  # too long: one size down
    pacer.observe(256, 9.0)
    assert pacer.chunk_tokens(512) == 128
    pacer.observe(128, 3.5)  # 3.0 + 0.5 x 2 = 4.0 <= 6.0: the next size fits
    assert pacer.chunk_tokens(512) == 256
    assert pacer.chunk_tokens(512) == 256  # no new reading: unchanged
    assert pacer.chunk_tokens(100) == 64  # the budget bounds it
    assert pacer.chunk_tokens(16) == 16  # below every size: the limit itself
    pacer.new_prompt()
    assert pacer.chunk_tokens(512) == 512


def test_without_a_decode_reading_chunks_take_the_limit():
    pacer = ChunkPacer(0.5, SIZES, cuda=False)
    pacer.new_prompt()
    pacer.observe(512, 100.0)  # no decode step timed yet: nothing to compare it with
    assert pacer.chunk_tokens(512) == 512


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


def test_interleave_keeps_full_chunks_and_owes_decode_steps():
    pacer = ChunkPacer(0.5, SIZES, cuda=False, pacing="interleave")
    pacer.new_prompt()
    assert pacer.chunk_tokens(512) == 512 and pacer.decode_steps_owed() == 0  # nothing read
    pacer.observe(0, DECODE_MS)
    pacer.observe(512, 14.9)  # the H100's 512-token mixed step deep in a 32k prompt
    assert pacer.chunk_tokens(512) == 512  # never shrinks
    owed = pacer.decode_steps_owed()
    assert owed == 3  # ceil((0.5 * 14.9 - 3) / (3 * 0.5)) = ceil(2.97)
    # the chunk's step and the decode steps after it keep half the decode rate; one fewer not
    assert (owed + 1) * DECODE_MS / (14.9 + owed * DECODE_MS) >= 0.5
    assert owed * DECODE_MS / (14.9 + (owed - 1) * DECODE_MS) < 0.5
    assert pacer.chunk_tokens(100) == 64
    pacer.new_prompt()
    assert pacer.decode_steps_owed() == 0


def test_interleave_keeps_the_share_at_a_better_prefill_rate_than_shrink():
    """Against the same step cost: both keep the decode share; interleave prefills faster,
    since each step pays the mixed step's fixed cost for a full chunk."""
    def run(pacing: str) -> tuple[float, float]:
        pacer = ChunkPacer(0.5, SIZES, cuda=False, pacing=pacing)
        pacer.observe(0, DECODE_MS)
        pacer.new_prompt()
        done = steps = 0
        total_ms = 0.0
        while done < 32000:
            n = min(pacer.chunk_tokens(512), 32000 - done)
            ms = step_ms(n, done)
            pacer.observe(n, ms)
            owed = pacer.decode_steps_owed()
            total_ms += ms + owed * DECODE_MS
            steps += 1 + owed
            done += n
        return steps / total_ms * DECODE_MS, 32000 / total_ms  # kept, tokens per ms
    shrink, interleave = run("shrink"), run("interleave")
    assert shrink[0] >= 0.5 and interleave[0] >= 0.5, (shrink, interleave)
    assert interleave[1] > 1.3 * shrink[1], (shrink, interleave)


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
    assert follower.chunk_tokens(512) == 256 == leader.chunk_tokens(512)
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
    assert follow.chunk_pacer.chunk_tokens(512) == lead.chunk_pacer.chunk_tokens(512) == 256


@pytest.mark.parametrize("share", [0.0, 1.0, -0.1])
def test_bad_share_or_sizes_are_refused(share):
    with pytest.raises(ValueError, match="decode-share"):
        ChunkPacer(share, SIZES, cuda=False)
    with pytest.raises(ValueError, match="ascending"):
        ChunkPacer(0.5, [64, 32], cuda=False)
    with pytest.raises(ValueError, match="--chunked-prefill-pacing"):
        ChunkPacer(0.5, SIZES, cuda=False, pacing="smooth")


@pytest.mark.parametrize("share", [1.0, -0.5])
def test_the_flag_is_validated(share):
    with pytest.raises(ValueError, match="--chunked-prefill-decode-share"):
        ServerArgs(model_path="tiny-llama", chunked_prefill_decode_share=share)
    parser = argparse.ArgumentParser()
    ServerArgs.add_cli_args(parser)
    args = ServerArgs.from_cli_args(parser.parse_args(["--chunked-prefill-decode-share", "0"]))
    assert args.chunked_prefill_decode_share == 0.0  # 0: off, accepted
    assert ServerArgs().chunked_prefill_decode_share == 0.5
    assert ServerArgs().chunked_prefill_pacing == "shrink"
    with pytest.raises(ValueError, match="--chunked-prefill-pacing"):
        ServerArgs(chunked_prefill_pacing="smooth")


if __name__ == "__main__":
    sys.exit(pytest.main([__file__, "-v"]))
