"""The tensor-parallel group of this process (SGLang's `parallel_state`), one per process.

`init_distributed_environment` joins the ranks of one TP group: NCCL on CUDA, gloo on the
CPU, rendezvous at `--dist-init-addr`; world size = `--tp-size`, spread over `--nnodes`
nodes of `tp_size // nnodes` ranks each (rank = node_rank * ranks_per_node + local rank).
Until it runs (and after `destroy_distributed_environment`), the group is one rank: every
layer and collective reads rank 0 of 1 and runs the single-device code.

Two groups: the device group carries the collectives of forwards (its timeout is
`--dist-timeout`: a rank that stops answering fails the others' next collective); the CPU
group (gloo) carries rank 0's step broadcasts, whose followers may wait for as long as the
server idles, so it waits without a deadline (a rank that dies closes its sockets, which
ends the wait at once).

The pipeline-parallel group (SGLang's `get_pp_group`) is always one rank: `--pp-size` > 1 is
refused. Models still read its world size where SGLang's do, to keep the pipeline gating of
the shared aux buffer (a later stage receives earlier captures already concatenated).
"""

from __future__ import annotations

import logging
import pickle
import time
from collections.abc import Callable
from dataclasses import dataclass
from datetime import timedelta

import torch
import torch.distributed as dist

logger = logging.getLogger(__name__)

DEFAULT_DIST_TIMEOUT_S = 600
# torch 2.13 renamed all_gather_into_tensor (deprecated there); the H200's torch 2.11 has only it
_all_gather_single = getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor
IDLE_WAIT = timedelta(days=365)  # followers wait for rank 0's next step while it idles
JOIN_POLL_S = 0.05  # rank 0's poll of the ranks that reached the rendezvous
JOINED_KEY = "sglang_aux/joined"  # the rendezvous store's count of ranks that reached it


@dataclass(frozen=True)
class GroupCoordinator:
    rank: int
    world_size: int
    device_group: dist.ProcessGroup | None  # None: one rank, no collectives
    cpu_group: dist.ProcessGroup | None

    @torch.no_grad()  # collectives write in place; nothing here is differentiated
    def all_reduce(self, x: torch.Tensor) -> torch.Tensor:
        """Sum over ranks, in place (capturable in a CUDA graph on NCCL)."""
        if self.world_size > 1:
            dist.all_reduce(x, group=self.device_group)
        return x

    @torch.no_grad()  # collectives write in place; nothing here is differentiated
    def all_gather(self, x: torch.Tensor, out: torch.Tensor | None = None) -> torch.Tensor:
        """Every rank's `x` `[..., n]` side by side along the last dim -> `[..., world * n]`
        (into `out` when given)."""
        if self.world_size == 1:
            return x if out is None else out.copy_(x)
        x = x.contiguous()
        # ranks' tensors one after another along dim 0 (gloo requires that layout)
        flat = torch.empty((self.world_size * x.shape[0], *x.shape[1:]), dtype=x.dtype,
                           device=x.device)
        _all_gather_single(flat, x, group=self.device_group)
        stacked = flat.view(self.world_size, *x.shape)
        gathered = stacked.movedim(0, -2).reshape(*x.shape[:-1], -1)
        return gathered if out is None else out.copy_(gathered)

    @torch.no_grad()  # collectives write in place; nothing here is differentiated
    def broadcast(self, x: torch.Tensor, src: int = 0) -> torch.Tensor:
        """Rank `src`'s `x` on every rank, in place (capturable on NCCL)."""
        if self.world_size > 1:
            dist.broadcast(x, src, group=self.device_group)
        return x

    def broadcast_object(self, obj: object = None, src: int = 0) -> object:
        """Rank `src`'s picklable `obj` on every rank, over the CPU group."""
        if self.world_size == 1:
            return obj
        if self.rank == src:
            data = torch.frombuffer(bytearray(pickle.dumps(obj)), dtype=torch.uint8)
            size = torch.tensor([data.numel()], dtype=torch.int64)
            dist.broadcast(size, src, group=self.cpu_group)
            dist.broadcast(data, src, group=self.cpu_group)
            return obj
        size = torch.empty(1, dtype=torch.int64)
        dist.broadcast(size, src, group=self.cpu_group)
        data = torch.empty(int(size), dtype=torch.uint8)
        dist.broadcast(data, src, group=self.cpu_group)
        return pickle.loads(data.numpy().tobytes())

    def min_int(self, value: int) -> int:
        """The smallest `value` over ranks (what every rank can hold), over the CPU group."""
        if self.world_size == 1:
            return value
        t = torch.tensor([value], dtype=torch.int64)
        dist.all_reduce(t, op=dist.ReduceOp.MIN, group=self.cpu_group)
        return int(t)


_SINGLE = GroupCoordinator(0, 1, None, None)
_TP: GroupCoordinator = _SINGLE
_PP: GroupCoordinator = _SINGLE


def backend_for(device: str) -> str:
    return "nccl" if device.startswith("cuda") else "gloo"


class _Aborted(RuntimeError):
    """The rendezvous was given up on (`abort_check`): its reason is the message."""


def init_distributed_environment(*, world_size: int, rank: int, local_rank: int,
                                 dist_init_addr: str, device: str,
                                 timeout_s: float | None = None,
                                 abort_check: Callable[[], str | None] | None = None
                                 ) -> GroupCoordinator:
    """Join the TP group of `world_size` ranks as `rank` (rendezvous at `host:port`), and make
    it this process's group. Raises RuntimeError naming the address, the ranks expected and
    the timeout when the group does not form in time (a node that never joins). Rank 0 hosts
    the rendezvous and waits there for the others, calling `abort_check` between polls: a
    reason it returns (a rank this process started has died) fails the join at once, naming
    it, instead of after the timeout."""
    global _TP
    if dist.is_initialized():
        raise RuntimeError("this process already joined a tensor-parallel group; "
                           "shut its engine down first")
    backend = backend_for(device)
    if backend == "nccl":
        torch.cuda.set_device(local_rank)
    timeout = timedelta(seconds=timeout_s or DEFAULT_DIST_TIMEOUT_S)
    host, port = dist_init_addr.rsplit(":", 1)
    try:
        store = dist.TCPStore(host, int(port), world_size, is_master=rank == 0,
                              timeout=timeout, wait_for_workers=False)
        joined = store.add(JOINED_KEY, 1)
        deadline = time.monotonic() + timeout.total_seconds()
        while rank == 0 and joined < world_size:
            reason = abort_check() if abort_check is not None else None
            if reason is not None:
                raise _Aborted(f"tensor-parallel rank {rank} of {world_size}: {reason}, "
                               f"before the group at {dist_init_addr} formed")
            if time.monotonic() > deadline:
                raise TimeoutError(f"{joined}/{world_size} clients joined")
            time.sleep(JOIN_POLL_S)
            joined = store.add(JOINED_KEY, 0)
        dist.init_process_group(backend, store=store, world_size=world_size, rank=rank,
                                timeout=timeout)
        cpu_group = dist.new_group(backend="gloo", timeout=IDLE_WAIT)
    except _Aborted:
        raise
    except (RuntimeError, dist.DistError, TimeoutError) as e:
        raise RuntimeError(
            f"tensor-parallel rank {rank} of {world_size}: the group at {dist_init_addr} did "
            f"not form within {timeout.total_seconds():.0f} s ({type(e).__name__}: {e}); every "
            "node must start with the same --tp-size, --nnodes and --dist-init-addr and its "
            "own --node-rank") from e
    device_group = dist.group.WORLD
    _TP = GroupCoordinator(rank, world_size, device_group, cpu_group)
    logger.info("tensor-parallel rank %d of %d joined (%s, rendezvous %s)", rank, world_size,
                backend, dist_init_addr)
    return _TP


def destroy_distributed_environment() -> None:
    global _TP
    _TP = _SINGLE
    if dist.is_initialized():
        dist.destroy_process_group()


def get_tp_group() -> GroupCoordinator:
    return _TP


def get_pp_group() -> GroupCoordinator:
    return _PP


def get_tensor_model_parallel_rank() -> int:
    return _TP.rank


def get_tensor_model_parallel_world_size() -> int:
    return _TP.world_size


def divide(total: int, parts: int, what: str) -> int:
    """`total / parts`, or ValueError naming `what` when it does not divide."""
    if total % parts:
        raise ValueError(f"{what} ({total}) is not divisible by --tp-size {parts}")
    return total // parts


def kv_heads_per_rank(num_kv_heads: int, tp_size: int) -> int:
    """KV heads one rank holds: split when there are at least as many as ranks, else one,
    replicated over `tp_size / num_kv_heads` ranks (SGLang's rule)."""
    if num_kv_heads >= tp_size:
        return divide(num_kv_heads, tp_size, "the number of KV heads")
    if tp_size % num_kv_heads:
        raise ValueError(f"--tp-size {tp_size} cannot replicate {num_kv_heads} KV heads evenly "
                         "(it must be a multiple of the KV head count)")
    return 1
