"""ActionTaskEnv: a task done by naming actions (`ACTION: open_door` lines), a turn-based environment without tools
(the `step` contract of `agentrl_ray.envs.base`). It succeeds when every required action was taken (in order, if the
row says so); the reward arrives on the step that completes the task. Every helper is private: a public method would
become a tool.

It lives in this example, not in the package: `env.name: examples.task_actions.env:ActionTaskEnv` in config.yaml
loads it by import path (run from the repository root, or with `ray job submit --working-dir .`). An environment of
your own works the same way, without editing the package.
"""

from __future__ import annotations

import re
from typing import Any

_ACTION = re.compile(r"^\s*ACTION:\s*(.+?)\s*$", re.IGNORECASE | re.MULTILINE)


class ActionTaskEnv:
    """Rows carry `required_actions`, optionally `actions` (all valid actions; default: the required ones) and
    `ordered` (the required actions must happen in that order). An assistant turn takes actions by writing lines
    `ACTION: <name>`; a turn without any ends the episode, as does `max_steps`. Reward 1.0 on success, else 0.0."""

    def __init__(self, max_steps: int = 8) -> None:
        if max_steps < 1:
            raise ValueError(f"max_steps must be at least 1, got {max_steps}")
        self.max_steps = max_steps
        self._required: list[str] = []
        self._valid: set[str] = set()
        self._ordered = False
        self._taken: list[str] = []
        self._steps = 0

    def reset(self, **row: Any) -> str:
        self._required = [a.strip() for a in row["required_actions"]]
        self._valid = {a.strip() for a in row.get("actions") or self._required}
        missing = [a for a in self._required if a not in self._valid]
        if missing:
            raise ValueError(f"ActionTaskEnv: required actions {missing} are not among the row's valid actions")
        self._ordered = bool(row.get("ordered", False))
        self._taken, self._steps = [], 0
        return f"\nValid actions: {', '.join(sorted(self._valid))}. Write one 'ACTION: <name>' line per action."

    def step(self, text: str) -> tuple[str | None, float, bool]:
        self._steps += 1
        actions = _ACTION.findall(text)
        if not actions:
            return None, 0.0, True  # the agent stopped acting: the task is judged as it stands (unfinished)
        notes = []
        for action in actions:
            if action in self._valid:
                self._taken.append(action)
                notes.append(f"done: {action}")
            else:
                notes.append(f"unknown action {action!r}")
        if self._succeeded():
            return "\n".join([*notes, "Task complete."]), 1.0, True
        if self._steps >= self.max_steps:
            return "\n".join([*notes, "Out of steps."]), 0.0, True
        return "\n".join(notes), 0.0, False

    def _succeeded(self) -> bool:
        if not self._ordered:
            return set(self._required) <= set(self._taken)
        taken = iter(self._taken)  # required actions as a subsequence of those taken
        return all(action in taken for action in self._required)
