"""The processes of a tensor-parallel group: which ranks a node runs, and the followers'
entry point (`run_tp_follower`).

Node n of `--nnodes` runs ranks `[n * k, (n + 1) * k)`, k = tp_size / nnodes, rank n * k + i
on device i. On node 0, rank 0 schedules (in the caller's process for the offline `Engine`,
in the scheduler process behind the HTTP server); every other rank is a follower process
spawned here (a "spawn" child, as the scheduler process is), which builds the same engine on
its shard and replays rank 0's steps (`tp_step_broadcast.FollowerLoop`). A follower that
fails reports its error (`RankFailed`) on a pipe to the process that started it, which names it
when the follower exits: rank 0 of an offline engine while it waits for the group to form
(`first_failure`, polled by the rendezvous), the front end from the follower's start.
"""

from __future__ import annotations

import dataclasses
import logging
import multiprocessing
import socket
from dataclasses import dataclass
from multiprocessing.connection import Connection
from multiprocessing.process import BaseProcess

import torch

from sglang_aux.srt.distributed.parallel_state import destroy_distributed_environment
from sglang_aux.srt.managers.io_struct import RankFailed
from sglang_aux.srt.managers.scheduler.scheduler_process import LOG_FORMAT
from sglang_aux.srt.managers.scheduler.serving_engine import EngineFactory
from sglang_aux.srt.managers.scheduler.tp_step_broadcast import FollowerLoop
from sglang_aux.srt.server_args import ServerArgs

logger = logging.getLogger(__name__)

FOLLOWER_STOP_TIMEOUT_S = 10.0


def ranks_per_node(args: ServerArgs) -> int:
    return args.tp_size // args.nnodes


def node_ranks(args: ServerArgs) -> range:
    """The TP ranks this node (`--node-rank`) runs."""
    k = ranks_per_node(args)
    return range(args.node_rank * k, (args.node_rank + 1) * k)


def with_rendezvous(args: ServerArgs) -> ServerArgs:
    """`args` with `--dist-init-addr` set: on one node without it, a free loopback port
    (chosen before any rank starts, so all of them meet there)."""
    if args.tp_size == 1 or args.dist_init_addr is not None:
        return args
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    return dataclasses.replace(args, dist_init_addr=f"127.0.0.1:{port}")


@dataclass
class Follower:
    """A follower rank's process and the pipe on which it reports its failure."""

    rank: int
    process: BaseProcess
    reports: Connection  # the receiving end
    error: str | None = None  # the one it reported, once read

    def failure(self) -> str | None:
        """Why the process ended, with the error it reported; None while it runs."""
        code = self.process.exitcode
        if code is None:
            return None
        if self.error is None:
            self.error = self._read_report()
        how = f"was killed by signal {-code}" if code < 0 else f"exited with code {code}"
        return (f"tensor-parallel rank process {self.process.name} (pid {self.process.pid}) "
                f"{how}" + (f" raising {self.error}" if self.error else ""))

    def _read_report(self) -> str | None:
        try:
            report = self.reports.recv() if self.reports.poll() else None
        except (EOFError, OSError):  # it died without reporting
            return None
        match report:
            case RankFailed(error=error):
                return error
            case None:
                return None
            case unknown:
                raise TypeError(f"unknown follower report {type(unknown).__name__}")


def first_failure(followers: list[Follower]) -> str | None:
    """The first follower's that has ended (see `Follower.failure`), else None."""
    return next(filter(None, (f.failure() for f in followers)), None)


def start_followers(args: ServerArgs, make_engine: EngineFactory, ranks: range
                    ) -> list[Follower]:
    """One follower process per rank of `ranks` (daemons: they end with their parent)."""
    ctx = multiprocessing.get_context("spawn")  # CUDA cannot run in a forked child
    followers = []
    for rank in ranks:
        reports, child_end = ctx.Pipe(duplex=False)
        p = ctx.Process(target=run_tp_follower, name=f"sglang_aux-tp{rank}", daemon=True,
                        args=(args, rank, make_engine, child_end))
        p.start()
        child_end.close()  # the child's now: a report, or EOF once it exits
        followers.append(Follower(rank, p, reports))
    return followers


def stop_followers(followers: list[Follower],
                   timeout: float = FOLLOWER_STOP_TIMEOUT_S) -> None:
    """Wait for followers told to stop; terminate those still running after `timeout`."""
    for f in followers:
        f.process.join(timeout)
        if f.process.exitcode is None:
            logger.warning("tensor-parallel follower %s did not stop; terminating",
                           f.process.name)
            f.process.terminate()
            f.process.join(timeout)


def run_tp_follower(server_args: ServerArgs, tp_rank: int, make_engine: EngineFactory,
                    reports: Connection) -> None:
    """A follower's main: build the engine on rank `tp_rank`'s shard, then replay rank 0's
    steps until it stops. Any failure is reported on `reports` and ends the process with exit
    code 1 (rank 0's next collective then fails too: the group is broken)."""
    logging.basicConfig(level=server_args.log_level.upper(), format=LOG_FORMAT)
    code = 0
    try:
        with torch.no_grad():
            engine = make_engine(server_args, tp_rank=tp_rank)
            FollowerLoop(engine.scheduler, engine.step_broadcast.group).run()
    except BaseException as e:
        logger.exception("tensor-parallel rank %d failed", tp_rank)
        code = 1
        try:
            reports.send(RankFailed(tp_rank, f"{type(e).__name__}: {e}"))
        except OSError:  # its starter is gone: nobody to tell
            pass
    finally:
        destroy_distributed_environment()
    raise SystemExit(code)


def run_follower_node(server_args: ServerArgs, make_engine: EngineFactory) -> int:
    """A node other than node 0 (`--node-rank` > 0): run its ranks until they end; the exit
    code: 0 when all stopped cleanly, else the first failure's."""
    followers = start_followers(server_args, make_engine, node_ranks(server_args))
    logger.info("node %d runs tensor-parallel ranks %s (rendezvous %s)", server_args.node_rank,
                list(node_ranks(server_args)), server_args.dist_init_addr)
    codes = []
    for f in followers:
        f.process.join()
        codes.append(f.process.exitcode)
        if f.process.exitcode:
            logger.error("%s", f.failure())
    return next((c for c in codes if c), 0)
