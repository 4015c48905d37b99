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
from ray.exceptions import GetTimeoutError, RayActorError

from agentrl_ray.config import Config
from agentrl_ray.envs.base import players
from agentrl_ray.envs.loading import env_class
from agentrl_ray.infra.threads import ThreadPolicy
from agentrl_ray.rollout.backends import engine_process_env
from agentrl_ray.rollout.deadlines import Deadlines
from agentrl_ray.rollout.engine_modes import engine_modes
from agentrl_ray.rollout.recovery import ActorFailed, Recovery, RestartableEnvHost
from agentrl_ray.rollout.worker import RolloutWorker
from agentrl_ray.sync.collective import collective_backend
from agentrl_ray.types import RolloutTimings, TrajectoryGroup, WeightUpdate


def sequences_per_engine(cfg: Config) -> int:
    """The most sequences one rollout call hands an engine at once (a step's or a held-out evaluation's rows split
    over the workers, `group_size` or `eval_samples` each), capped by `max_num_seqs`: what its KV cache must hold."""
    r = cfg.rollout
    per_step = -(-r.prompts_per_step // r.num_workers) * r.group_size
    per_eval = -(-cfg.data.eval_size // r.num_workers) * cfg.run.eval_samples
    return min(r.max_num_seqs, max(per_step, per_eval))


@dataclass
class PendingSample:
    """A batch handed to the workers and not yet gathered (see `RolloutPool.start`)."""

    refs: dict[int, Any]  # worker index -> its rollout call
    rows: list[dict[str, Any]]
    shards: dict[int, list[dict[str, Any]]]  # worker index -> its rows (what a redo needs)
    args: tuple[int, float, int]  # group size, temperature, seed


class RolloutPool:
    def __init__(self, workers: list[Any], env_hosts: list[Any], recovery: Recovery | None = None) -> None:
        self.workers = workers
        self.env_hosts = env_hosts
        self.recovery = recovery  # None: a failed actor fails the call (pools built by hand in tests)
        self.latest: WeightUpdate | None = None  # the newest weights handed to the workers: a restarted one's
        self.started = False  # every engine answered once (`ready`)
        # The stream pipeline: the latest weights go with every evaluation and probe call too, since Ray does not
        # order them after the update sent alone (the worker loads each update once).
        self.resend_latest = False

    @classmethod
    def create(
        cls, cfg: Config, model_path: str, threads: ThreadPolicy | None = None, placed=None, wait: bool = True
    ) -> RolloutPool:
        """Start the env hosts and rollout workers; `threads`: the run's policy (the driver's), else from `cfg`;
        `placed`: the reserved placement plan (`cluster.Reserved`) that says where each actor runs; without it
        (tests on one local node) actors take their CPUs anywhere. `wait=False` returns while the engines start
        (the driver starts the learner meanwhile; learner rank 0 calls `ready` before first use)."""
        threads = threads or ThreadPolicy.of(cfg)
        r = cfg.rollout
        env_opts = placed.env_options() if placed else [{"num_cpus": cfg.env.num_cpus_per_actor}] * cfg.env.num_actors
        engine_opts = placed.engine_options() if placed else [{"num_cpus": r.num_cpus_per_worker}] * r.num_workers
        # Ray restarts a dead actor (the pool redoes its work: rollout/recovery.py). A collective weight group
        # cannot take a new member, so there a dead engine ends the run.
        restarts = cfg.recovery.max_actor_restarts
        engine_restarts = 0 if cfg.sync.transport == "collective" else restarts
        env_hosts = [
            ray.remote(RestartableEnvHost)
            .options(max_concurrency=1000, max_restarts=restarts, max_task_retries=0, **o)
            .remote(tool_timeout_s=cfg.env.tool_timeout_s, isolation=cfg.env.isolation)
            for o in env_opts
        ]
        runtime_env = {"env_vars": engine_process_env(r.backend, use_gpu=threads.engines_on_gpu)}
        workers = [
            ray.remote(RolloutWorker)
            .options(runtime_env=runtime_env, max_restarts=engine_restarts, max_task_retries=0, **o)
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
                engine_modes(cfg, placed.plan.mode if placed else None),  # sleep between rollouts, native LoRA
                kv_sequences=sequences_per_engine(cfg),
            )
            for i, o in enumerate(engine_opts)
        ]
        seats = 1 if cfg.env.agent else players(env_class(cfg.env.name, cfg.env.tool_specs()))  # self-play: 2
        deadlines = Deadlines.of(cfg, seats)
        pool = cls(workers, env_hosts, Recovery(workers, env_hosts, deadlines, engine_restarts, restarts))
        if wait:
            pool.ready()
        return pool

    def ready(self) -> None:
        """Wait until every engine has started (its start-up error is raised here, as a deliberate stop: a learner
        retry would not fix it) and take the actors' process ids as recovery's baseline. Idempotent."""
        if self.started:
            return
        timeout = self.recovery.deadlines.actor_start_s if self.recovery else None
        try:
            ray.get([w.get_version.remote() for w in self.workers], timeout=timeout)
        except (RayActorError, GetTimeoutError) as err:
            raise ActorFailed(f"a rollout engine did not start: {err}") from err
        if self.recovery:
            self.recovery.remember()
        self.started = True

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
        shards = {i: rows[i :: self.num_workers] for i in range(self.num_workers)}
        self.latest = weights or self.latest
        weights = weights or (self.latest if self.resend_latest else None)
        if weights is not None and not all(shards.values()):  # a worker without rows still needs the new weights
            ray.get([w.receive_weights.remote(weights) for w in self.workers])
            weights = None
        shards = {i: shard for i, shard in shards.items() if shard}
        args = (group_size, temperature, seed)
        refs = {i: self.workers[i].rollout.remote(shard, *args, weights) for i, shard in shards.items()}
        return PendingSample(refs, rows, shards, args)

    def gather(self, pending: PendingSample) -> tuple[list[TrajectoryGroup], RolloutTimings]:
        groups: list[TrajectoryGroup] = []
        timings = RolloutTimings()
        results = self._collect(pending)
        for i in sorted(results):
            shard_groups, shard_timings = results[i]
            groups.extend(shard_groups)
            timings = timings.slowest(shard_timings)  # workers run in parallel: the slowest one counts
        order = {str(r["id"]): i for i, r in enumerate(pending.rows)}
        groups.sort(key=lambda g: order[g.prompt_id])
        return groups, timings

    def _collect(self, pending: PendingSample) -> dict[int, tuple[list[TrajectoryGroup], RolloutTimings]]:
        """Every shard's result; with recovery, a shard whose work was lost is redone on its restarted worker (the
        same rows and seed, after the latest weights), within the bound on restarts."""
        if self.recovery is None:
            return dict(zip(pending.refs, ray.get(list(pending.refs.values()))))
        refs, results, rounds = dict(pending.refs), {}, 0
        most = max(map(len, pending.shards.values()), default=0) * pending.args[0]  # trajectories on one engine
        deadline = self.recovery.deadlines.rollout_s(most)
        while refs:
            done, lost = self.recovery.wait(refs, deadline)
            # A worker Ray restarted between two calls serves the base model: what it sampled is redone too.
            lost += [i for i, (groups, _) in done.items() if self._behind(groups)]
            results.update((i, r) for i, r in done.items() if i not in lost)
            if lost:
                self.recovery.recover()  # raises past the bound on restarts
                rounds += 1
                if rounds > self.recovery.max_rounds:
                    raise ActorFailed(f"the rollout calls of worker(s) {lost} lost their work {rounds} times")
            again = (*pending.args, self.latest)
            refs = {i: self.workers[i].rollout.remote(pending.shards[i], *again, redo=True) for i in lost}
        return results

    def _behind(self, groups: list[TrajectoryGroup]) -> bool:
        return self.latest is not None and min(g.min_policy_version for g in groups) < self.latest.version

    def versions(self) -> list[int]:
        return ray.get([w.get_version.remote() for w in self.workers])

    def greedy(self, prompts: list[list[int]], max_tokens: int) -> list[list[tuple[list[int], list[float]]]]:
        """Greedy generation on every worker (weight-sync tests): one list of results per worker."""
        return ray.get([w.greedy.remote(prompts, max_tokens) for w in self.workers])

    def probe(self, sequences: list[list[int]], weights: WeightUpdate | None = None) -> list[Any]:
        """Start the integrity probe on every worker (teacher-forced log-probs of `sequences`, after `weights`, the
        sender's pending update, as a rollout call would load them); returns the calls, one per worker."""
        self.latest = weights or self.latest
        weights = weights or (self.latest if self.resend_latest else None)
        return [w.probe.remote(sequences, weights) for w in self.workers]

    def shutdown(self) -> None:
        for actor in self.workers + self.env_hosts:
            ray.kill(actor)
