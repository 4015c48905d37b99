"""RolloutPool: the plain-Python group that owns the rollout and env actors.

It is created by the driver and handed to the learner through `train_loop_config` (it holds only actor handles,
so it pickles). Learner rank 0 calls `sample(...)` for each step's batch and the weight-sync methods after each
step. Placement takes `num_gpus=0` on CPU, so the same code runs in the CPU tests and on a GPU cluster.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import ray
import torch

from agentrl_ray.config import Config
from agentrl_ray.types import TrajectoryGroup


@dataclass
class PendingSample:
    """A batch handed to the workers and not yet gathered (see `RolloutPool.start`)."""

    refs: list[Any]
    rows: list[dict[str, Any]]


class RolloutPool:
    def __init__(self, workers: list[Any], env_hosts: list[Any]) -> None:
        self.workers = workers
        self.env_hosts = env_hosts
        # Weights put in the object store but not yet loaded: they travel with the next rollout call (see
        # `load_later`), so the learner does not wait for the engines to load them.
        self._pending: tuple[str, Any, tuple] | None = None

    @classmethod
    def create(cls, cfg: Config, model_path: str) -> RolloutPool:
        from agentrl_ray.envs.host import EnvHost
        from agentrl_ray.rollout.worker import RolloutWorker

        env_actor = ray.remote(EnvHost).options(num_cpus=cfg.env.num_cpus_per_actor, max_concurrency=1000)
        env_hosts = [env_actor.remote(tool_timeout_s=cfg.env.tool_timeout_s) for _ in range(cfg.env.num_actors)]
        r = cfg.rollout
        runtime_env = {"env_vars": {"VLLM_ENABLE_V1_MULTIPROCESSING": "0", "TOKENIZERS_PARALLELISM": "false"}}
        worker_actor = ray.remote(RolloutWorker).options(
            num_cpus=r.num_cpus_per_worker, num_gpus=r.num_gpus_per_worker, runtime_env=runtime_env
        )
        workers = [
            worker_actor.remote(
                i, model_path, cfg.model, r, cfg.env, cfg.reward, env_hosts, cfg.run.seed, cfg.sync.max_staleness > 0
            )
            for i in range(r.num_workers)
        ]
        pool = cls(workers, env_hosts)
        ray.get([w.get_version.remote() for w in workers])  # surface engine start-up errors here
        return pool

    @property
    def num_workers(self) -> int:
        return len(self.workers)

    def sample(
        self, rows: list[dict[str, Any]], group_size: int, temperature: float, seed: int
    ) -> tuple[list[TrajectoryGroup], dict[str, float]]:
        """Split the rows over the workers, gather the groups back in row order, sum the phase timings."""
        return self.gather(self.start(rows, group_size, temperature, seed))

    def start(self, rows: list[dict[str, Any]], group_size: int, temperature: float, seed: int) -> PendingSample:
        """Hand a batch to the workers and return at once; `gather` waits for it. The learner uses this to roll
        out step t+1 while it trains on step t (`sync.max_staleness=1`). No weights may be pushed while a batch
        is out: a worker would switch weights between the turns of an episode."""
        shards = [rows[i :: self.num_workers] for i in range(self.num_workers)]
        weights, self._pending = self._pending, None
        if weights is not None and not all(shards):  # a worker without rows still needs the new weights
            self._pending = weights
            self.flush()
            weights = None
        refs = [
            w.rollout.remote(shard, group_size, temperature, seed, weights)
            for w, shard in zip(self.workers, shards)
            if shard
        ]
        return PendingSample(refs, rows)

    def gather(self, pending: PendingSample) -> tuple[list[TrajectoryGroup], dict[str, float]]:
        rows = pending.rows
        groups: list[TrajectoryGroup] = []
        timings: dict[str, float] = {}
        for shard_groups, shard_timings in ray.get(pending.refs):
            groups.extend(shard_groups)
            for k, v in shard_timings.items():
                timings[k] = max(timings.get(k, 0.0), v)  # workers run in parallel: the slowest one counts
        order = {str(r["id"]): i for i, r in enumerate(rows)}
        groups.sort(key=lambda g: order[g.prompt_id])
        return groups, timings

    def versions(self) -> list[int]:
        self.flush()
        return ray.get([w.get_version.remote() for w in self.workers])

    def load_state_dict(self, named: list[tuple[str, torch.Tensor]], version: int) -> None:
        self.load_later(named, version)
        self.flush()

    def load_lora(self, adapter: dict[str, torch.Tensor], scaling: float, version: int) -> None:
        self.load_later(list(adapter.items()), version, lora_scaling=scaling)
        self.flush()

    def load_later(
        self,
        weights: list[tuple[str, torch.Tensor]],
        version: int,
        *,
        lora_scaling: float | None = None,
        dtype: torch.dtype | None = None,
    ) -> None:
        """Put new weights (named tensors: a state dict, or LoRA A/B tensors with their scaling) in the object store
        now, packed into one buffer (`sync.packing`; floating-point tensors cast to `dtype` if given); every worker
        loads them at the start of its next rollout, before generating anything (one call, so the order is
        guaranteed), or at `flush()`. Newer weights replace ones not yet loaded."""
        from agentrl_ray.sync.packing import pack

        ref = ray.put(pack(weights, dtype))
        self._pending = (
            ("state_dict", ref, (version,)) if lora_scaling is None else ("lora", ref, (lora_scaling, version))
        )

    def flush(self) -> None:
        """Load pending weights on every worker now."""
        if self._pending is None:
            return
        weights, self._pending = self._pending, None
        ray.get([w.load_weights.remote(weights) for w in self.workers])

    def init_collective_async(self, addr: str, port: int, world: int) -> list[Any]:
        return [w.init_collective.remote(addr, port, world, i + 1) for i, w in enumerate(self.workers)]

    def receive_collective_async(self, spec: list, version: int) -> list[Any]:
        self._pending = None  # superseded
        return [w.receive_collective.remote(spec, version) for w in self.workers]

    @staticmethod
    def wait(refs: list[Any]) -> list[Any]:
        return ray.get(refs)

    def greedy(self, prompts: list[list[int]], max_tokens: int) -> list[list[tuple[list[int], list[float]]]]:
        """Greedy generation on every worker (for sync checks): one list of results per worker."""
        self.flush()
        return ray.get([w.greedy.remote(prompts, max_tokens) for w in self.workers])

    def env_stats(self) -> list[dict[str, Any]]:
        return ray.get([h.stats.remote() for h in self.env_hosts])

    def shutdown(self) -> None:
        for actor in self.workers + self.env_hosts:
            ray.kill(actor)
