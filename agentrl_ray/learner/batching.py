"""Trajectory groups → padded TrainBatch, sharded over learner ranks and split into micro-batches; rank 0's groups
broadcast to every rank."""

from __future__ import annotations

import math
from typing import Any

import torch
import torch.distributed as dist

from agentrl_ray.algorithms import compute_advantages, overlong_penalty
from agentrl_ray.config import AlgorithmConfig, LearnerConfig
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


def rows_with_gradient(batch: TrainBatch, cfg: AlgorithmConfig, echo_coeff: float, echo_only: bool) -> torch.Tensor:
    """(B,) bool: the rows whose loss term has a gradient (`algorithms.compute_loss`). A row's policy term is
    -advantage * ratio (plus beta * KL) over its action tokens, so it vanishes with a zero advantage and beta 0,
    without action tokens, when truncated under `mask_truncated`, and under `echo.only`; its ECHO term needs
    environment tokens and a nonzero coefficient."""
    echo_term = (batch.env_mask.sum(dim=1) > 0) & (echo_coeff != 0)  # (B,)
    if echo_only:
        return echo_term
    acts = batch.action_mask.sum(dim=1) > 0  # (B,)
    if cfg.mask_truncated:
        acts &= ~batch.truncated.bool()
    return echo_term | (acts & ((batch.advantages != 0) | (cfg.beta > 0)))


def shard(batch: TrainBatch, rank: int, world_size: int) -> TrainBatch:
    n = len(batch)
    bounds = [n * r // world_size for r in range(world_size + 1)]
    return batch.slice(bounds[rank], bounds[rank + 1])


def micro_batch_count(batch: TrainBatch, world: int, size: int, tokens: int = 0) -> int:
    """How many micro-batches every rank runs (all ranks the same, each rank's shard of the step's `batch`): enough
    that none holds more than `size` sequences and, with `tokens` > 0, none more than `tokens` padded tokens (its
    rows times its longest, as `micro_batches` splits them), down to one sequence per micro-batch. A batch of short
    sequences then trains in few large micro-batches and one of long sequences in many small ones."""
    shards = [shard(batch, r, world) for r in range(world)]
    n = max(1, *(math.ceil(len(s) / size) for s in shards))
    if tokens > 0:
        for s in shards:
            lengths = sorted(s.attention_mask.sum(dim=1).tolist())
            while n < len(lengths) and _largest_padded(lengths, n) > tokens:
                n += 1
    return n


def _largest_padded(lengths: list[int], num: int) -> int:
    """The largest (rows x longest) of `micro_batches`' split of rows of these sorted lengths into `num`."""
    bounds = [len(lengths) * i // num for i in range(num + 1)]
    return max((stop - start) * lengths[stop - 1] for start, stop in zip(bounds, bounds[1:]) if stop > start)


def micro_batches(batch: TrainBatch, num: int, share_prefix: bool = False) -> list[tuple[TrainBatch, float]]:
    """Exactly `num` micro-batches (every rank must run the same number of backwards for DDP/ZeRO).

    A rank with fewer rows than `num` gets (row 0, weight 0.0) fillers: forward/backward with a zero loss.
    Rows are ordered by length first and each micro-batch is trimmed to its longest sequence, so little compute goes
    to padding (the loss is normalized over the whole step's batch, so how rows are grouped does not change it).
    With `share_prefix` (the learner runs a micro-batch's common prefix once: learner/levers/shared_prefix.py) the
    rows are ordered by their tokens instead (a group's rows, which share their prompt, side by side) where that
    computes fewer tokens (`computed_tokens`).
    """
    n = len(batch)
    order = torch.argsort(batch.attention_mask.sum(dim=1), stable=True)
    if share_prefix:
        rows = batch.input_ids.tolist()
        by_tokens = torch.tensor(sorted(range(n), key=rows.__getitem__), dtype=torch.long)
        if computed_tokens(batch, by_tokens, num) < computed_tokens(batch, order, num):
            order = by_tokens
    batch = TrainBatch(**{k: v[order] for k, v in batch.__dict__.items()})
    out = []
    for i in range(num):
        start, stop = n * i // num, n * (i + 1) // num
        weight = 1.0
        if stop == start:
            start, stop, weight = 0, 1, 0.0
        out.append((_trimmed(batch.slice(start, stop)), weight))
    return out


def _trimmed(batch: TrainBatch) -> TrainBatch:
    """`batch` cut to its longest row (right padding)."""
    t = int(batch.attention_mask.sum(dim=1).max())
    return TrainBatch(**{k: (v[:, :t] if v.dim() == 2 else v) for k, v in batch.__dict__.items()})


def rank_micro_batches(
    full: TrainBatch, trained: TrainBatch, rank: int, world: int, lc: LearnerConfig, share_prefix: bool
) -> list[tuple[TrainBatch, float]]:
    """This rank's micro-batches of the step's `trained` rows (all of `full`'s, or those with a gradient), as many
    as every other rank runs. A rank left without rows (every row skipped, or fewer rows than ranks) runs
    zero-weight copies of the step's first row: the backwards that DDP and ZeRO expect, zero gradients for the
    optimizer step."""
    filler = _trimmed(full.slice(0, 1))
    if len(trained) == 0:
        return [(filler, 0.0)]
    n_micro = micro_batch_count(trained, world, lc.micro_batch_size, lc.micro_batch_tokens)
    mine = shard(trained, rank, world)
    if len(mine) == 0:
        return [(filler, 0.0)] * n_micro
    return micro_batches(mine, n_micro, share_prefix)


def computed_tokens(batch: TrainBatch, order: torch.Tensor, num: int) -> int:
    """The tokens the layers compute for `batch`'s rows taken in `order` and cut into `num` micro-batches, each
    trimmed to its longest row and its common prefix computed once (where `shared_prefix.worth_sharing`)."""
    from agentrl_ray.learner.levers.shared_prefix import common_prefix_length, worth_sharing

    n, total = len(batch), 0
    lengths = batch.attention_mask.sum(dim=1)
    for i in range(num):
        rows = order[n * i // num : n * (i + 1) // num]
        if len(rows) == 0:
            continue
        t = int(lengths[rows].max())
        prefix = common_prefix_length(batch.input_ids[rows, :t])
        total += len(rows) * t - (len(rows) - 1) * prefix * worth_sharing(len(rows), prefix)
    return total


def broadcast_groups(groups: Any, world: int) -> Any:
    """Rank 0's object (the step's groups, the stop decision) on every rank."""
    if world == 1:
        return groups
    box = [groups]
    dist.broadcast_object_list(box, src=0)
    return box[0]
