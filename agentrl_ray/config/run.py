"""How a run goes: weight sync (`sync.*`), placement (`placement.*`), recovery (`recovery.*`) and the run itself
(`run.*`)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from agentrl_ray.config.checking import need


@dataclass
class SyncConfig:
    """Weight sync from the learner to the rollout engines after every step (`sync.*`)."""

    transport: Literal["object_store", "collective", "ipc"] = "object_store"
    """Ray's object store; a gloo/NCCL broadcast group between learner rank 0 and the engines; or ipc: CUDA IPC
    handles from learner rank 0 to the engines on its GPU, never through host memory (chosen for a colocated plan on
    one GPU; on CPU the tensors travel by value)."""
    max_staleness: int = 0
    """How many policy versions behind the learner the oldest token of a trained trajectory may be. 0: on-policy;
    the batch pipeline takes 0 or 1 (step t+1 sampled while step t trains), the stream pipeline any k (a group past
    it is dropped and counted, `rollout/stale_dropped`)."""
    pipeline: Literal["batch", "stream"] = "batch"
    """batch: a step's groups go out together and come back together, weights change only between batches
    (bit-reproducible, docs/reliability.md); stream: the engines keep max(k, 1) steps of groups in flight, the learner
    trains on the first complete groups, and weights land in the engines between two turns, in flight
    (docs/async.md). Needs engines apart from the learner and the object-store transport."""
    bucket_mb: int = 256
    """Collective and ipc transports: MiB per bucket (collective: the extra memory on either end)."""

    def check(self) -> None:
        need(self.max_staleness >= 0, "sync.max_staleness must be >= 0 (0: on-policy)")
        need(
            self.pipeline == "stream" or self.max_staleness in (0, 1),
            f"sync.max_staleness={self.max_staleness} needs sync.pipeline=stream: the batch pipeline takes 0 "
            "(on-policy) or 1 (roll out step t+1 while training on step t)",
        )
        need(self.bucket_mb >= 1, "sync.bucket_mb must be at least 1")


@dataclass
class PlacementConfig:
    """Where engines, env hosts and learner ranks run (`placement.*`, see infra/placement.py)."""

    mode: Literal["auto", "separate", "colocated"] = "auto"
    """separate: engines and learner ranks on different GPUs; colocated: each GPU holds an engine and a learner
    rank (fractional Ray GPUs), so one GPU works; auto: separate with >= 2 GPUs in the cluster, else colocated."""
    timeout_s: float = 120.0
    """Seconds to wait for Ray to reserve the plan's placement groups before failing (never a silent hang)."""

    def check(self) -> None:
        need(self.timeout_s > 0, "placement.timeout_s must be > 0")


@dataclass
class RecoveryConfig:
    """Surviving dead and stuck actors (`recovery.*`; deadlines.py, rollout/recovery.py, docs/reliability.md)."""

    max_actor_restarts: int = 3
    """Restarts Ray grants each rollout worker and env host (their lost work is redone); past it the run stops."""
    max_learner_failures: int = 1
    """Learner failures Ray Train restarts from the latest checkpoint (FailureConfig.max_failures; errors count too)."""
    decode_step_s: float = 2.0
    """Upper bound on one decode step of an engine's full batch, s; a rollout's deadline is built from it."""
    slack_s: float = 120.0
    """Seconds added to every derived deadline (weight loads, prefill, scheduling)."""
    actor_start_s: float = 600.0
    """Seconds a restarted actor may take to answer again (an engine loads its model anew)."""
    learner_unresponsive_s: float = 600.0
    """A learner rank that does not answer Ray Train's health check for this long (its process frozen or stuck
    outside Python) is declared dead, and the learner restarts from the latest checkpoint like after a crash."""

    def check(self) -> None:
        need(self.max_actor_restarts >= 0, "recovery.max_actor_restarts must be >= 0")
        need(self.max_learner_failures >= 0, "recovery.max_learner_failures must be >= 0")
        need(
            min(self.decode_step_s, self.slack_s, self.actor_start_s, self.learner_unresponsive_s) > 0,
            "recovery: deadlines must be > 0 seconds",
        )


@dataclass
class RunConfig:
    """The run: steps, outputs, evaluation, checkpoints (`run.*`)."""

    name: str = "calculator"
    """Name of the run: its folder under run.output_dir."""
    output_dir: str = "runs"
    """Driver-side folder of the run's metrics, plots, config and summary: output_dir/name. Relative paths resolve
    against the working directory, or inside a submitted Ray job against $AGENTRL_HOME (default: the home folder)."""
    storage_path: str = ""
    """Where checkpoints live (Ray Train storage): a local path, a shared filesystem, or s3:// / gs://.
    Empty: output_dir. Several nodes need a path every node sees (shared FS or a cloud URI)."""
    steps: int = 30
    """Optimizer steps."""
    seed: int = 0
    """Seed of prompt order, sampling and initialization."""
    checkpoint_every: int = 10
    """Checkpoint every N steps (0 = only at the end)."""
    keep_checkpoints: int = 2
    """Checkpoints kept (0 = all)."""
    resume: bool = False
    """Continue the run of this name from its last checkpoint."""
    eval_every: int = 10
    """Held-out evaluation every N steps (0 = only at the end)."""
    eval_at_start: bool = True
    """Evaluate before the first step."""
    eval_samples: int = 2
    """Samples per held-out prompt."""
    success_threshold: float = 1.0
    """A trajectory succeeds when its reward reaches this."""
    wandb: bool = False
    """Log metrics to Weights & Biases."""
    wandb_mode: Literal["online", "offline"] = "offline"
    """Weights & Biases mode."""
    wandb_project: str = "agentrl_ray"
    """Weights & Biases project."""
    plot: bool = True
    """Write reward_curve.png at the end."""
    log_level: Literal["info", "debug"] = "info"
    """info: the console shows our own lines (one per step, evaluations, warnings to act on) and a progress bar; the
    output of Ray, vLLM, DeepSpeed and transformers goes to <run_dir>/log.txt. debug: everything on the console, as
    `agentrl-ray train --verbose`."""
    save_rollouts: int = 0
    """Write every N-th step's rollouts to <run_dir>/rollouts/step_<step>.jsonl as OpenAI-style messages (0 = never)."""
    save_rollouts_groups: int = 0
    """At most this many groups per saved step (whole groups, so preference pairs survive); 0 = all."""
    rollout_sample_groups: int = 1
    """Every other step keeps this many of its groups (the first ones) in <run_dir>/rollouts/, the sample that
    `agentrl-ray view` and wandb's rollout table show (0 = none)."""
    integrity: bool = True
    """Check every step (learner/integrity.py): each trained trajectory's policy version within sync.max_staleness
    (a group past it is dropped), every engine call intact in the trained ids (token continuity), the engines holding
    the learner's weights after each sync (a teacher-forced probe of two of the task's prompts) and the engine/learner
    log-prob gap on the trained tokens. Metrics integrity/<check>/...; a violation is a health warning."""
    integrity_band: float = 0.0
    """The mean |engine - learner| log-prob gap over which the weights probe and the behaviour check fail; 0 = by the
    engines' dtype and device (learner/integrity.py's table: 5e-5 for float32 on a CPU, 0.15 for bfloat16)."""
    strict_integrity: bool = False
    """Stop the run at the first step where an integrity check fails, with one line naming the check, where and by
    how much (default: warn and go on)."""
    early_stopping_patience: int = 0
    """Stop after this many evaluations without improvement of run.early_stopping_metric (0 = never stop early)."""
    early_stopping_metric: str = "eval/success"
    """Held-out metric watched by early stopping (an eval/ key of metrics.jsonl)."""
    early_stopping_min_delta: float = 0.0
    """An evaluation improves only when it beats the best so far by more than this."""
    early_stopping_mode: Literal["max", "min"] = "max"
    """max: higher is better (success, reward); min: lower is better (eval/echo_ce)."""

    def check(self) -> None:
        need(bool(self.name) and "/" not in self.name, "run.name must be a non-empty name without '/'")
        need(self.steps >= 1, "run.steps must be at least 1")
        need(
            "://" not in self.output_dir,
            f"run.output_dir {self.output_dir!r} must be a local folder (metrics and plots are written on the driver); "
            "put checkpoints in the cloud with run.storage_path=s3://... or gs://...",
        )
        need(self.checkpoint_every >= 0, "run.checkpoint_every must be >= 0 (0 = only at the end)")
        need(self.eval_every >= 0, "run.eval_every must be >= 0 (0 = only at the end)")
        need(self.eval_samples >= 1, "run.eval_samples must be at least 1")
        need(
            min(self.save_rollouts, self.save_rollouts_groups, self.rollout_sample_groups) >= 0,
            "run.save_rollouts, run.save_rollouts_groups and run.rollout_sample_groups must be >= 0",
        )
        need(self.early_stopping_patience >= 0, "run.early_stopping_patience must be >= 0 (0 = off)")
        need(
            self.early_stopping_metric != "eval/env_token_ce",
            "run.early_stopping_metric eval/env_token_ce was renamed eval/echo_ce (the ECHO loss's one name)",
        )
        need(
            self.early_stopping_patience == 0 or self.early_stopping_metric.startswith("eval/"),
            f"run.early_stopping_metric {self.early_stopping_metric!r} must be a held-out eval/ metric",
        )
        need(
            self.early_stopping_patience == 0 or self.eval_every > 0,
            "run.early_stopping_patience needs run.eval_every > 0: early stopping watches the periodic evaluations",
        )
