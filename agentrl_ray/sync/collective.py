"""A torch.distributed group between learner rank 0 and the rollout workers, for weight broadcast.

The group is separate from any default process group (the learner's DDP group is untouched): it is built
from its own TCPStore, with gloo on CPU and NCCL on GPU through the same code. Tensors of one dtype are
flattened into one buffer so a push is one broadcast per dtype, not one per parameter.
"""

from __future__ import annotations

import datetime
import socket
from collections import defaultdict

import torch
import torch.distributed as dist

Spec = list[tuple[str, tuple[int, ...], str]]  # (name, shape, dtype name) per tensor, in broadcast order


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("", 0))
        return s.getsockname()[1]


class CollectiveGroup:
    def __init__(self, master_addr: str, port: int, world_size: int, rank: int, device: str = "cpu") -> None:
        self.rank = rank
        self.device = torch.device(device)
        timeout = datetime.timedelta(minutes=10)
        store = dist.TCPStore(master_addr, port, world_size, is_master=rank == 0, timeout=timeout)
        if self.device.type == "cuda":
            self.group = dist.ProcessGroupNCCL(store, rank, world_size)
        else:
            self.group = dist.ProcessGroupGloo(store, rank, world_size, timeout)

    @staticmethod
    def spec_of(named: list[tuple[str, torch.Tensor]]) -> Spec:
        return [(n, tuple(t.shape), str(t.dtype).removeprefix("torch.")) for n, t in named]

    def _broadcast(self, buf: torch.Tensor) -> None:
        opts = dist.BroadcastOptions()
        opts.rootRank = 0
        self.group.broadcast([buf], opts).wait()

    def send(self, named: list[tuple[str, torch.Tensor]]) -> None:
        by_dtype: dict[torch.dtype, list[torch.Tensor]] = defaultdict(list)
        for _, t in named:
            by_dtype[t.dtype].append(t.detach().reshape(-1))
        for dtype in sorted(by_dtype, key=str):
            self._broadcast(torch.cat(by_dtype[dtype]).to(self.device))

    def receive(self, spec: Spec) -> list[tuple[str, torch.Tensor]]:
        by_dtype: dict[str, list[tuple[str, tuple[int, ...]]]] = defaultdict(list)
        for name, shape, dtype in spec:
            by_dtype[dtype].append((name, shape))
        out: dict[str, torch.Tensor] = {}
        for dtype in sorted(by_dtype, key=lambda d: str(getattr(torch, d))):
            entries = by_dtype[dtype]
            total = sum(int(torch.Size(s).numel()) for _, s in entries)
            buf = torch.empty(total, dtype=getattr(torch, dtype), device=self.device)
            self._broadcast(buf)
            offset = 0
            for name, shape in entries:
                n = int(torch.Size(shape).numel())
                out[name] = buf[offset : offset + n].view(shape)
                offset += n
        return [(name, out[name]) for name, _, _ in spec]
