"""Sizing from detected hardware: Ray CPU requests that fit the node, micro-batches that fit the GPU.

Ray refuses to place actors whose CPU requests add up to more than the node has (a workstation with exactly 8 cores
once asked for 8.25 and never started). `fit_cpu_requests` shares the node's cores out by weight (an engine 1, a
learner worker 2, an env host 0.25), at most `MAX_CPUS_PER_WEIGHT` per unit of weight: a request reserves CPUs for
scheduling only, the threads each actor runs are set apart (`profiles.default_threads`, rollout.num_threads,
learner.torch_threads).
"""

from __future__ import annotations

import copy
import math
from typing import Any

ENGINE_WEIGHT, LEARNER_WEIGHT, ENV_WEIGHT = 1.0, 2.0, 0.25
MAX_CPUS_PER_WEIGHT = 2.0
_STEP = 0.05  # requests are rounded down to this


def fit_cpu_requests(preset: dict[str, Any], cores: int) -> dict[str, Any]:
    """`preset` with rollout/learner/env CPU requests whose sum fits `cores` (its worker counts, default 1)."""
    out = copy.deepcopy(preset)
    rollout, learner, env = (out.setdefault(k, {}) for k in ("rollout", "learner", "env"))
    # A count of 0 is sized later from the cluster (placement plan): share the cores as for one.
    engines = rollout.get("num_workers", 1) or 1
    learners = learner.get("num_workers", 1) or 1
    hosts = env.get("num_actors", 1) or 1
    total = engines * ENGINE_WEIGHT + learners * LEARNER_WEIGHT + hosts * ENV_WEIGHT
    unit = min(MAX_CPUS_PER_WEIGHT, max(1, cores) / total)

    def request(weight: float) -> float:
        return max(_STEP, math.floor(weight * unit / _STEP + 1e-9) * _STEP)

    rollout["num_cpus_per_worker"] = round(request(ENGINE_WEIGHT), 2)
    learner["num_cpus_per_worker"] = round(request(LEARNER_WEIGHT), 2)
    env["num_cpus_per_actor"] = round(request(ENV_WEIGHT), 2)
    return out


def cpus_requested(cfg) -> float:
    """The CPUs a config's actors ask Ray for: rollout engines + env hosts + learner workers."""
    return (
        cfg.rollout.num_workers * cfg.rollout.num_cpus_per_worker
        + cfg.env.num_actors * cfg.env.num_cpus_per_actor
        + cfg.learner.num_workers * cfg.learner.num_cpus_per_worker
    )


def gpu_micro_batch(memory_gib: float) -> int:
    """Sequences per learner micro-batch on a GPU of this much memory (0: unknown, the default 32 stays)."""
    if memory_gib <= 0:
        return 32
    if memory_gib < 16:
        return 8
    if memory_gib < 40:
        return 16
    return 32
