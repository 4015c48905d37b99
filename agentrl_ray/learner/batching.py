"""Trajectory groups → padded TrainBatch, sharded over learner ranks and split into micro-batches; rank 0's groups
broadcast to every rank."""

from __future__ import annotations

from typing import Any

import torch
import torch.distributed as dist

from agentrl_ray.algorithms import compute_advantages, overlong_penalty
from agentrl_ray.config import AlgorithmConfig
from agentrl_ray.types import TrainBatch, TrajectoryGroup


def build_batch(groups: list[TrajectoryGroup], cfg: AlgorithmConfig, pad_id: int, max_total_tokens: int) -> TrainBatch:
    trajs = [t for g in groups for t in g.trajectories]
    rewards = torch.tensor([t.reward for t in trajs], dtype=torch.float32)  # (N,)
    if cfg.overlong_penalty_tokens > 0:
        lengths = torch.tensor([len(t.token_ids) for t in trajs])
        rewards = rewards + overlong_penalty(
            lengths, max_total_tokens, cfg.overlong_penalty_tokens, cfg.overlong_penalty_factor
        )
    group_index = torch.tensor([i for i, g in enumerate(groups) for _ in g.trajectories])  # (N,)
    advantages = compute_advantages(rewards, group_index, cfg)
    # A trajectory whose agent rewrote its history (the OpenAI endpoint) trains each earlier sequence as a row of its
    # own with the trajectory's advantage; its reward counted once in the group's statistics above.
    rows = [(part, i) for i, t in enumerate(trajs) for part in [*t.earlier_parts, t]]
    if len(rows) > len(trajs):
        advantages = advantages[torch.tensor([i for _, i in rows])]
    parts = [part for part, _ in rows]
    trajs = [trajs[i] for _, i in rows]
    t_max = max(len(t.token_ids) for t in parts)

    def pad(values: list, fill, dtype) -> torch.Tensor:
        return torch.tensor(values + [fill] * (t_max - len(values)), dtype=dtype)

    return TrainBatch(
        input_ids=torch.stack([pad(t.token_ids, pad_id, torch.long) for t in parts]),
        attention_mask=torch.stack([pad([1] * len(t.token_ids), 0, torch.long) for t in parts]),
        action_mask=torch.stack([pad(t.action_mask, 0, torch.float32) for t in parts]),
        env_mask=torch.stack([pad(t.env_mask, 0, torch.float32) for t in parts]),
        rollout_logprobs=torch.stack([pad(t.rollout_logprobs, 0.0, torch.float32) for t in parts]),
        advantages=advantages,
        truncated=torch.tensor([t.finish_reason == "length" for t in trajs]),
        policy_version=torch.tensor([t.policy_version for t in trajs]),
    )


def shard(batch: TrainBatch, rank: int, world_size: int) -> TrainBatch:
    n = len(batch)
    bounds = [n * r // world_size for r in range(world_size + 1)]
    return batch.slice(bounds[rank], bounds[rank + 1])


def micro_batches(batch: TrainBatch, num: int) -> list[tuple[TrainBatch, float]]:
    """Exactly `num` micro-batches (every rank must run the same number of backwards for DDP/ZeRO).

    A rank with fewer rows than `num` gets (row 0, weight 0.0) fillers: forward/backward with a zero loss.
    Rows are ordered by length first and each micro-batch is trimmed to its longest sequence, so little compute goes
    to padding (the loss is normalized over the whole step's batch, so how rows are grouped does not change it).
    """
    n = len(batch)
    order = torch.argsort(batch.attention_mask.sum(dim=1), stable=True)
    batch = TrainBatch(**{k: v[order] for k, v in batch.__dict__.items()})
    out = []
    for i in range(num):
        start, stop = n * i // num, n * (i + 1) // num
        weight = 1.0
        if stop == start:
            start, stop, weight = 0, 1, 0.0
        mb = batch.slice(start, stop)
        t = int(mb.attention_mask.sum(dim=1).max())
        out.append((TrainBatch(**{k: (v[:, :t] if v.dim() == 2 else v) for k, v in mb.__dict__.items()}), weight))
    return out


def broadcast_groups(groups: Any, world: int) -> Any:
    """Rank 0's object (the step's groups, the stop decision) on every rank."""
    if world == 1:
        return groups
    box = [groups]
    dist.broadcast_object_list(box, src=0)
    return box[0]
