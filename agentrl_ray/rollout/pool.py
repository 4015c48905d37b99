"""RolloutPool: the plain-Python group that owns the rollout and env actors.

It is created by the driver and handed to the learner through `train_loop_config` (it holds only actor handles,
so it pickles). Learner rank 0 calls `start`/`gather` (or `sample`) for each step's batch; the weight sender
(`sync.sender`) talks to `workers` directly. Where each actor runs is the placement plan's (`placement.py`, reserved
by `cluster.py`); the same code runs in the CPU tests and on a GPU cluster.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import ray

from agentrl_ray.config import Config
from agentrl_ray.envs.host import EnvHost
from agentrl_ray.rollout.engine import vllm_env
from agentrl_ray.rollout.worker import RolloutWorker
from agentrl_ray.sync.collective import collective_backend
from agentrl_ray.threads import ThreadPolicy
from agentrl_ray.types import RolloutTimings, TrajectoryGroup, WeightUpdate


@dataclass
class PendingSample:
    """A batch handed to the workers and not yet gathered (see `RolloutPool.start`)."""

    refs: list[Any]
    rows: list[dict[str, Any]]


class RolloutPool:
    def __init__(self, workers: list[Any], env_hosts: list[Any]) -> None:
        self.workers = workers
        self.env_hosts = env_hosts

    @classmethod
    def create(cls, cfg: Config, model_path: str, threads: ThreadPolicy | None = None, placed=None) -> RolloutPool:
        """Start the env hosts and rollout workers; `threads`: the run's policy (the driver's), else from `cfg`;
        `placed`: the reserved placement plan (`cluster.Reserved`) that says where each actor runs; without it
        (tests on one local node) actors take their CPUs anywhere."""
        threads = threads or ThreadPolicy.of(cfg)
        r = cfg.rollout
        env_opts = placed.env_options() if placed else [{"num_cpus": cfg.env.num_cpus_per_actor}] * cfg.env.num_actors
        engine_opts = placed.engine_options() if placed else [{"num_cpus": r.num_cpus_per_worker}] * r.num_workers
        env_hosts = [
            ray.remote(EnvHost)
            .options(max_concurrency=1000, **o)
            .remote(tool_timeout_s=cfg.env.tool_timeout_s, isolation=cfg.env.isolation)
            for o in env_opts
        ]
        runtime_env = {"env_vars": vllm_env(kv_cache_gib=r.kv_cache_gib, use_gpu=threads.engines_on_gpu)}
        workers = [
            ray.remote(RolloutWorker)
            .options(runtime_env=runtime_env, **o)
            .remote(
                i,
                model_path,
                cfg.model,
                r,
                cfg.env,
                cfg.reward,
                env_hosts,
                cfg.run.seed,
                collective_backend(cfg),  # the same choice as the learner's sender (sync.sender.make_sender)
                threads,
            )
            for i, o in enumerate(engine_opts)
        ]
        pool = cls(workers, env_hosts)
        ray.get([w.get_version.remote() for w in workers])  # surface engine start-up errors here
        return pool

    @property
    def num_workers(self) -> int:
        return len(self.workers)

    def sample(
        self,
        rows: list[dict[str, Any]],
        group_size: int,
        temperature: float,
        seed: int,
        weights: WeightUpdate | None = None,
    ) -> tuple[list[TrajectoryGroup], RolloutTimings]:
        """Split the rows over the workers, gather the groups back in row order, with the phase timings."""
        return self.gather(self.start(rows, group_size, temperature, seed, weights))

    def start(
        self,
        rows: list[dict[str, Any]],
        group_size: int,
        temperature: float,
        seed: int,
        weights: WeightUpdate | None = None,
    ) -> PendingSample:
        """Hand a batch to the workers and return at once; `gather` waits for it. `weights` (the sender's pending
        update) are loaded by every worker before it generates anything. The learner uses this to roll out step
        t+1 while it trains on step t (`sync.max_staleness=1`). No weights may be pushed while a batch is out: a
        worker would switch weights between the turns of an episode."""
        shards = [rows[i :: self.num_workers] for i in range(self.num_workers)]
        if weights is not None and not all(shards):  # a worker without rows still needs the new weights
            ray.get([w.receive_weights.remote(weights) for w in self.workers])
            weights = None
        refs = [
            w.rollout.remote(shard, group_size, temperature, seed, weights)
            for w, shard in zip(self.workers, shards)
            if shard
        ]
        return PendingSample(refs, rows)

    def gather(self, pending: PendingSample) -> tuple[list[TrajectoryGroup], RolloutTimings]:
        groups: list[TrajectoryGroup] = []
        timings = RolloutTimings()
        for shard_groups, shard_timings in ray.get(pending.refs):
            groups.extend(shard_groups)
            timings = timings.slowest(shard_timings)  # workers run in parallel: the slowest one counts
        order = {str(r["id"]): i for i, r in enumerate(pending.rows)}
        groups.sort(key=lambda g: order[g.prompt_id])
        return groups, timings

    def versions(self) -> list[int]:
        return ray.get([w.get_version.remote() for w in self.workers])

    def greedy(self, prompts: list[list[int]], max_tokens: int) -> list[list[tuple[list[int], list[float]]]]:
        """Greedy generation on every worker (for sync checks): one list of results per worker."""
        return ray.get([w.greedy.remote(prompts, max_tokens) for w in self.workers])

    def shutdown(self) -> None:
        for actor in self.workers + self.env_hosts:
            ray.kill(actor)
