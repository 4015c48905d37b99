"""What a step reports: the rollout's metrics, the phases' timings, and the held-out evaluation (success, pass@k and
the ECHO cross-entropy on environment tokens)."""

from __future__ import annotations

from typing import Any

import torch
import torch.distributed as dist

from agentrl_ray.config import Config
from agentrl_ray.learner.batching import broadcast_groups, build_batch, micro_batch_count, micro_batches, shard
from agentrl_ray.learner.feed import RolloutFeed
from agentrl_ray.learner.policy import Policy
from agentrl_ray.rewards.eval_stats import training_eval_metrics
from agentrl_ray.types import RolloutTimings, TrajectoryGroup


def rollout_metrics(groups: list[TrajectoryGroup], cfg: Config, version: int | None = None) -> dict[str, float]:
    trajs = [t for g in groups for t in g.trajectories]
    n = len(trajs)
    rewards = [t.reward for t in trajs]
    metrics = {
        "reward/mean": sum(rewards) / n,
        "rollout/success": sum(r >= cfg.run.success_threshold for r in rewards) / n,
        "rollout/sampled_tokens": sum(t.num_action_tokens for t in trajs),
        "rollout/env_tokens": sum(t.num_env_tokens for t in trajs),
        "rollout/mean_length": sum(len(t.token_ids) - t.prompt_len for t in trajs) / n,
        "rollout/tool_calls_per_traj": sum(t.num_tool_calls for t in trajs) / n,
        "rollout/tool_error_rate": sum(t.num_tool_errors for t in trajs) / max(1, sum(t.num_tool_calls for t in trajs)),
        "rollout/zero_variance_groups": sum(len(set(g.rewards)) == 1 for g in groups) / max(1, len(groups)),
        "reward/group_std": sum(float(torch.tensor(g.rewards).std(correction=0)) for g in groups) / len(groups),
        "rollout/truncated": sum(t.finish_reason == "length" for t in trajs) / n,
    }
    steps = sum(t.num_steps for t in trajs)
    if steps:  # a turn-based environment
        metrics["rollout/steps_per_traj"] = steps / n
        metrics["rollout/step_error_rate"] = sum(t.num_step_errors for t in trajs) / steps
    if version is not None:  # how many versions behind the learner the sampling weights were
        metrics["rollout/staleness"] = sum(version - t.policy_version for t in trajs) / n
    parts: dict[str, float] = {}
    for t in trajs:
        for k, v in t.reward_parts.items():
            parts[f"reward/{k}"] = parts.get(f"reward/{k}", 0.0) + v / n
    return {**metrics, **parts}


def phase_times(timings: RolloutTimings, rollout: float, learn: float, sync: float, total: float) -> dict[str, float]:
    """`time/rollout_s` is what the learner waited for rollouts (all of the rollout on-policy, the part not hidden
    behind the update when overlapped); `time/rollout_worker_s` is the rollout's own wall time in the workers.
    Weight sync is `time/sync_s` on the learner (the push) plus `time/load_weights_s` in the workers (the load at
    the start of the rollout that uses the weights, part of its wall time)."""
    return {
        "time/step_s": total,
        "time/rollout_s": rollout,
        "time/rollout_worker_s": timings.worker_s,
        "time/generate_s": timings.generate_s,
        "time/env_s": timings.env_s,
        "time/reward_s": timings.reward_s,
        "time/learner_s": learn,
        "time/sync_s": sync,
        "time/load_weights_s": timings.load_weights_s,
    }


def scalars(metrics: dict[str, Any]) -> dict[str, float]:
    return {k: float(v) for k, v in metrics.items() if isinstance(v, (int, float))}


def evaluate(
    feed: RolloutFeed | None, policy: Policy, rows: list[dict[str, Any]], cfg: Config, seed: int, pad_id: int
) -> dict:
    """Held-out success, pass@1 with its 95% interval and pass@k (`eval_stats`; sampled at rollout.eval_temperature)
    and the ECHO held-out environment-token CE.

    Every rank calls it: rank 0 samples (`feed` is rank 0's) and returns the metrics (the others return {}); the
    groups then go to every rank and each computes the CE on its shard (a forward under ZeRO-3 needs every rank)."""
    import ray.train

    rank, world = ray.train.get_context().get_world_rank(), ray.train.get_context().get_world_size()
    out: dict[str, float] = {}
    groups = None
    if rank == 0:
        groups = feed.evaluation(rows, seed)
        trajs = [t for g in groups for t in g.trajectories]
        out = training_eval_metrics(groups, cfg.run.success_threshold, rows)  # success, pass@1 with its CI, pass@k
        out["eval/reward"] = sum(t.reward for t in trajs) / len(trajs)
        out["eval/tool_call_rate"] = sum(t.num_tool_calls > 0 for t in trajs) / len(trajs)
    ce = echo_ce(policy, broadcast_groups(groups, world), cfg, pad_id, rank, world)
    if ce is not None and rank == 0:
        out["eval/echo_ce"] = ce
    return out


@torch.no_grad()
def echo_ce(policy: Policy, groups: list[TrajectoryGroup], cfg: Config, pad_id: int, rank: int, world: int):
    """Mean cross-entropy of the policy on environment (tool-output) tokens, sharded over the ranks (each runs the
    same number of forwards); None when the groups hold no environment token."""
    batch = build_batch(groups, cfg.algorithm, pad_id, cfg.rollout.max_total_tokens)
    if batch.env_mask.sum() == 0:
        return None
    mine = shard(batch, rank, world)
    n_micro = micro_batch_count(batch, world, cfg.learner.micro_batch_size, cfg.learner.micro_batch_tokens)
    sums = torch.zeros(2, dtype=torch.float64)  # (negative log-likelihood, token count)
    for mb, weight in micro_batches(mine, n_micro, policy.shared_prefix):
        mb = mb.to(policy.device)
        with torch.no_grad():
            logprobs, _ = policy.token_logprobs(
                mb.input_ids, mb.attention_mask, False, model=policy.module, needed=mb.env_mask > 0
            )
        sums[0] -= weight * float((logprobs * mb.env_mask).sum())
        sums[1] += weight * float(mb.env_mask.sum())
    if world > 1:
        dist.all_reduce(sums)
    return float(sums[0] / sums[1])
