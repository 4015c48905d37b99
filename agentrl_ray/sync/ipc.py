"""Weight handoff by CUDA IPC, for an engine that shares a GPU with learner rank 0 (`sync.transport=ipc`).

Two processes on one GPU cannot form an NCCL group (NCCL refuses it: "Duplicate GPU detected"), and a trip through
host memory cost 0.87-1.07 s per GB on an H100 (docs/learner_speed.md). Instead, rank 0 packs the weights into flat
buffers on its GPU, one per bucket (consecutive tensors of one dtype, at most `sync.bucket_mb` MiB;
`collective.plan_buckets`), and sends each buffer's CUDA IPC handle (`torch.multiprocessing`'s reduction: a few
hundred bytes) to the engines with the update.
Each engine opens the buffers in its own process and copies the tensors into its weights, device to device; rank 0
frees the buffers once every engine has loaded them.

- Memory: the learner holds one copy of the weights in the engines' dtype while the engines load (freed after);
  the engine holds no extra copy (it reads the learner's buffers in place).
- Which GPU: a handle names the device by the sender's index, which means nothing in a process that sees other
  devices (Ray sets CUDA_VISIBLE_DEVICES per actor); the receiver finds the device by its UUID instead.
- Ordering: the reduction records a CUDA event after the packing kernels and the receiver waits for it, so an
  engine never reads a half-written buffer.
- On CPU (tests, or a plan without GPUs) the same code runs, but the reduction of a CPU tensor carries its bytes:
  the tensors then travel by value through Ray, like the object store. What differs on a GPU is only the reduction.

Only learner rank 0 hands off, so this transport serves the engines on rank 0's GPU: the colocated plan on one GPU.
Engines on other GPUs keep NCCL (separate plan) or the object store.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import torch
from torch.multiprocessing.reductions import reduce_tensor

from agentrl_ray.sync.collective import plan_buckets
from agentrl_ray.sync.packing import dtype_name
from agentrl_ray.types import TensorMeta, WeightUpdate

_DEVICE_ARG = 6  # rebuild_cuda_tensor's `storage_device` argument


@dataclass(frozen=True)
class IpcHandle:
    """One shared bucket: how to open it in another process (the reduction's function and arguments) and the
    physical GPU it lives on ("" for a CPU buffer)."""

    rebuild: Callable[..., torch.Tensor]
    args: tuple[Any, ...]
    device_uuid: str = ""


def pack_buckets(
    named: list[tuple[str, torch.Tensor]], max_bytes: int, dtype: torch.dtype | None = None
) -> tuple[list[TensorMeta], list[int], list[torch.Tensor]]:
    """The tensors (floating-point ones cast to `dtype` if given) as flat buffers on their own device: their metas,
    tensors per bucket, and one contiguous buffer per bucket."""
    cast = [(n, t.detach().to(dtype) if dtype is not None and t.is_floating_point() else t.detach()) for n, t in named]
    meta = [TensorMeta(n, dtype_name(t.dtype), tuple(t.shape)) for n, t in cast]
    buckets = plan_buckets(meta, max_bytes)
    buffers, start = [], 0
    for count in buckets:
        buffers.append(torch.cat([t.reshape(-1) for _, t in cast[start : start + count]]))
        start += count
    return meta, buckets, buffers


def share(buffer: torch.Tensor) -> IpcHandle:
    """A handle another process opens with `open_handle`; `buffer` must stay alive until it has loaded."""
    rebuild, args = reduce_tensor(buffer)
    uuid = str(torch.cuda.get_device_properties(buffer.device).uuid) if buffer.is_cuda else ""
    return IpcHandle(rebuild, tuple(args), uuid)


def local_device_index(uuid: str) -> int:
    """This process's index of the GPU with `uuid`."""
    for index in range(torch.cuda.device_count()):
        if str(torch.cuda.get_device_properties(index).uuid) == uuid:
            return index
    raise RuntimeError(
        f"weight sync (ipc): the learner's GPU {uuid} is not visible to this engine; sync.transport=ipc needs the "
        "engine and learner rank 0 on one GPU (placement.mode=colocated)"
    )


def open_handle(handle: IpcHandle) -> torch.Tensor:
    """The shared buffer, in this process (no copy on a GPU)."""
    args = handle.args
    if handle.device_uuid:
        args = (*args[:_DEVICE_ARG], local_device_index(handle.device_uuid), *args[_DEVICE_ARG + 1 :])
    return handle.rebuild(*args)


def ipc_update(
    named: list[tuple[str, torch.Tensor]],
    version: int,
    max_bytes: int,
    *,
    dtype: torch.dtype | None = None,
    lora_scaling: float | None = None,
) -> tuple[WeightUpdate, list[torch.Tensor]]:
    """The update to send and the buffers the sender keeps alive until every engine has loaded it."""
    meta, buckets, buffers = pack_buckets(named, max_bytes, dtype)
    kind = "full" if lora_scaling is None else "lora"
    handles = [share(b) for b in buffers]
    update = WeightUpdate(
        version, kind, meta, payload=handles, buckets=buckets, transport="ipc", lora_scaling=lora_scaling or 0.0
    )
    return update, buffers


def release(buffers: list[torch.Tensor]) -> None:
    """The sender's side once every engine has loaded: drop the buffers, and let torch free the ones it kept for
    their consumers (a shared CUDA block stays in torch's limbo until `ipc_collect` sees its consumers gone)."""
    on_gpu = any(b.is_cuda for b in buffers)
    buffers.clear()
    if on_gpu:
        torch.cuda.ipc_collect()


def received_tensors(update: WeightUpdate) -> Iterator[tuple[str, torch.Tensor]]:
    """The engine side: the update's named tensors, views of each bucket opened as the iterator reaches it."""
    start = 0
    for count, handle in zip(update.buckets, update.payload):
        flat = open_handle(handle)
        offset = 0
        for m in update.tensors[start : start + count]:
            yield m.name, flat[offset : offset + m.numel].view(m.shape)
            offset += m.numel
        start += count
