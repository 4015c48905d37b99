"""BFCLEnv: one BFCL single-turn task, judged in one assistant turn (a turn-based environment, the `step` contract of
`agentrl_ray.envs.base`, without tools of its own).

The functions the model may call are the row's own (its `tools` column, rendered in the prompt by the rollout);
nothing is executed: BFCL's AST check judges the calls as written. `reset(**row)` keeps the row, `step(text)`
returns (None, 1.0 or 0.0, True): the episode ends after the first turn, and since the environment defines neither
`reward` nor `get_reward`, its reward is that step's (what `reward.functions: [env_reward]` trains on). With
`env.kwargs: {reward: partial}` a wrong answer earns the matcher's partial credit instead of 0 (below 0.5: the right
function, some of its arguments; `matcher.credit`), so that a group whose samples are all wrong still ranks them;
held-out success (reward >= 1.0) is BFCL's verdict either way.

It lives in this example, not in the package: `env.name: examples.bfcl.env:BFCLEnv` loads it by import path (run
from the repository root, or with `ray job submit --working-dir .`).
"""

from __future__ import annotations

from typing import Any

from agentrl_ray.tasks.bfcl.matcher import Verdict
from examples.bfcl.reward import credit_text, judge_text

REWARDS = ("verdict", "partial")


class BFCLEnv:
    """Rows carry `functions` (BFCL's docs), `ground_truth` and `category` (`agentrl_ray.tasks.bfcl.data`).
    After the step, `verdict` holds the matcher's verdict (valid, and the first reason when not)."""

    def __init__(self, reward: str = "verdict") -> None:
        if reward not in REWARDS:
            raise ValueError(f"BFCLEnv reward must be one of {REWARDS}, got {reward!r}")
        self.reward_mode = reward
        self._row: dict[str, Any] = {}
        self.verdict: Verdict | None = None

    def reset(self, **row: Any) -> None:
        missing = [c for c in ("functions", "ground_truth", "category") if c not in row]
        if missing:
            raise ValueError(f"BFCLEnv: the row has no {missing} column (rows of agentrl_ray.tasks.bfcl.data have)")
        self._row, self.verdict = row, None
        return None

    def step(self, text: str) -> tuple[str | None, float, bool]:
        row = self._row
        self.verdict = judge_text(text, row["functions"], row["ground_truth"], row["category"])
        if self.verdict.valid or self.reward_mode == "verdict":
            return None, float(self.verdict.valid), True
        return None, credit_text(text, row["functions"], row["ground_truth"], row["category"]), True
