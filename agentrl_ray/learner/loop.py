"""The RL loop: Ray Train's `train_loop_per_worker`.

Per step, as named phases: rollout (rank 0 takes the step's groups from `feed.RolloutFeed`, scored in the workers)
→ broadcast the groups to all ranks → advantages → update (every rank on its shard, micro-batched: `update.py`) →
sync (rank 0 pushes weights to every rollout engine through `sync.sender`) → the integrity probe (`integrity.py`)
→ log and evaluate (`metrics.py`) → checkpoint through `ray.train.report` (`checkpoint.py`).
"""

from __future__ import annotations

import time
from typing import Any

import torch

from agentrl_ray.config import Config
from agentrl_ray.infra import startup
from agentrl_ray.infra.allocator import release_freed_memory
from agentrl_ray.infra.ray_train import loop_inputs
from agentrl_ray.learner import guards
from agentrl_ray.learner.batching import broadcast_groups
from agentrl_ray.learner.checkpoint import restore, save_checkpoint
from agentrl_ray.learner.feed import PromptSampler, RolloutFeed
from agentrl_ray.learner.integrity import Integrity
from agentrl_ray.learner.metrics import evaluate, phase_times, rollout_metrics, scalars
from agentrl_ray.learner.policy import Policy
from agentrl_ray.learner.resume_state import rng_state, set_rng_state
from agentrl_ray.learner.stream import StreamFeed
from agentrl_ray.learner.update import update
from agentrl_ray.learner.watch import RunWatch
from agentrl_ray.sync.sender import make_sender
from agentrl_ray.types import RolloutTimings, RunStopped


def train_loop_per_worker(config: dict[str, Any]) -> None:
    """Ray Train's entry point on every learner rank. A deliberate stop (`RunStopped`) is recorded with the driver's
    log actor before it is raised: Ray Train's FailureConfig retries every error of the worker group, and the
    retried attempt then ends at once instead of loading the checkpoint to meet the same stop again. `config`: the
    driver's `loop_config` (infra/ray_train.py)."""
    config = loop_inputs(config)
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

    from agentrl_ray.builtin.tokenizer import load_tokenizer

    cfg: Config = config["config"]
    pool, model_path = config["pool"], config["model_path"]
    ctx = ray.train.get_context()
    rank, world = ctx.get_world_rank(), ctx.get_world_size()
    startup.mark(f"learner {rank}", "loop entered (imports done)")
    torch.set_num_threads(config["threads"].learner_worker_threads())  # the run's policy, see threads.py
    torch.manual_seed(cfg.run.seed)
    tokenizer = load_tokenizer(model_path)
    pad_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id
    policy = Policy(model_path, cfg.model, cfg.learner, need_reference=cfg.algorithm.beta > 0)
    state = restore(policy, config.get("resume_from")) or {"step": 0, "samples": 0}
    startup.mark(f"learner {rank}", "model built")
    start, samples = state["step"], state["samples"]
    sampler = PromptSampler(config["train_rows"], cfg.rollout.prompts_per_step, cfg.run.seed)
    log = feed = sender = watch = None
    stop = None
    probe_rows = config["eval_rows"] or config["train_rows"]
    integrity = Integrity(cfg, tokenizer, probe_rows, rank)
    nonfinite_in_a_row = 0
    if rank == 0:
        watch = RunWatch(cfg, config["train_rows"], config["log"], integrity)
        sender = make_sender(cfg, policy.lora_scaling)
        pool.ready()  # the engines started while this learner did (driver.train)
        startup.mark("learner 0", "engines ready")
        sender.setup(pool.workers)
        startup.mark("learner 0", "weight sync set up")
        feed = (StreamFeed if cfg.sync.pipeline == "stream" else RolloutFeed)(pool, sender, sampler, cfg)
        log = config["log"]  # outputs.LogClient: records go to the driver's node (storage.py)
        log.truncate_after(start)
        feed.restore(state.get("in_flight", {}))
    if "rng" in state:  # learner/resume_state.py: the resumed run is the run that would have been
        set_rng_state(state["rng"])
    # Weights are read on every rank (a collective gather under ZeRO-3); rank 0 pushes them. So do evaluations.
    # A learner Ray Train restarted before its first checkpoint finds engines holding the dead one's weights.
    on_device = getattr(sender, "device_tensors", False)  # the IPC sender packs the weights on the GPU itself
    pushed_before = broadcast_groups(rank == 0 and start == 0 and any(pool.versions()), world)
    if start > 0 or pushed_before:  # give the engines the checkpoint's (or the base model's) weights
        named = policy.named_tensors_for_sync(on_device)
        if rank == 0:
            sender.push(named, start)
            # The streaming pipeline sends them now: its calls carry no weights, and engines left on the base
            # model's version would return every group past the staleness bound, to be dropped and sent again.
            feed.publish()
    elif cfg.run.eval_at_start:
        startup.mark(f"learner {rank}", "step-0 evaluation starts")
        m = evaluate(feed, policy, config["eval_rows"], cfg, seed=-1, pad_id=pad_id)
        if rank == 0:
            log.log(0, {**m, "samples": 0})  # the driver shows it (run/step_lines.py)
    for step in range(start, cfg.run.steps):
        # rollout (scored in the workers) → broadcast to every rank
        if step == start:
            startup.mark(f"learner {rank}", "first step starts")
        t_step = time.perf_counter()
        groups, timings, stats = feed.take(step, version=step) if rank == 0 else (None, RolloutTimings(), {})
        if rank == 0:
            groups = integrity.admit(groups, version=step)  # within sync.max_staleness, else dropped and reported
        t_rollout = time.perf_counter() - t_step
        groups = broadcast_groups(groups, world)
        # advantages → loss → update, every rank on its shard
        metrics: dict[str, Any] = {}
        t0 = time.perf_counter()
        if groups:
            metrics.update(update(policy, groups, cfg, step, pad_id))
        if cfg.learner.release_memory:
            release_freed_memory()  # the micro-batches' activations, kept mapped during the update (allocator.py)
        t_learn = time.perf_counter() - t0
        nonfinite_in_a_row = nonfinite_in_a_row + 1 if metrics.get("loss/skipped_nonfinite") else 0
        guards.check_consecutive(nonfinite_in_a_row, cfg.learner.max_nonfinite_steps, step)
        # sync: every rank reads the weights (the ZeRO-3 gather, counted as sync time), rank 0 pushes them
        t0 = time.perf_counter()
        named = policy.named_tensors_for_sync(on_device)
        t_wait, t_sync = 0.0, time.perf_counter() - t0
        if rank == 0:
            t_wait, t_push = sync_weights(feed, sender, named, step + 1)
            t_sync += t_push
        del named
        # every rank: a forward on the probe; rank 0: the engines' answer to the previous one
        probe = integrity.probe(policy, pool, sender, version=step + 1, last=step + 1 == cfg.run.steps)
        # log, evaluate (every rank), checkpoint
        done = step + 1
        samples += sum(len(g.trajectories) for g in groups)
        metrics.update(
            samples=samples, **phase_times(timings, t_rollout + t_wait, t_learn, t_sync, time.perf_counter() - t_step)
        )
        metrics.update(stats)  # e.g. rollout/groups_sampled
        metrics.update(probe)
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
                log.log(done, metrics)  # the driver shows the step's line (run/step_lines.py)
        stop = broadcast_groups(stop, world)  # every rank stops at the same step
        if step == start:
            startup.mark(f"learner {rank}", "first step done")
        if (cfg.run.checkpoint_every and done % cfg.run.checkpoint_every == 0) or done == cfg.run.steps or stop:
            in_flight = feed.state() if rank == 0 else {}
            resume = {"step": done, "samples": samples, "rng": rng_state(), "in_flight": in_flight}
            save_checkpoint(policy, tokenizer, resume, rank, scalars(metrics))
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
    feed.publish()  # the streaming pipeline sends them now, to land between two turns
    return wait, time.perf_counter() - t0
