"""The learner side of weight sync: learner rank 0 → every rollout engine, after every optimizer step.

`setup(workers)` once with the rollout actors' handles, then `push(named_tensors, version)`; every trajectory carries
the version of the weights that sampled it. Each push makes one `types.WeightUpdate`, which the engine side
(`sync.receiver`) applies. Transports:
- ObjectStoreSender: one `ray.put` of the packed tensors; the update waits in `pending` and travels with the next
  rollout call (`take_pending`), so the learner never waits for a load (default on CPU);
- CollectiveSender: a gloo (CPU) / NCCL (GPU) broadcast group between rank 0 and the workers, in bounded buckets;
- IpcSender: CUDA IPC handles of buckets on the GPU that learner rank 0 shares with the engines (`sync/ipc.py`);
- adapter-only for LoRA (ObjectStoreSender or IpcSender with `lora_scaling`): only the A/B tensors travel.

The workers are duck-typed Ray actor handles with `receive_weights(update)` and `join_weight_group(...)` (this
package never imports `rollout`).
"""

from __future__ import annotations

from typing import Any

import ray
import torch

from agentrl_ray.config import Config
from agentrl_ray.sync.collective import CollectiveBackend, CollectiveGroup, collective_backend, free_port, plan_buckets
from agentrl_ray.sync.ipc import ipc_update, release
from agentrl_ray.sync.packing import dtype_name, pack
from agentrl_ray.types import TensorMeta, WeightUpdate

DEADLINE_S = 600.0  # a load or a broadcast that takes longer than this has hung


class ObjectStoreSender:
    """Timings: the learner's part is `time/sync_s` (the pack and put), the workers' part `time/load_weights_s`."""

    def __init__(self, lora_scaling: float | None = None, engine_dtype: torch.dtype | None = None) -> None:
        self.lora_scaling = lora_scaling
        self.engine_dtype = engine_dtype  # full weights travel in the engines' dtype (they would cast them anyway)
        self.workers: list[Any] = []
        self.pending: WeightUpdate | None = None  # put in the object store, not yet loaded by the engines

    def setup(self, workers: list[Any]) -> None:
        self.workers = list(workers)

    def push(self, named: list[tuple[str, torch.Tensor]], version: int) -> None:
        """Pack and put the weights now; newer weights replace ones not yet loaded."""
        if self.lora_scaling is None:
            meta, buf = pack(named, self.engine_dtype)
            self.pending = WeightUpdate(version, "full", meta, payload=ray.put(buf))
        else:  # the engine merges the adapter into its float32 base copy: keep it float32
            meta, buf = pack(named)
            self.pending = WeightUpdate(version, "lora", meta, payload=ray.put(buf), lora_scaling=self.lora_scaling)

    def take_pending(self) -> WeightUpdate | None:
        """The update not yet loaded, handed to the next rollout call, which loads it before generating anything
        (one call, so the order is guaranteed); None when there is none."""
        update, self.pending = self.pending, None
        return update

    def flush(self) -> None:
        """Load the pending update on every engine now."""
        update = self.take_pending()
        if update is not None:
            ray.get([w.receive_weights.remote(update) for w in self.workers], timeout=DEADLINE_S)


class CollectiveSender:
    def __init__(self, backend: CollectiveBackend, bucket_bytes: int) -> None:
        self.backend = backend
        self.bucket_bytes = bucket_bytes
        self.workers: list[Any] = []
        self.group: CollectiveGroup | None = None

    def setup(self, workers: list[Any]) -> None:
        self.workers = list(workers)
        addr, port, world = ray.util.get_node_ip_address(), free_port(), len(self.workers) + 1
        # Workers join first (their constructors block on the store), then rank 0 completes the rendezvous.
        joined = [
            w.join_weight_group.remote(addr, port, world, i + 1, self.backend) for i, w in enumerate(self.workers)
        ]
        self.group = CollectiveGroup(addr, port, world, 0, self.backend)
        ray.get(joined, timeout=DEADLINE_S)

    def push(self, named: list[tuple[str, torch.Tensor]], version: int) -> None:
        """Broadcast the weights; returns when every engine has loaded them."""
        meta = [TensorMeta(n, dtype_name(t.dtype), tuple(t.shape)) for n, t in named]
        update = WeightUpdate(
            version, "full", meta, buckets=plan_buckets(meta, self.bucket_bytes), transport="collective"
        )
        loaded = [w.receive_weights.remote(update) for w in self.workers]
        self.group.send(named, update)
        ray.get(loaded, timeout=DEADLINE_S)

    def take_pending(self) -> None:
        return None  # every push is loaded before it returns

    def flush(self) -> None:
        pass


class IpcSender:
    """CUDA IPC handles of buckets on rank 0's GPU, opened in place by the engines sharing it (`sync/ipc.py`).
    `time/sync_s` holds the pack and every engine's load (the learner waits: its buffers must outlive the loads).
    It takes the learner's full weights where they are (`device_tensors`): packed on the GPU, never through host
    memory."""

    device_tensors = True

    def __init__(self, bucket_bytes: int, lora_scaling: float | None = None, engine_dtype: torch.dtype | None = None):
        self.bucket_bytes = bucket_bytes
        self.lora_scaling = lora_scaling
        self.engine_dtype = engine_dtype
        self.workers: list[Any] = []

    def setup(self, workers: list[Any]) -> None:
        self.workers = list(workers)

    def push(self, named: list[tuple[str, torch.Tensor]], version: int) -> None:
        """Share the weights and return when every engine has loaded them; then the buffers are freed."""
        dtype = self.engine_dtype if self.lora_scaling is None else None  # adapters stay float32 for the merge
        update, buffers = ipc_update(named, version, self.bucket_bytes, dtype=dtype, lora_scaling=self.lora_scaling)
        try:
            ray.get([w.receive_weights.remote(update) for w in self.workers], timeout=DEADLINE_S)
        finally:
            del update
            release(buffers)

    def take_pending(self) -> None:
        return None  # every push is loaded before it returns

    def flush(self) -> None:
        pass


WeightSender = ObjectStoreSender | CollectiveSender | IpcSender


def make_sender(cfg: Config, lora_scaling: float | None) -> WeightSender:
    if cfg.sync.transport == "collective":
        return CollectiveSender(collective_backend(cfg), cfg.sync.bucket_mb * 2**20)
    if cfg.sync.transport == "ipc":
        return IpcSender(cfg.sync.bucket_mb * 2**20, lora_scaling, getattr(torch, cfg.model.dtype))
    return ObjectStoreSender(lora_scaling, getattr(torch, cfg.model.dtype))
