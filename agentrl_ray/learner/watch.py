"""Rank 0's supervision of a run, after each step: saved traces, the health verdict and early stopping.

The loop calls `after_step` once per step, before the step's metrics are logged (it adds `health/*` to them), and
`finish` at the end; when `after_step` returns a reason, the loop saves a final checkpoint and stops.
`<run_dir>/stop.json` (merged into the driver's summary.json) says why the run ended, the best held-out value and
the first step with a red health verdict.
"""

from __future__ import annotations

import json
from typing import Any

from agentrl_ray.config import Config
from agentrl_ray.learner.health import EarlyStopper, HealthMonitor
from agentrl_ray.learner.integrity import Integrity
from agentrl_ray.rewards import load_reward_functions, reward_name
from agentrl_ray.rewards.failures import RewardFailureWatch
from agentrl_ray.types import RunStopped, TrajectoryGroup


class RunWatch:
    def __init__(
        self, cfg: Config, train_rows: list[dict[str, Any]], log: Any, integrity: Integrity | None = None
    ) -> None:
        self.cfg, self.log = cfg, log  # log: outputs.LogClient, which writes the traces on the driver's node
        self.integrity = integrity
        self.health = HealthMonitor()
        r = cfg.run
        self.stopper = EarlyStopper(
            r.early_stopping_metric, r.early_stopping_patience, r.early_stopping_min_delta, r.early_stopping_mode
        )
        self.rows_by_id = {str(row["id"]): row for row in train_rows}
        self.tools: list[dict[str, Any]] | None = None
        self.first_red: int | None = None
        names = [reward_name(fn) for fn in load_reward_functions(cfg.reward.functions)]
        self.reward_failures = RewardFailureWatch(cfg.reward.functions, names, cfg.reward.max_failing_steps)

    def after_step(self, step: int, groups: list[TrajectoryGroup], metrics: dict[str, Any]) -> str | None:
        """Save the step's traces (all of them every run.save_rollouts steps, else the sample of
        run.rollout_sample_groups), add the integrity checks and the health verdict to `metrics`; returns a reason to
        stop early, or None. Raises `RunStopped` on an integrity violation under run.strict_integrity."""
        if groups:
            self._save(step, groups)
        self.reward_failures.update(step, metrics)  # raises after reward.max_failing_steps all-failed steps
        violation = self.integrity.report(step, groups, metrics) if self.integrity else ""
        verdict = self.health.update(metrics)
        metrics.update(verdict.metrics())
        if verdict.level == 2 and self.first_red is None:
            self.first_red = step
        if violation and self.cfg.run.strict_integrity:
            raise RunStopped(f"integrity check {violation} (step {step}; run.strict_integrity=true)")
        reason = self.stopper.update(step, metrics)
        return reason if step < self.cfg.run.steps else None  # the last step ends the run anyway

    def _save(self, step: int, groups: list[TrajectoryGroup]) -> None:
        from agentrl_ray.traces.records import group_records

        r = self.cfg.run
        sample = min(r.rollout_sample_groups, len(groups))
        keep = (r.save_rollouts_groups or len(groups)) if r.save_rollouts and step % r.save_rollouts == 0 else sample
        if keep == 0:
            return
        if self.tools is None:  # the class the env hosts build: env.name's, with env.tools' functions added
            from agentrl_ray.envs.loading import env_class
            from agentrl_ray.envs.tools import tool_schemas

            self.tools = tool_schemas(env_class(self.cfg.env.name, self.cfg.env.tool_specs()))
        kept = groups[: max(keep, sample)]
        records = group_records(kept, step, self.rows_by_id, self.tools)
        self.log.rollouts(step, records, sum(len(g.trajectories) for g in kept[:sample]))

    def finish(self, step: int, stop_reason: str | None) -> dict[str, Any]:
        summary = {
            "steps_done": step,
            "steps_planned": self.cfg.run.steps,
            "stopped_early": stop_reason is not None,
            "stop_reason": stop_reason or "reached run.steps",
            "early_stopping_metric": self.stopper.metric,
            "best": self.stopper.best,
            "best_step": self.stopper.best_step if self.stopper.best is not None else None,
            "first_red_health_step": self.first_red,
            **(self.integrity.summary() if self.integrity else {}),
        }
        self.cfg.run_dir.mkdir(parents=True, exist_ok=True)
        (self.cfg.run_dir / "stop.json").write_text(json.dumps(summary, indent=2) + "\n")
        if stop_reason:
            print(f"stopped early after step {step}: {stop_reason}", flush=True)
        return summary
