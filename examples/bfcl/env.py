"""BFCLEnv: one BFCL single-turn task, judged in one assistant turn (a turn-based environment, the `step` contract of
`agentrl_ray.envs.base`, without tools of its own).

The functions the model may call are the row's own (its `tools` column, rendered in the prompt by the rollout);
nothing is executed: BFCL's AST check judges the calls as written. `reset(**row)` keeps the row, `step(text)`
returns (None, 1.0 or 0.0, True): the episode ends after the first turn, and since the environment defines neither
`reward` nor `get_reward`, its reward is that step's (what `reward.functions: [env_reward]` trains on).

It lives in this example, not in the package: `env.name: examples.bfcl.env:BFCLEnv` loads it by import path (run
from the repository root, or with `ray job submit --working-dir .`).
"""

from __future__ import annotations

from typing import Any

from agentrl_ray.tasks.bfcl.matcher import Verdict
from examples.bfcl.reward import judge_text


class BFCLEnv:
    """Rows carry `functions` (BFCL's docs), `ground_truth` and `category` (`agentrl_ray.tasks.bfcl.data`).
    After the step, `verdict` holds the matcher's verdict (valid, and the first reason when not)."""

    def __init__(self) -> None:
        self._row: dict[str, Any] = {}
        self.verdict: Verdict | None = None

    def reset(self, **row: Any) -> None:
        missing = [c for c in ("functions", "ground_truth", "category") if c not in row]
        if missing:
            raise ValueError(f"BFCLEnv: the row has no {missing} column (rows of agentrl_ray.tasks.bfcl.data have)")
        self._row, self.verdict = row, None
        return None

    def step(self, text: str) -> tuple[str | None, float, bool]:
        self.verdict = judge_text(text, self._row["functions"], self._row["ground_truth"], self._row["category"])
        return None, float(self.verdict.valid), True
