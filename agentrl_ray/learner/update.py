"""The update: advantages → loss → backward over micro-batches → optimizer step(s), every rank on its shard."""

from __future__ import annotations

import time

import torch

from agentrl_ray.algorithms import LossNorm, compute_loss, echo_coeff_at
from agentrl_ray.config import Config
from agentrl_ray.learner import guards
from agentrl_ray.learner.batching import build_batch, rank_micro_batches, rows_with_gradient
from agentrl_ray.learner.integrity import behaviour_gap
from agentrl_ray.learner.policy import Policy
from agentrl_ray.learner.schedule import lr_at
from agentrl_ray.types import TrajectoryGroup


def update(policy: Policy, groups: list[TrajectoryGroup], cfg: Config, step: int, pad_id: int) -> dict[str, float]:
    """Advantages → loss → backward over micro-batches → optimizer step(s); returns averaged metrics."""
    import ray.train

    rank, world = ray.train.get_context().get_world_rank(), ray.train.get_context().get_world_size()
    a, lc = cfg.algorithm, cfg.learner
    full = build_batch(groups, a, pad_id, cfg.rollout.max_total_tokens)
    # Counts over the whole step's batch (every rank holds it), so the loss is split-invariant.
    norm = LossNorm.of(full.action_mask, full.env_mask, a.loss_norm_constant or cfg.rollout.max_total_tokens, world)
    coeff = echo_coeff_at(cfg.echo, step)
    live = rows_with_gradient(full, a, coeff, cfg.echo.only)  # (N,)
    trained = full.select(live) if lc.skip_zero_gradient_rows else full
    mine = rank_micro_batches(full, trained, rank, world, lc, policy.shared_prefix)
    mbs = [(mb.to(policy.device), w) for mb, w in mine]
    rows_here = sum(len(mb) for mb, w in mbs if w)  # this rank's computed rows, fillers aside
    old = [mb.rollout_logprobs for mb, _ in mbs]
    # Every loss and metric reads log-probs through the action or environment mask: prompt and padding positions
    # are never scored (chunked_logprobs skips their share of the head).
    scored = [(mb.action_mask + mb.env_mask) > 0 for mb, _ in mbs]  # (b, t) each
    if a.tis_cap > 0:  # PPO ratio against the learner's own recomputation; TIS weights the rollout mismatch
        with torch.no_grad():
            old = [
                policy.token_logprobs(mb.input_ids, mb.attention_mask, False, needed=s)[0]
                for (mb, _), s in zip(mbs, scored)
            ]
    refs = [None] * len(mbs)
    if a.beta > 0:
        refs = [policy.reference_logprobs(mb.input_ids, mb.attention_mask, s) for (mb, _), s in zip(mbs, scored)]
    sums: dict[str, float] = {}
    t_opt = 0.0
    lr = lr_at(
        step,
        lc.lr,
        lc.lr_schedule,
        warmup_steps=lc.warmup_steps,
        total_steps=cfg.run.steps,
        min_lr_ratio=lc.min_lr_ratio,
    )
    skipped = 0
    gap = [0.0, 0, 0.0]  # the engine/learner gap on on-policy action tokens: sum, tokens, max (integrity.py)
    for iteration in range(a.num_iterations):
        finite = True
        for i, (mb, weight) in enumerate(mbs):
            last = i == len(mbs) - 1
            with policy.grad_sync_context(last):
                logprobs, entropy = policy.token_logprobs(mb.input_ids, mb.attention_mask, needed=scored[i])
                if iteration == 0 and weight:  # the learner's log-probs before any update of this step
                    behaviour_gap(gap, old[i] if a.tis_cap > 0 else logprobs.detach(), mb, step)
                loss, metrics = compute_loss(
                    logprobs,
                    entropy,
                    mb,
                    a,
                    norm,
                    old_logprobs=old[i],
                    echo_coeff=coeff,
                    echo=cfg.echo,
                    ref_logprobs=refs[i],
                )
                finite &= bool(torch.isfinite(loss))
                policy.backward(loss * weight, last)
            for k, v in metrics.items():
                sums[k] = sums.get(k, 0.0) + v * weight * len(mb)
        if not guards.step_is_finite(policy, finite):  # keep the last good weights (learner/guards.py)
            guards.skip_step(policy, step)
            skipped += 1
            continue
        t0 = time.perf_counter()
        sums["grad_norm"] = sums.get("grad_norm", 0.0) + policy.step(lr) * max(1, rows_here)
        t_opt += time.perf_counter() - t0
    denom = max(1, rows_here) * a.num_iterations
    # A rank that computed no row has no entropy, ratio or mismatch to report (zeros would read as a collapse).
    out = {f"loss/{k}": v / denom for k, v in sums.items() if rows_here or k == "grad_norm"}
    out["loss/zero_gradient_rows"] = int((~live).sum())
    out["time/optimizer_s"] = t_opt
    out["loss/echo_coeff"] = coeff
    out["loss/lr"] = lr
    out["loss/skipped_nonfinite"] = skipped
    if gap[1]:
        out["integrity/behaviour_logprobs/mean_gap"] = gap[0] / gap[1]
        out["integrity/behaviour_logprobs/max_gap"] = gap[2]
    out["integrity/behaviour_logprobs/tokens"] = gap[1]
    return out
