"""What the learner trains on: prompt sampling, rollout scheduling, dynamic sampling and the staleness bound.

Runs on learner rank 0. `RolloutFeed.take(step, version)` returns the trajectory groups that step trains on;
`settle()` waits for a batch in flight before weights may change. The staleness bound is checked by the learner
(`integrity.py`: a group past it is dropped and reported). It needs only a pool with `start`/`gather`/`sample`
(`rollout.pool.RolloutPool` in a run, a fake pool in unit tests) and a weight sender whose pending update travels with
the next rollout call (`sync.sender`).
"""

from __future__ import annotations

import random
import time
from typing import Any

import torch

from agentrl_ray.algorithms import dynamic_sampling_keep
from agentrl_ray.config import Config
from agentrl_ray.learner.resume_state import batch_state, batches_from_state
from agentrl_ray.types import RolloutTimings, TrajectoryGroup


class PromptSampler:
    """Deterministic, resumable: the prompts of step s depend only on (seed, s)."""

    def __init__(self, rows: list[dict[str, Any]], per_step: int, seed: int) -> None:
        self.rows, self.per_step, self.seed = rows, per_step, seed

    def _row(self, i: int) -> dict[str, Any]:
        epoch, pos = divmod(i, len(self.rows))
        perm = list(range(len(self.rows)))
        random.Random(self.seed * 1000003 + epoch).shuffle(perm)
        return self.rows[perm[pos]]

    def for_step(self, step: int, extra: int = 0) -> list[dict[str, Any]]:
        # Refills draw past the step's own window, from a disjoint region far ahead.
        base = step * self.per_step if extra == 0 else (10**6 + step * 97 + extra) * self.per_step
        return [self._row(base + k) for k in range(self.per_step)]


class RolloutFeed:
    """Rank 0's source of each step's groups.

    On-policy (`sync.max_staleness=0`): step t's batch is sampled when step t asks for it, by version t's weights.
    Overlapped (`sync.max_staleness=1`): as soon as step t has its batch, step t+1's goes out to the engines, so
    it is generated while the learner trains on step t, by version t's weights: one version behind the learner
    that trains on it. The PPO ratio is taken against the sampling logprobs, which corrects for that (with
    `algorithm.tis_cap`, truncated importance sampling instead). Weights may change only while no batch is out (a
    worker would otherwise switch weights between the turns of an episode): the learner calls `settle()` before
    each push, and the next step then finds that batch ready.
    """

    def __init__(self, pool, sender, sampler: PromptSampler, cfg: Config) -> None:
        self.pool, self.sender, self.sampler, self.cfg = pool, sender, sampler, cfg
        self.overlap = cfg.sync.max_staleness > 0
        self.in_flight: tuple[int, Any] | None = None  # (step, the pool's pending batch)
        self.ready: dict[int, tuple[list[TrajectoryGroup], RolloutTimings]] = {}

    def _start(self, step: int, refill: int = 0):
        r = self.cfg.rollout
        seed = self.cfg.run.seed * 100003 + step + 7919 * refill
        rows = self.sampler.for_step(step, refill)
        return self.pool.start(rows, r.group_size, r.temperature, seed, self.sender.take_pending())

    def settle(self) -> float:
        """Gather the batch in flight, if any; returns the seconds spent waiting for it."""
        if self.in_flight is None:
            return 0.0
        t0 = time.perf_counter()
        step, pending = self.in_flight
        self.in_flight = None
        self.ready[step] = self.pool.gather(pending)
        return time.perf_counter() - t0

    def take(self, step: int, version: int) -> tuple[list[TrajectoryGroup], RolloutTimings, dict[str, float]]:
        """The groups of `step` (trained on by weights `version`), their rollout timings and feed stats, with dynamic
        sampling (DAPO) applied: groups whose rewards are all equal are dropped or refilled. Overlapped, also sends
        out step + 1's batch."""
        a, r = self.cfg.algorithm, self.cfg.rollout
        if self.in_flight is not None and self.in_flight[0] == step:
            self.settle()
        if step in self.ready:
            groups, timings = self.ready.pop(step)
        else:
            groups, timings = self.pool.gather(self._start(step))
        stats = {"rollout/groups_sampled": len(groups)}
        if a.dynamic_sampling != "off":
            groups = keep_varied(groups)
            rounds = 0
            refill = a.dynamic_sampling == "resample"
            while refill and len(groups) < r.prompts_per_step and rounds < a.max_resample_rounds:
                rounds += 1
                more, t = self.pool.gather(self._start(step, rounds))
                timings = timings.plus(t)
                stats["rollout/groups_sampled"] += len(more)
                groups += keep_varied(more)
            groups = groups[: r.prompts_per_step]
        if self.overlap and step + 1 < self.cfg.run.steps:
            self.in_flight = (step + 1, self._start(step + 1))
        return groups, timings, stats

    def publish(self) -> None:
        """Nothing to send now: the pushed weights travel with the next rollout call (`sender.take_pending`)."""

    def state(self) -> dict[str, Any]:
        """What a checkpoint records: the batch sampled ahead and not trained yet (overlapped)."""
        return batch_state(self.ready)

    def restore(self, state: dict[str, Any]) -> None:
        self.ready.update(batches_from_state(state))  # overlapped: sampled by version start - 1

    def evaluation(self, rows: list[dict[str, Any]], seed: int) -> list[TrajectoryGroup]:
        """`run.eval_samples` trajectories per held-out row, sampled at `rollout.eval_temperature` by the newest
        weights."""
        groups, _ = self.pool.sample(
            rows, self.cfg.run.eval_samples, self.cfg.rollout.eval_temperature, seed, self.sender.take_pending()
        )
        return groups


def keep_varied(groups: list[TrajectoryGroup]) -> list[TrajectoryGroup]:
    """The groups whose rewards are not all equal (`algorithms.dynamic_sampling_keep`)."""
    if not groups:
        return groups
    rewards = torch.tensor([t.reward for g in groups for t in g.trajectories])  # (N,)
    index = torch.tensor([i for i, g in enumerate(groups) for _ in g.trajectories])  # (N,)
    keep = dynamic_sampling_keep(rewards, index)
    return [g for i, g in enumerate(groups) if bool(keep[index == i].all())]
