"""Weight sync from learner rank 0 to every rollout worker, after every optimizer step.

`setup(pool)` once, then `push(named_tensors, version)`; every trajectory carries the version of the weights
that sampled it. Transports:
- ObjectStoreSync: one `ray.put` of the state dict, every worker loads it with its next rollout (default on CPU);
- CollectiveSync: a gloo (CPU) / NCCL (GPU) broadcast group between rank 0 and the workers;
- adapter-only for LoRA (ObjectStoreSync with `lora_scaling`): only the A/B tensors travel, workers merge.
"""

from __future__ import annotations

import torch

from agentrl_ray.rollout.pool import RolloutPool
from agentrl_ray.sync.collective import CollectiveGroup, free_port


class ObjectStoreSync:
    """`push` puts the weights in the object store and returns; the workers load them at the start of their next
    rollout (`RolloutPool.load_later`), so the learner never waits for a load. Timings: the learner's part is
    `time/sync_s`, the workers' part `time/load_weights_s`."""

    def __init__(self, lora_scaling: float | None = None, engine_dtype: torch.dtype | None = None) -> None:
        self.lora_scaling = lora_scaling
        self.engine_dtype = engine_dtype  # full weights travel in the engines' dtype (they would cast them anyway)
        self.pool: RolloutPool | None = None

    def setup(self, pool: RolloutPool) -> None:
        self.pool = pool

    def push(self, named: list[tuple[str, torch.Tensor]], version: int) -> None:
        if self.lora_scaling is None:
            self.pool.load_later(named, version, dtype=self.engine_dtype)
        else:  # the worker merges the adapter into its float32 base copy: keep it float32
            self.pool.load_later(list(named), version, lora_scaling=self.lora_scaling)


class CollectiveSync:
    def __init__(self, device: str = "cpu") -> None:
        self.device = device
        self.group: CollectiveGroup | None = None
        self.pool: RolloutPool | None = None

    def setup(self, pool: RolloutPool) -> None:
        import ray

        self.pool = pool
        addr = ray.util.get_node_ip_address()
        port = free_port()
        world = pool.num_workers + 1
        # Workers join first (their constructors block on the store), then rank 0 completes the rendezvous.
        pending = pool.init_collective_async(addr, port, world)
        self.group = CollectiveGroup(addr, port, world, 0, self.device)
        pool.wait(pending)

    def push(self, named: list[tuple[str, torch.Tensor]], version: int) -> None:
        pending = self.pool.receive_collective_async(CollectiveGroup.spec_of(named), version)
        self.group.send(named)
        self.pool.wait(pending)


def make_weight_sync(transport: str, *, lora_scaling: float | None, use_gpu: bool, engine_dtype: str = "float32"):
    if transport == "collective":
        return CollectiveSync("cuda" if use_gpu else "cpu")
    return ObjectStoreSync(lora_scaling, getattr(torch, engine_dtype))
