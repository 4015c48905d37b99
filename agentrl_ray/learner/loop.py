"""The RL loop: Ray Train's `train_loop_per_worker`.

Per step, as named phases: rollout (rank 0 takes the step's groups from `feed.RolloutFeed`, scored in the workers)
→ broadcast the groups to all ranks → advantages → update (every rank on its shard, micro-batched) → sync (rank 0
pushes weights to every rollout engine through `sync.sender`) → log, evaluate and checkpoint through
`ray.train.report`.
"""

from __future__ import annotations

import math
import tempfile
import time
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist

from agentrl_ray.algorithms import LossNorm, compute_loss, echo_coeff_at
from agentrl_ray.allocator import release_freed_memory
from agentrl_ray.config import Config
from agentrl_ray.eval_stats import training_eval_metrics
from agentrl_ray.learner import guards
from agentrl_ray.learner.batching import build_batch, micro_batches, shard
from agentrl_ray.learner.feed import PromptSampler, RolloutFeed
from agentrl_ray.learner.policy import TRAINER_STATE, Policy
from agentrl_ray.learner.resume_state import batch_state, batches_from_state, rng_state, set_rng_state
from agentrl_ray.learner.schedule import lr_at
from agentrl_ray.learner.sync_check import SyncCheck
from agentrl_ray.learner.watch import RunWatch
from agentrl_ray.outputs import eval_text
from agentrl_ray.sync.sender import make_sender
from agentrl_ray.types import RolloutTimings, RunStopped, TrajectoryGroup


def update(policy: Policy, groups: list[TrajectoryGroup], cfg: Config, step: int, pad_id: int) -> dict[str, float]:
    """Advantages → loss → backward over micro-batches → optimizer step(s); returns averaged metrics."""
    import ray.train

    rank, world = ray.train.get_context().get_world_rank(), ray.train.get_context().get_world_size()
    a, lc = cfg.algorithm, cfg.learner
    full = build_batch(groups, a, pad_id, cfg.rollout.max_total_tokens)
    # Counts over the whole step's batch (every rank holds it), so the loss is split-invariant.
    norm = LossNorm.of(full.action_mask, full.env_mask, a.loss_norm_constant or cfg.rollout.max_total_tokens, world)
    mine = shard(full, rank, world)
    n_micro = math.ceil(max(len(shard(full, r, world)) for r in range(world)) / lc.micro_batch_size)
    mbs = [(mb.to(policy.device), w) for mb, w in micro_batches(mine, n_micro)]
    coeff = echo_coeff_at(cfg.echo, step)
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
    for _ in range(a.num_iterations):
        finite = True
        for i, (mb, weight) in enumerate(mbs):
            last = i == len(mbs) - 1
            with policy.grad_sync_context(last):
                logprobs, entropy = policy.token_logprobs(mb.input_ids, mb.attention_mask, needed=scored[i])
                loss, metrics = compute_loss(
                    logprobs,
                    entropy,
                    mb,
                    a,
                    norm,
                    old_logprobs=old[i],
                    world_coeff=coeff,
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
        sums["grad_norm"] = sums.get("grad_norm", 0.0) + policy.step(lr) * len(mine)
        t_opt += time.perf_counter() - t0
    denom = max(1, len(mine)) * a.num_iterations
    out = {f"loss/{k}": v / denom for k, v in sums.items()}
    out["time/optimizer_s"] = t_opt
    out["loss/world_model_coeff"] = coeff
    out["loss/lr"] = lr
    out["loss/skipped_nonfinite"] = skipped
    return out


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
        out = training_eval_metrics(groups, cfg.run.success_threshold)  # success, pass@1 with its CI, pass@k
        out["eval/reward"] = sum(t.reward for t in trajs) / len(trajs)
        out["eval/tool_call_rate"] = sum(t.num_tool_calls > 0 for t in trajs) / len(trajs)
    ce = env_token_ce(policy, broadcast_groups(groups, world), cfg, pad_id, rank, world)
    if ce is not None and rank == 0:
        out["eval/env_token_ce"] = ce
    return out


@torch.no_grad()
def env_token_ce(policy: Policy, groups: list[TrajectoryGroup], cfg: Config, pad_id: int, rank: int, world: int):
    """Mean cross-entropy of the policy on environment (tool-output) tokens, sharded over the ranks (each runs the
    same number of forwards); None when the groups hold no environment token."""
    batch = build_batch(groups, cfg.algorithm, pad_id, cfg.rollout.max_total_tokens)
    if batch.env_mask.sum() == 0:
        return None
    mine = shard(batch, rank, world)
    n_micro = math.ceil(max(len(shard(batch, r, world)) for r in range(world)) / cfg.learner.micro_batch_size)
    sums = torch.zeros(2, dtype=torch.float64)  # (negative log-likelihood, token count)
    for mb, weight in micro_batches(mine, n_micro):
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


def broadcast_groups(groups: Any, world: int) -> Any:
    """Rank 0's object (the step's groups, the stop decision) on every rank."""
    if world == 1:
        return groups
    box = [groups]
    dist.broadcast_object_list(box, src=0)
    return box[0]


def save_checkpoint(policy: Policy, tokenizer, state: dict[str, Any], rank: int, metrics: dict[str, Any]) -> None:
    import ray.train

    with tempfile.TemporaryDirectory() as tmp:
        policy.save(Path(tmp), {**state, "rank": rank}, tokenizer)
        ray.train.report(
            metrics,
            checkpoint=ray.train.Checkpoint.from_directory(tmp),
            checkpoint_dir_name=f"checkpoint_{state['step']:06d}",
        )


def restore(policy: Policy, fallback: str | None = None) -> dict[str, Any] | None:
    """Load Ray Train's latest checkpoint, or `fallback` (a verified folder chosen by resume.prepare when Ray
    Train's snapshot was unusable; Ray Train v2 refuses `resume_from_checkpoint`)."""
    import ray.train

    checkpoint = ray.train.get_checkpoint()
    if checkpoint is None and fallback:
        checkpoint = ray.train.Checkpoint(fallback)
    if checkpoint is None:
        return None
    with checkpoint.as_directory() as path:
        if not (Path(path) / TRAINER_STATE).exists():
            raise RuntimeError(f"checkpoint {path} has no {TRAINER_STATE}: it is incomplete")
        return policy.load(Path(path))


def train_loop_per_worker(config: dict[str, Any]) -> None:
    """Ray Train's entry point on every learner rank. A deliberate stop (`RunStopped`) is recorded with the driver's
    log actor before it is raised: Ray Train's FailureConfig retries every error of the worker group, and the
    retried attempt then ends at once instead of loading the checkpoint to meet the same stop again."""
    log = config["log"]
    if log.stopped() is not None:
        return
    try:
        _train_loop(config)
    except RunStopped as err:
        log.stop(str(err))
        raise


def _train_loop(config: dict[str, Any]) -> None:
    import ray.train
    from transformers import AutoTokenizer

    cfg: Config = config["config"]
    pool, model_path = config["pool"], config["model_path"]
    ctx = ray.train.get_context()
    rank, world = ctx.get_world_rank(), ctx.get_world_size()
    torch.set_num_threads(config["threads"].learner_worker_threads())  # the run's policy, see threads.py
    torch.manual_seed(cfg.run.seed)
    tokenizer = AutoTokenizer.from_pretrained(model_path)
    pad_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id
    policy = Policy(model_path, cfg.model, cfg.learner, need_reference=cfg.algorithm.beta > 0)
    state = restore(policy, config.get("resume_from")) or {"step": 0, "samples": 0}
    start, samples = state["step"], state["samples"]
    sampler = PromptSampler(config["train_rows"], cfg.rollout.prompts_per_step, cfg.run.seed)
    log = feed = sender = watch = check = None
    stop = None
    nonfinite_in_a_row = 0
    if rank == 0:
        watch = RunWatch(cfg, config["train_rows"])
        sender = make_sender(cfg, policy.lora_scaling)
        pool.ready()  # the engines started while this learner did (driver.train)
        sender.setup(pool.workers)
        feed = RolloutFeed(pool, sender, sampler, cfg)
        if cfg.run.sync_check:
            check = SyncCheck(model_path, tokenizer, cfg.model.dtype, policy.lora_scaling)
        log = config["log"]  # outputs.LogClient: records go to the driver's node (storage.py)
        log.truncate_after(start)
        feed.ready.update(batches_from_state(state.get("in_flight", {})))  # overlapped: sampled by version start-1
    if "rng" in state:  # learner/resume_state.py: the resumed run is the run that would have been
        set_rng_state(state["rng"])
    # Weights are read on every rank (a collective gather under ZeRO-3); rank 0 pushes them. So do evaluations.
    # A learner Ray Train restarted before its first checkpoint finds engines holding the dead one's weights.
    pushed_before = broadcast_groups(rank == 0 and start == 0 and any(pool.versions()), world)
    if start > 0 or pushed_before:  # give the engines the checkpoint's (or the base model's) weights
        named = policy.named_tensors_for_sync()
        if rank == 0:
            sender.push(named, start)
    elif cfg.run.eval_at_start:
        m = evaluate(feed, policy, config["eval_rows"], cfg, seed=-1, pad_id=pad_id)
        if rank == 0:
            log.log(0, {**m, "samples": 0})
            print(f"step    0/{cfg.run.steps} | eval {eval_text(m)} (before training)", flush=True)
    for step in range(start, cfg.run.steps):
        # rollout (scored in the workers) → broadcast to every rank
        t_step = time.perf_counter()
        groups, timings, stats = feed.take(step, version=step) if rank == 0 else (None, RolloutTimings(), {})
        t_rollout = time.perf_counter() - t_step
        groups = broadcast_groups(groups, world)
        # advantages → loss → update, every rank on its shard
        metrics: dict[str, Any] = {}
        t0 = time.perf_counter()
        if groups:
            metrics.update(update(policy, groups, cfg, step, pad_id))
        release_freed_memory()  # the micro-batches' activations, kept mapped during the update (allocator.py)
        t_learn = time.perf_counter() - t0
        nonfinite_in_a_row = nonfinite_in_a_row + 1 if metrics.get("loss/skipped_nonfinite") else 0
        guards.check_consecutive(nonfinite_in_a_row, cfg.learner.max_nonfinite_steps, step)
        # sync: every rank reads the weights (the ZeRO-3 gather, counted as sync time), rank 0 pushes them
        t0 = time.perf_counter()
        named = policy.named_tensors_for_sync()
        t_wait, t_sync = 0.0, time.perf_counter() - t0
        sync_metrics: dict[str, float] = {}
        if rank == 0:
            t_wait, t_push = sync_weights(feed, sender, named, step + 1)
            t_sync += t_push
            if check is not None:
                sync_metrics = check(sender, pool, named)
        del named
        # log, evaluate (every rank), checkpoint
        done = step + 1
        samples += sum(len(g.trajectories) for g in groups)
        metrics.update(
            samples=samples, **_phase_times(timings, t_rollout + t_wait, t_learn, t_sync, time.perf_counter() - t_step)
        )
        metrics.update(stats)  # e.g. rollout/groups_sampled
        metrics.update(sync_metrics)
        if (cfg.run.eval_every and done % cfg.run.eval_every == 0) or done == cfg.run.steps:
            metrics.update(evaluate(feed, policy, config["eval_rows"], cfg, seed=-1 - done, pad_id=pad_id))
        if rank == 0:
            metrics.update(
                rollout_metrics(groups, cfg, version=step)
                if groups
                else {"reward/mean": 0.0, "rollout/success": 0.0, "rollout/sampled_tokens": 0}
            )
            try:
                stop = watch.after_step(done, groups, metrics)
            finally:  # the step that trips a guard (e.g. reward.max_failing_steps) is logged too
                log.log(done, metrics)
                log.print_step(done, metrics)
        stop = broadcast_groups(stop, world)  # every rank stops at the same step
        if (cfg.run.checkpoint_every and done % cfg.run.checkpoint_every == 0) or done == cfg.run.steps or stop:
            in_flight = batch_state(feed.ready) if rank == 0 else {}
            resume = {"step": done, "samples": samples, "rng": rng_state(), "in_flight": in_flight}
            save_checkpoint(policy, tokenizer, resume, rank, _scalars(metrics))
        if stop:
            if rank == 0:
                feed.settle()  # the next step's batch, already sent out, is no longer wanted
            break
        # No report on the other steps: Ray Train's controller takes one report per poll, at most every
        # RAY_TRAIN_HEALTH_CHECK_INTERVAL_S (2 s), from a queue of one, so a report every step held every step to
        # >= 2 s (docs/benchmarks.md). Per-step metrics go to metrics.jsonl, wandb and the console on rank 0.
    if rank == 0:
        watch.finish(done if cfg.run.steps > start else start, stop)
        log.close()


def sync_weights(feed: RolloutFeed, sender, named: list[tuple[str, torch.Tensor]], version: int) -> tuple[float, float]:
    """Send weights `version` to every engine, after the batch in flight (if any) is back. Returns the seconds
    spent (waiting for that batch, pushing)."""
    wait = feed.settle()
    t0 = time.perf_counter()
    sender.push(named, version)
    return wait, time.perf_counter() - t0


def _phase_times(timings: RolloutTimings, rollout: float, learn: float, sync: float, total: float) -> dict[str, float]:
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


def _scalars(metrics: dict[str, Any]) -> dict[str, float]:
    return {k: float(v) for k, v in metrics.items() if isinstance(v, (int, float))}
