"""A torch.distributed group between learner rank 0 and the rollout workers, for weight broadcast.

The group is separate from any default process group (the learner's DDP group is untouched): it is built from its
own TCPStore. Both ends take their backend and device from one pure function, `collective_backend(cfg)`: NCCL on
CUDA only when the learner *and* the engines are on GPUs, else gloo on CPU (a group whose ends disagree never meets).
Tensors travel in buckets of one dtype and at most `sync.bucket_mb` MiB (a larger tensor is a bucket of its own), so
the extra memory on either end is one bucket, not a copy of the model.
"""

from __future__ import annotations

import datetime
import socket
from collections.abc import Iterator
from dataclasses import dataclass

import torch
import torch.distributed as dist

from agentrl_ray.config import Config
from agentrl_ray.infra.threads import ThreadPolicy
from agentrl_ray.types import TensorMeta, WeightUpdate

TIMEOUT = datetime.timedelta(minutes=10)


@dataclass(frozen=True)
class CollectiveBackend:
    backend: str  # "gloo" | "nccl"
    device: str  # "cpu" | "cuda"


def collective_backend(cfg: Config) -> CollectiveBackend:
    """The one choice both ends make (the learner's sender and every engine's receiver)."""
    threads = ThreadPolicy.of(cfg)
    if threads.learner_on_gpu and threads.engines_on_gpu:
        return CollectiveBackend("nccl", "cuda")
    return CollectiveBackend("gloo", "cpu")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("", 0))
        return s.getsockname()[1]


def plan_buckets(tensors: list[TensorMeta], max_bytes: int) -> list[int]:
    """Tensors per bucket, in order: consecutive tensors of one dtype, at most `max_bytes` each (unless one tensor
    alone is larger)."""
    buckets: list[int] = []
    size, dtype = 0, None
    for t in tensors:
        nbytes = t.numel * torch.empty(0, dtype=getattr(torch, t.dtype)).element_size()
        if buckets and t.dtype == dtype and size + nbytes <= max_bytes:
            buckets[-1] += 1
            size += nbytes
        else:
            buckets.append(1)
            size, dtype = nbytes, t.dtype
    return buckets


class CollectiveGroup:
    def __init__(self, master_addr: str, port: int, world_size: int, rank: int, backend: CollectiveBackend) -> None:
        self.rank = rank
        self.device = torch.device(backend.device)
        store = dist.TCPStore(master_addr, port, world_size, is_master=rank == 0, timeout=TIMEOUT)
        if backend.backend == "nccl":
            self.group = dist.ProcessGroupNCCL(store, rank, world_size)
        else:
            self.group = dist.ProcessGroupGloo(store, rank, world_size, TIMEOUT)

    def _broadcast(self, buf: torch.Tensor) -> None:
        opts = dist.BroadcastOptions()
        opts.rootRank = 0
        self.group.broadcast([buf], opts).wait()

    def send(self, named: list[tuple[str, torch.Tensor]], update: WeightUpdate) -> None:
        """Rank 0: broadcast `named` in the buckets of `update` (made from the same list)."""
        start = 0
        for count in update.buckets:
            chunk = named[start : start + count]
            start += count
            self._broadcast(torch.cat([t.detach().reshape(-1) for _, t in chunk]).to(self.device))

    def receive(self, update: WeightUpdate) -> Iterator[tuple[str, torch.Tensor]]:
        """Other ranks: the tensors of `update`, one bucket received at a time as the iterator advances (the caller
        must exhaust it: every rank takes part in every broadcast)."""
        start = 0
        for count in update.buckets:
            metas = update.tensors[start : start + count]
            start += count
            buf = torch.empty(sum(m.numel for m in metas), dtype=getattr(torch, metas[0].dtype), device=self.device)
            self._broadcast(buf)
            offset = 0
            for m in metas:
                yield m.name, buf[offset : offset + m.numel].view(m.shape)
                offset += m.numel
