"""The driver: validated config → Ray (start or join) → rollout pool → Ray Train TorchTrainer → results.

This is what `agentrl-ray train` and `ray job submit -- agentrl-ray train ...` run. It joins the cluster named by
RAY_ADDRESS (or the one a Ray job runs in) and otherwise starts a local Ray.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from agentrl_ray.builtin.resolve import resolve_model
from agentrl_ray.config import Config, ConfigError, RunConfig
from agentrl_ray.data import load_rows
from agentrl_ray.infra import console, startup
from agentrl_ray.infra.allocator import allocator_env
from agentrl_ray.infra.local_ray import init_ray
from agentrl_ray.infra.threads import ThreadPolicy
from agentrl_ray.run import preflight, resume
from agentrl_ray.run.outputs import atomic_write_text
from agentrl_ray.types import RunStopped

log = logging.getLogger("agentrl_ray")
# Ray folds log lines that differ only in numbers into "[repeated Nx]", which would hide most per-step lines. Read
# once when Ray is imported, so set before that.
os.environ.setdefault("RAY_DEDUP_LOGS", "0")
SNAPSHOT = resume.SNAPSHOT
HEALTH_CHECK_TIMEOUT = "RAY_TRAIN_WORKER_HEALTH_CHECK_TIMEOUT_S"  # Ray Train v2: recovery.learner_unresponsive_s


def check_run_dir(cfg: Config) -> Path | None:
    """Never silently overwrite or silently restart a run: resume must be asked for, and possible. On resume, repair
    what a crash tore and return the checkpoint to resume from when Ray Train's snapshot cannot say (resume.py)."""
    from agentrl_ray.infra.storage import checkpoint_root, is_uri

    root = checkpoint_root(cfg.run.output_dir, cfg.run.storage_path)
    local = None if is_uri(root) else Path(root) / cfg.run.name  # cloud storage: not verified here
    has_checkpoint = has_checkpoints(cfg.run, cfg.run.name)
    if has_checkpoint and not cfg.run.resume:
        raise ConfigError(
            f"{cfg.run_dir} already holds checkpoints of a run named {cfg.run.name!r}: pass "
            "run.resume=true to continue it, or choose another run.name"
        )
    if cfg.run.resume and not has_checkpoint:
        raise ConfigError(f"run.resume=true but {cfg.run_dir} holds no checkpoint to resume from")
    if not cfg.run.resume and (cfg.run_dir / "metrics.jsonl").exists():
        (cfg.run_dir / "metrics.jsonl").unlink()  # a previous attempt that never checkpointed
    if not cfg.run.resume:
        return None
    resume.repair_metrics(cfg.run_dir / "metrics.jsonl")
    return resume.prepare(local) if local is not None else None


def has_checkpoints(run: RunConfig, name: str) -> bool:
    """Does the run folder `name` hold checkpoints (Ray Train's snapshot, or a checkpoint the learner wrote)?"""
    from agentrl_ray.infra.storage import checkpoint_root, exists, is_uri

    root = checkpoint_root(run.output_dir, run.storage_path)
    return exists(root, f"{name}/{SNAPSHOT}") or (
        not is_uri(root) and any((Path(root) / name).glob("checkpoint_*/trainer_state.pt"))
    )


def fresh_run_name(run: RunConfig) -> str:
    """`run.name`, or the first of name-2, name-3, ... that no earlier run has used (no checkpoints, no metrics):
    for a run whose name nobody chose on the command line, so `make run` works every time and keeps the earlier
    runs. A folder left by an attempt that failed before its first step holds neither and is used again."""
    name, n = run.name, 1
    while has_checkpoints(run, name) or (Path(run.output_dir).expanduser() / name / "metrics.jsonl").exists():
        n += 1
        name = f"{run.name}-{n}"
    return name


def _rows(cfg: Config, split: str, spec: str, size: int) -> list[dict]:
    try:
        return load_rows(spec, cfg.data, split=split, size=size)
    except ConfigError as e:  # a missing file, a broken row: named by its key
        raise ConfigError(f"data.{split}: {e}") from e


def _ray_initialized() -> bool:
    import ray

    return ray.is_initialized()


def learner_run_config(cfg: Config, storage: str):
    import ray.train

    return ray.train.RunConfig(
        name=cfg.run.name,
        storage_path=storage,
        checkpoint_config=ray.train.CheckpointConfig(num_to_keep=cfg.run.keep_checkpoints or None),
        # A dead learner worker: the group restarts from the latest checkpoint (docs/reliability.md).
        failure_config=ray.train.FailureConfig(max_failures=cfg.recovery.max_learner_failures),
        # A CPU learner: the raised mmap threshold and no trimming, on per-thread arenas so that its OpenMP threads
        # do not queue for one heap's lock (allocator.py).
        worker_runtime_env={"env_vars": {} if cfg.learner.use_gpu else allocator_env(one_arena=False)},
    )


def place(cfg: Config, model_path: str):
    """Plan from the cluster's nodes (never this machine's), resolve the config's counts from it, check that every
    node sees the storage and the model, and reserve it. Returns (plan, reserved plan, checkpoint storage path)."""
    from agentrl_ray.infra import hub
    from agentrl_ray.infra.cluster import apply_plan, check_nodes_see, ensure_model_on_nodes, plan_for_cluster, reserve
    from agentrl_ray.infra.storage import checkpoint_root

    plan = plan_for_cluster(cfg)  # a plan the cluster cannot hold fails here, saying what is missing
    apply_plan(cfg, plan)
    log.info("%s", plan.describe())
    atomic_write_text(cfg.run_dir / "config.json", json.dumps(cfg.to_dict(), indent=2))  # as planned
    atomic_write_text(cfg.run_dir / "placement.json", json.dumps(plan.to_dict(), indent=2))
    storage = checkpoint_root(cfg.run.output_dir, cfg.run.storage_path)
    hub_model = hub.is_hub_id(cfg.model.path)
    check_nodes_see(storage, None if hub_model else model_path, plan)  # several nodes need shared folders
    if hub_model:
        ensure_model_on_nodes(cfg.model.path.partition("@")[0], model_path, plan)
    return plan, reserve(plan, cfg.placement.timeout_s, name=f"agentrl-{cfg.run.name}-rollout"), storage


@contextlib.contextmanager
def learner_deadline(seconds: float):
    """Ray Train's controller declares a learner rank dead when its health check hangs this long (a frozen process
    answers nothing), and FailureConfig then restarts the learner. Ray Train reads the bound only from the
    environment, which `fit()` hands from this process to its controller: set for the call, then put back."""
    before = os.environ.get(HEALTH_CHECK_TIMEOUT)
    os.environ[HEALTH_CHECK_TIMEOUT] = str(seconds)
    try:
        yield
    finally:
        if before is None:
            os.environ.pop(HEALTH_CHECK_TIMEOUT, None)
        else:
            os.environ[HEALTH_CHECK_TIMEOUT] = before


def _stop_message(metrics_log) -> str | None:
    """The learner's deliberate stop, if any; None when the log actor cannot say (Ray itself is going down: the
    error on its way out is the one to see)."""
    try:
        return metrics_log.stopped()
    except Exception:
        return None


def train(cfg: Config, pool=None) -> dict[str, Any]:
    """Run training end to end; returns the last reported metrics. `pool`: a RolloutPool to train with instead of
    new engines (tests inspect the engines afterwards); its owner shuts it down."""
    startup.mark("driver", "train called (driver imported)")
    preflight.resolve_user_code(cfg)  # the user's code imports, before anything is started or written
    resume_from = check_run_dir(cfg)
    model_path = resolve_model(cfg.model.path)
    train_rows = _rows(cfg, "train", cfg.data.train, cfg.data.train_size)
    eval_rows = _rows(cfg, "eval", cfg.data.eval, cfg.data.eval_size)
    if cfg.learner.lora.quantize != "none":  # validate() allows it only with LoRA
        from agentrl_ray.learner.levers.qlora import require_bitsandbytes

        require_bitsandbytes()  # QLoRA's library, named with its install step, before Ray starts
    cfg.run_dir.mkdir(parents=True, exist_ok=True)
    started_ray = not _ray_initialized()
    with ThreadPoolExecutor(1, thread_name_prefix="tokenizer") as ex:
        # The tokenizer (~3 s of imports on 2 cores) loads while Ray starts (~4 s, mostly its own processes). Bad
        # input still fails in the preflight before any actor starts; a Ray started here is shut down then.
        tokenizer = ex.submit(preflight.load_tokenizer, model_path)
        # The actors' environment depends only on overlap and the learner's device, known before the plan.
        init_ray(cfg, ThreadPolicy.of(cfg), log_file=str(console.log_file() or "") or None)
        startup.mark("driver", "Ray up")
        try:
            preflight.check(cfg, model_path, train_rows, eval_rows, tokenizer.result())
            startup.mark("driver", "preflight checked (tokenizer loaded)")
        except BaseException:
            if started_ray:
                import ray

                ray.shutdown()
            raise

    import ray.train

    from agentrl_ray.infra.cluster import learner_scaling
    from agentrl_ray.infra.ray_train import ProcessGroupConfig, loop_config, torch_trainer
    from agentrl_ray.learner.loop import train_loop_per_worker
    from agentrl_ray.rollout.pool import RolloutPool
    from agentrl_ray.run.outputs import plot_curves, start_driver_log
    from agentrl_ray.run.step_lines import StepLines

    plan, placed, storage = place(cfg, model_path)
    startup.mark("driver", "placed")
    threads = ThreadPolicy.of(cfg)  # the CPU/overlap policy of every actor, with the plan's counts
    own_pool = pool is None
    try:
        # The learner starts while the engines do (learner rank 0 waits for them), except where an engine shares
        # its GPU with a learner rank: vLLM sizes its KV cache from the GPU memory free while it starts.
        overlap = plan.mode != "colocated"
        pool = RolloutPool.create(cfg, model_path, threads, placed, wait=not overlap) if own_pool else pool
    except BaseException:
        placed.release()
        raise
    metrics_log = start_driver_log(cfg.run_dir, cfg.run, cfg.to_dict(), cfg.run.steps)
    # the console's step lines and progress bar (its ETA prices the evaluations apart)
    lines = StepLines(cfg.run_dir / "metrics.jsonl", cfg.run.steps, eval_every=cfg.run.eval_every)
    try:
        lc = cfg.learner
        trainer = torch_trainer()(
            train_loop_per_worker,
            train_loop_config=loop_config(
                {
                    "config": cfg,
                    "pool": pool,
                    "model_path": model_path,
                    "threads": threads,
                    "train_rows": train_rows,
                    "eval_rows": eval_rows,
                    "log": metrics_log,
                    "resume_from": str(resume_from) if resume_from else None,
                }
            ),
            torch_config=ProcessGroupConfig(backend="nccl" if lc.use_gpu else "gloo"),
            scaling_config=learner_scaling(plan, lc.use_gpu),
            run_config=learner_run_config(cfg, storage),
        )
        try:
            startup.mark("driver", "engines and env hosts asked for; learner fit starts")
            with learner_deadline(cfg.recovery.learner_unresponsive_s):
                result = trainer.fit()
        finally:
            stopped = _stop_message(metrics_log)  # a deliberate stop (types.RunStopped) says why in its own words
    finally:
        lines.close()
        if own_pool:
            pool.shutdown()
        placed.release()
        ray.kill(metrics_log.actor)
    if cfg.run.plot and (cfg.run_dir / "metrics.jsonl").exists():
        plot_curves(cfg.run_dir / "metrics.jsonl", cfg.run_dir / "reward_curve.png")
    if stopped is not None:
        raise RunStopped(stopped)
    if result.error is not None:
        raise result.error
    metrics = dict(result.metrics or {})
    summary = {
        "run_dir": str(cfg.run_dir),
        "checkpoint": result.checkpoint.path if result.checkpoint else None,
        **{k: v for k, v in metrics.items() if k.startswith("eval/")},
    }
    stop = cfg.run_dir / "stop.json"  # learner/watch.py: why the run ended, health, early stopping
    if stop.exists():
        summary.update(json.loads(stop.read_text()))
    atomic_write_text(cfg.run_dir / "summary.json", json.dumps(summary, indent=2))
    return metrics
