"""Stop a run whose reward function fails on every sample, instead of training on zeros.

A reward function that raises (or returns no number) scores 0.0 for the samples concerned and says so in their
reward parts (`<name>/error`, see `scoring`), so one bad sample costs one sample. When a function fails on *every*
sample of a step, for `reward.max_failing_steps` steps in a row, every reward it contributes is a zero that means
nothing, and the policy would be trained towards noise: the run stops with a message naming the function.
"""

from __future__ import annotations

from typing import Any

from agentrl_ray.types import RunStopped


class RewardFailureWatch:
    def __init__(self, specs: list[str], names: list[str], limit: int) -> None:
        """`specs`: the config's `reward.functions` entries; `names`: each one's name in the reward parts."""
        if limit < 1:
            raise ValueError(f"reward.max_failing_steps must be at least 1, got {limit}")
        self.specs, self.names, self.limit = specs, names, limit
        self.in_a_row = [0] * len(names)

    def update(self, step: int, metrics: dict[str, Any]) -> None:
        """After a step whose metrics hold `reward/<name>/error` (the share of samples whose function failed)."""
        for i, name in enumerate(self.names):
            failed_everywhere = float(metrics.get(f"reward/{name}/error", 0.0)) >= 1.0 - 1e-9
            self.in_a_row[i] = self.in_a_row[i] + 1 if failed_everywhere else 0
            if self.in_a_row[i] >= self.limit:
                raise RunStopped(
                    f"step {step}: reward function {name!r} (reward.functions[{i}] = {self.specs[i]!r}) failed on "
                    f"every sample for {self.in_a_row[i]} steps in a row (reward.max_failing_steps={self.limit}); "
                    "its rewards were all zeros, so training would follow noise. Stopping: its error is in the "
                    "rollout workers' log ('reward function ... raised'); fix it or raise reward.max_failing_steps"
                )
