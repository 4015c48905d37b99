"""The CPU thread and overlap policy of a run, decided once from the config (`ThreadPolicy.of(cfg)`, in the driver)
and handed to every actor, which applies it with the cores of the node it runs on.

- Threads: Ray sets OMP_NUM_THREADS from an actor's num_cpus (often 1), so each role sets its own torch threads.
  On-policy (`sync.max_staleness=0`) rollout and learning alternate, so each takes every core of its node (several
  engines, or several learner workers, share them). Overlapped (`sync.max_staleness=1`) they run at the same time:
  the learner keeps every core and the engines share half of them. The learner is the longer phase in every run
  measured (docs/benchmarks.md), and when the rollout finishes first the learner has the machine to itself; while
  both run the cores are oversubscribed, which costs little only because OpenMP threads then sleep instead of spin
  when they wait (`OMP_WAIT_POLICY=PASSIVE`).
- Environment variables every actor of the run inherits (`actor_env`): quiet logs, that wait policy, and DeepSpeed's
  accelerator on a CPU learner. The engine's own settings live with the engine (`rollout.vllm_engine.vllm_env`).
- "Is this on GPU" is asked here, one way: `learner_on_gpu` (learner.use_gpu) and `engines_on_gpu`
  (rollout.use_gpu).
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from agentrl_ray.config import Config

# Actors inherit these: keep the console to the per-step lines and real warnings.
QUIET_ENV = {
    "TOKENIZERS_PARALLELISM": "false",
    "VLLM_LOGGING_LEVEL": "WARNING",
    "TRANSFORMERS_VERBOSITY": "error",
    "RAY_TRAIN_ENABLE_WORKER_STRUCTURED_LOGGING": "0",
    "PYTHONWARNINGS": "ignore::FutureWarning,ignore::DeprecationWarning",
}


def node_cores() -> int:
    """The cores this process may run on."""
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)


def default_threads(
    role: str, *, overlapped: bool, rollout_workers: int, learner_workers: int = 1, cores: int | None = None
) -> int:
    """Torch threads of a CPU learner (`role="learner"`) or rollout engine (`"rollout"`) whose config leaves them
    at 0, from the cores of the node it runs on (see the module docstring)."""
    cores = cores or node_cores()
    if role == "learner":
        return max(1, cores // max(1, learner_workers))
    engines = max(1, cores // 2) if overlapped else cores
    return max(1, engines // max(1, rollout_workers))


@dataclass(frozen=True)
class ThreadPolicy:
    overlapped: bool  # sync.max_staleness > 0: rollout and learning run at the same time
    learner_on_gpu: bool
    engines_on_gpu: bool
    rollout_workers: int
    learner_workers: int
    rollout_threads: int  # rollout.num_threads; 0 = from the node's cores
    learner_threads: int  # learner.torch_threads; 0 = from the node's cores

    @classmethod
    def of(cls, cfg: Config) -> ThreadPolicy:
        return cls(
            overlapped=cfg.sync.max_staleness > 0,
            learner_on_gpu=cfg.learner.use_gpu,
            engines_on_gpu=cfg.rollout.use_gpu,
            rollout_workers=cfg.rollout.num_workers,
            learner_workers=cfg.learner.num_workers,
            rollout_threads=cfg.rollout.num_threads,
            learner_threads=cfg.learner.torch_threads,
        )

    def engine_threads(self, cores: int | None = None) -> int:
        """Torch threads of one rollout engine (vLLM CPU freezes the count at engine start)."""
        return self.rollout_threads or default_threads(
            "rollout", overlapped=self.overlapped, rollout_workers=self.rollout_workers, cores=cores
        )

    def learner_worker_threads(self, cores: int | None = None) -> int:
        """Torch threads of one learner worker."""
        return self.learner_threads or default_threads(
            "learner",
            overlapped=self.overlapped,
            rollout_workers=self.rollout_workers,
            learner_workers=self.learner_workers,
            cores=cores,
        )

    def actor_env(self) -> dict[str, str]:
        """Environment variables for every actor of the run (set once, on the Ray job)."""
        env = dict(QUIET_ENV)
        # Overlapped on CPU the cores are oversubscribed: OpenMP threads sleep while they wait. Measured numbers in
        # docs/benchmarks.md; on-policy, spinning is faster for a small model's many short ops, so it stays. A value
        # the user exported wins.
        if self.overlapped and not self.learner_on_gpu and "OMP_WAIT_POLICY" not in os.environ:
            env["OMP_WAIT_POLICY"] = "PASSIVE"
        if not self.learner_on_gpu:
            env["DS_ACCELERATOR"] = "cpu"  # DeepSpeed would otherwise probe for GPUs and warn
        return env
