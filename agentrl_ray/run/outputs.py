"""Run outputs: a live line per step, metrics.jsonl, saved rollouts, optional wandb, and the reward-curve PNG.

All of them are written on the driver's node, in the folder the user looks in (`storage.py`): `MetricsLog` runs as
a small actor pinned there (`start_driver_log`), learner rank 0 sends it each step's record through `LogClient`
wherever rank 0 runs, and the driver draws the plot when training ends.

Files that are rewritten whole (config.json, summary.json, a truncated metrics.jsonl) go through `atomic_write_*`:
a crash leaves the old file or the new one, never half of one; so do the rollouts of a step,
`rollouts/step_<step>.jsonl` (the format: `traces/records.py`), which `agentrl-ray view` reads while the run trains.
metrics.jsonl is appended one line per step; a line torn by a crash is cut off on resume (`resume.repair_metrics`).
"""

from __future__ import annotations

import json
import os
import tempfile
import time
from pathlib import Path
from typing import Any

from agentrl_ray.config import RunConfig


def atomic_write_bytes(path: Path, data: bytes) -> None:
    """Write `data` to a temporary file beside `path`, fsync it, rename it over `path`, fsync the directory."""
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    dir_fd = os.open(path.parent, os.O_RDONLY)
    try:
        os.fsync(dir_fd)  # the rename itself survives a power loss
    finally:
        os.close(dir_fd)


def atomic_write_text(path: Path, text: str) -> None:
    atomic_write_bytes(path, text.encode())


def wandb_run_id(run_dir: Path, name: str, now: float) -> str:
    """The wandb run id of this run directory: made on its first start, kept in `wandb_id`, so a resumed run
    continues the same wandb run instead of starting a new one."""
    path = run_dir / "wandb_id"
    if path.exists():
        return path.read_text().strip()
    run_id = f"{name}-{int(now)}"
    atomic_write_text(path, run_id)
    return run_id


def write_rollouts(run_dir: Path, step: int, records: list[dict[str, Any]]) -> Path:
    """A step's trace records (`traces.records.group_records`) as `<run_dir>/rollouts/step_<step>.jsonl`."""
    folder = run_dir / "rollouts"
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / f"step_{step:06d}.jsonl"
    atomic_write_text(path, "".join(json.dumps(r) + "\n" for r in records))
    return path


def conversation_text(record: dict[str, Any]) -> str:
    """A trace record's conversation as plain text, one message a paragraph (wandb's table cell)."""
    lines = []
    for m in record["prompt"] + record["completion"]:
        calls = [f"{c['function']['name']}({c['function']['arguments']})" for c in m.get("tool_calls") or []]
        lines.append(f"[{m['role']}] " + " ".join([m.get("content") or "", *calls]).strip())
    return "\n\n".join(lines)


ROLLOUT_COLUMNS = ["step", "prompt_id", "sample", "reward", "reward_parts", "finish_reason", "tool_errors", "text"]


class MetricsLog:
    def __init__(self, run_dir: Path, cfg: RunConfig, full_config: dict[str, Any], total_steps: int) -> None:
        self.path = run_dir / "metrics.jsonl"
        self.total_steps = total_steps
        self.start = time.time()
        run_dir.mkdir(parents=True, exist_ok=True)
        self.run_dir = run_dir
        self.wandb = self.rollout_table = None
        self.stop_message: str | None = None
        if cfg.wandb:
            import wandb

            self.wandb = wandb.init(
                project=cfg.wandb_project,
                name=cfg.name,
                config=full_config,
                mode=cfg.wandb_mode,
                dir=str(run_dir),
                resume="allow",
                id=wandb_run_id(run_dir, cfg.name, self.start),
            )

    def truncate_after(self, step: int) -> None:
        """On resume, drop records of steps after the checkpoint (they will be redone)."""
        if not self.path.exists():
            return
        keep = [ln for ln in self.path.read_text().splitlines() if ln and json.loads(ln).get("step", 0) <= step]
        atomic_write_text(self.path, "".join(ln + "\n" for ln in keep))

    def log(self, step: int, metrics: dict[str, Any]) -> None:
        record = {"step": step, "time": round(time.time() - self.start, 2), **metrics}
        with self.path.open("a") as f:
            f.write(json.dumps(record) + "\n")
        if self.wandb is not None:
            self.wandb.log(metrics, step=step)

    def rollouts(self, step: int, records: list[dict[str, Any]], sample: int) -> None:
        """Write a step's rollouts; its first `sample` records (run.rollout_sample_groups) go to wandb's rollout
        table too, one table that grows step by step (wandb's incremental mode)."""
        write_rollouts(self.run_dir, step, records)
        if self.wandb is None or not sample:
            return
        import wandb

        if self.rollout_table is None:
            self.rollout_table = wandb.Table(columns=ROLLOUT_COLUMNS, log_mode="INCREMENTAL")
        for r in records[:sample]:
            parts = json.dumps(r["reward_parts"])
            row = [step, r["prompt_id"], r["sample_index"], r["reward"], parts, r["finish_reason"]]
            self.rollout_table.add_data(*row, r["num_tool_errors"], conversation_text(r))
        self.wandb.log({"rollouts": self.rollout_table}, step=step)

    def close(self) -> None:
        if self.wandb is not None:
            self.wandb.finish()

    def stop(self, message: str) -> None:
        """A learner rank stops the run on purpose (types.RunStopped); the first message is kept."""
        self.stop_message = self.stop_message or message

    def stopped(self) -> str | None:
        return self.stop_message


class LogClient:
    """Learner rank 0's handle to the `MetricsLog` actor on the driver's node. Each call waits for the write (a
    millisecond), so records are on disk in step order and a failed write fails the step."""

    def __init__(self, actor: Any, total_steps: int) -> None:
        self.actor, self.total_steps = actor, total_steps

    def truncate_after(self, step: int) -> None:
        import ray

        ray.get(self.actor.truncate_after.remote(step))

    def log(self, step: int, metrics: dict[str, Any]) -> None:
        import ray

        ray.get(self.actor.log.remote(step, metrics))

    def rollouts(self, step: int, records: list[dict[str, Any]], sample: int) -> None:
        import ray

        ray.get(self.actor.rollouts.remote(step, records, sample))

    def close(self) -> None:
        import ray

        ray.get(self.actor.close.remote())

    def stop(self, message: str) -> None:
        """Record a deliberate stop (any rank) before raising it, so that a retried attempt does not redo it."""
        import ray

        ray.get(self.actor.stop.remote(message))

    def stopped(self) -> str | None:
        """The message of a deliberate stop of this run (this driver's), or None."""
        import ray

        return ray.get(self.actor.stopped.remote())


def start_driver_log(run_dir: Path, cfg: RunConfig, full_config: dict[str, Any], total_steps: int) -> LogClient:
    """Start the MetricsLog actor on this (the driver's) node; call from the driver after Ray is up."""
    import ray
    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

    here = ray.get_runtime_context().get_node_id()
    actor = (
        ray.remote(MetricsLog)
        .options(num_cpus=0, scheduling_strategy=NodeAffinitySchedulingStrategy(here, soft=False))
        .remote(run_dir, cfg, full_config, total_steps)
    )
    return LogClient(actor, total_steps)


def plot_curves(metrics_path: Path, out_path: Path) -> Path | None:
    """Training reward and held-out success against samples seen."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    records = [json.loads(ln) for ln in metrics_path.read_text().splitlines() if ln.strip()]
    train = [r for r in records if "reward/mean" in r]
    evals = [r for r in records if "eval/success" in r]
    if not train and not evals:
        return None
    fig, ax = plt.subplots(figsize=(7, 4))
    if train:
        ax.plot([r["samples"] for r in train], [r["reward/mean"] for r in train], label="train reward (mean)")
    if evals:
        ax.plot([r["samples"] for r in evals], [r["eval/success"] for r in evals], "o-", label="held-out success")
    ax.set_xlabel("trajectories sampled")
    ax.set_ylim(-0.02, 1.02)
    ax.grid(alpha=0.3)
    ax.legend()
    ax.set_title(metrics_path.parent.name)
    fig.tight_layout()
    fig.savefig(out_path, dpi=120)
    plt.close(fig)
    return out_path
