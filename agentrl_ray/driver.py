"""The driver: validated config → Ray (start or join) → rollout pool → Ray Train TorchTrainer → results.

This is what `agentrl-ray train` and `ray job submit -- agentrl-ray train ...` run. It joins the cluster named by
RAY_ADDRESS (or the one a Ray job runs in) and otherwise starts a local Ray.
"""

from __future__ import annotations

import json
import logging
import os
from pathlib import Path
from typing import Any

from agentrl_ray.config import Config, ConfigError
from agentrl_ray.data import load_rows
from agentrl_ray.threads import ThreadPolicy

log = logging.getLogger("agentrl_ray")
# Ray folds log lines that differ only in numbers into "[repeated Nx]", which would hide most per-step lines. Read
# once when Ray is imported, so set before that.
os.environ.setdefault("RAY_DEDUP_LOGS", "0")
SNAPSHOT = "checkpoint_manager_snapshot.json"


def resolve_model(path: str) -> str:
    if path.startswith("builtin:"):  # the size was checked with the config (config.BUILTIN_MODELS)
        from agentrl_ray.builtin_model import ensure_builtin_model

        return str(ensure_builtin_model(size=path.removeprefix("builtin:")))
    folder = Path(path).expanduser()
    if not (folder / "config.json").is_file():
        raise ConfigError(
            f"model.path {path!r} is not a Hugging Face model folder (no config.json); "
            "use builtin:tiny, builtin:small or a local folder made by save_pretrained"
        )
    return str(folder.resolve())


def check_run_dir(cfg: Config) -> None:
    """Never silently overwrite or silently restart a run: resume must be asked for, and possible."""
    has_checkpoint = (cfg.run_dir / SNAPSHOT).exists()
    if has_checkpoint and not cfg.run.resume:
        raise ConfigError(
            f"{cfg.run_dir} already holds checkpoints of a run named {cfg.run.name!r}: pass "
            "run.resume=true to continue it, or choose another run.name"
        )
    if cfg.run.resume and not has_checkpoint:
        raise ConfigError(f"run.resume=true but {cfg.run_dir} holds no checkpoint to resume from")
    if not cfg.run.resume and (cfg.run_dir / "metrics.jsonl").exists():
        (cfg.run_dir / "metrics.jsonl").unlink()  # a previous attempt that never checkpointed


def init_ray(cfg: Config, threads: ThreadPolicy) -> None:
    import ray

    if ray.is_initialized():
        return
    env_vars = threads.actor_env()
    if os.environ.get("RAY_ADDRESS"):
        ray.init(address=os.environ["RAY_ADDRESS"], runtime_env={"env_vars": env_vars})
    else:
        # The dashboard also serves the state API that Ray Train's controller polls.
        ray.init(runtime_env={"env_vars": env_vars})
    need = (
        cfg.rollout.num_workers * cfg.rollout.num_cpus_per_worker
        + cfg.env.num_actors * cfg.env.num_cpus_per_actor
        + cfg.learner.num_workers * cfg.learner.num_cpus_per_worker
    )
    have = ray.cluster_resources().get("CPU", 0)
    if need > have:
        raise ConfigError(
            f"the config asks for {need:g} CPUs (rollout + env + learner actors) but the Ray cluster "
            f"has {have:g}: lower rollout.num_cpus_per_worker / learner.num_cpus_per_worker or add nodes"
        )


def train(cfg: Config) -> dict[str, Any]:
    """Run training end to end; returns the last reported metrics."""
    check_run_dir(cfg)
    model_path = resolve_model(cfg.model.path)
    train_rows = load_rows(cfg.data.train, cfg.data, split="train", size=cfg.data.train_size)
    eval_rows = load_rows(cfg.data.eval, cfg.data, split="eval", size=cfg.data.eval_size)
    cfg.run_dir.mkdir(parents=True, exist_ok=True)
    (cfg.run_dir / "config.json").write_text(json.dumps(cfg.to_dict(), indent=2))
    threads = ThreadPolicy.of(cfg)  # the CPU/overlap policy of every actor, decided once
    init_ray(cfg, threads)

    import ray.train
    from ray.train.torch import TorchConfig, TorchTrainer

    from agentrl_ray.learner.loop import train_loop_per_worker
    from agentrl_ray.rollout.pool import RolloutPool

    pool = RolloutPool.create(cfg, model_path, threads)
    try:
        lc = cfg.learner
        trainer = TorchTrainer(
            train_loop_per_worker,
            train_loop_config={
                "config": cfg,
                "pool": pool,
                "model_path": model_path,
                "threads": threads,
                "train_rows": train_rows,
                "eval_rows": eval_rows,
            },
            torch_config=TorchConfig(backend="nccl" if lc.use_gpu else "gloo"),
            scaling_config=ray.train.ScalingConfig(
                num_workers=lc.num_workers,
                use_gpu=lc.use_gpu,
                resources_per_worker={"CPU": lc.num_cpus_per_worker, **({"GPU": 1} if lc.use_gpu else {})},
            ),
            run_config=ray.train.RunConfig(
                name=cfg.run.name,
                storage_path=str(cfg.run_dir.parent),
                checkpoint_config=ray.train.CheckpointConfig(num_to_keep=cfg.run.keep_checkpoints or None),
            ),
        )
        result = trainer.fit()
    finally:
        pool.shutdown()
    if result.error is not None:
        raise result.error
    metrics = dict(result.metrics or {})
    summary = {
        "run_dir": str(cfg.run_dir),
        "checkpoint": result.checkpoint.path if result.checkpoint else None,
        **{k: v for k, v in metrics.items() if k.startswith("eval/")},
    }
    (cfg.run_dir / "summary.json").write_text(json.dumps(summary, indent=2))
    return metrics
