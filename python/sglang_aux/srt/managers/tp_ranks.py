"""The processes of a tensor-parallel group: which ranks a node runs, and the followers'
entry point (`run_tp_follower`).

Node n of `--nnodes` runs ranks `[n * k, (n + 1) * k)`, k = tp_size / nnodes, rank n * k + i
on device i. On node 0, rank 0 schedules (in the caller's process for the offline `Engine`,
in the scheduler process behind the HTTP server); every other rank is a follower process
spawned here (a "spawn" child, as the scheduler process is), which builds the same engine on
its shard and replays rank 0's steps (`tp_step_broadcast.FollowerLoop`).
"""

from __future__ import annotations

import dataclasses
import logging
import multiprocessing
import socket
from multiprocessing.process import BaseProcess

import torch

from sglang_aux.srt.distributed.parallel_state import destroy_distributed_environment
from sglang_aux.srt.managers.scheduler_process import LOG_FORMAT
from sglang_aux.srt.managers.serving_engine import EngineFactory
from sglang_aux.srt.managers.tp_step_broadcast import FollowerLoop
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


def start_followers(args: ServerArgs, make_engine: EngineFactory, ranks: range
                    ) -> list[BaseProcess]:
    """One follower process per rank of `ranks` (daemons: they end with their parent)."""
    ctx = multiprocessing.get_context("spawn")  # CUDA cannot run in a forked child
    procs = []
    for rank in ranks:
        p = ctx.Process(target=run_tp_follower, name=f"sglang_aux-tp{rank}", daemon=True,
                        args=(args, rank, make_engine))
        p.start()
        procs.append(p)
    return procs


def stop_followers(procs: list[BaseProcess], timeout: float = FOLLOWER_STOP_TIMEOUT_S) -> None:
    """Wait for followers told to stop; terminate those still running after `timeout`."""
    for p in procs:
        p.join(timeout)
        if p.exitcode is None:
            logger.warning("tensor-parallel follower %s did not stop; terminating", p.name)
            p.terminate()
            p.join(timeout)


def run_tp_follower(server_args: ServerArgs, tp_rank: int, make_engine: EngineFactory) -> None:
    """A follower's main: build the engine on rank `tp_rank`'s shard, then replay rank 0's
    steps until it stops. Any failure ends the process with exit code 1 (rank 0's next
    collective then fails too: the group is broken)."""
    logging.basicConfig(level=server_args.log_level.upper(), format=LOG_FORMAT)
    code = 0
    try:
        with torch.no_grad():
            engine = make_engine(server_args, tp_rank=tp_rank)
            FollowerLoop(engine.scheduler, engine.step_broadcast.group).run()
    except BaseException:
        logger.exception("tensor-parallel rank %d failed", tp_rank)
        code = 1
    finally:
        destroy_distributed_environment()
    raise SystemExit(code)


def run_follower_node(server_args: ServerArgs, make_engine: EngineFactory) -> int:
    """A node other than node 0 (`--node-rank` > 0): run its ranks until they end; the exit
    code: 0 when all stopped cleanly, else the first failure's."""
    procs = start_followers(server_args, make_engine, node_ranks(server_args))
    logger.info("node %d runs tensor-parallel ranks %s (rendezvous %s)", server_args.node_rank,
                list(node_ranks(server_args)), server_args.dist_init_addr)
    codes = []
    for p in procs:
        p.join()
        codes.append(p.exitcode)
    return next((c for c in codes if c), 0)
