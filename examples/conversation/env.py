"""ScriptedUserEnv: a conversation with a scripted user, a turn-based environment without tools (the `step` contract
of `agentrl_ray.envs.base`). Each assistant turn is checked against what it should contain; the user's next scripted
message is the observation. Every helper is private: a public method would become a tool.

It lives in this example, not in the package: `env.name: examples.conversation.env:ScriptedUserEnv` in config.yaml
loads it by import path (run from the repository root, or with `ray job submit --working-dir .`). An environment of
your own works the same way, without editing the package.
"""

from __future__ import annotations

from typing import Any


class ScriptedUserEnv:
    """Rows carry `expected`: per assistant turn, a string the reply must contain (None: anything goes), and
    `user_turns`: the user's follow-ups, one after each assistant turn but the last. Step reward: 1/len(expected)
    per reply that contains its expected string, so the episode's reward is the share of turns handled."""

    def __init__(self, case_sensitive: bool = False) -> None:
        self.case_sensitive = case_sensitive
        self._expected: list[str | None] = []
        self._user_turns: list[str] = []
        self._turn = 0

    def reset(self, **row: Any) -> None:
        expected, user_turns = list(row["expected"]), list(row.get("user_turns", []))
        if not expected:
            raise ValueError("ScriptedUserEnv: the row's `expected` list is empty; the conversation needs a turn")
        if len(user_turns) != len(expected) - 1:
            raise ValueError(
                f"ScriptedUserEnv: {len(expected)} expected assistant turns need {len(expected) - 1} user follow-ups "
                f"between them, the row has {len(user_turns)}"
            )
        self._expected, self._user_turns, self._turn = expected, user_turns, 0
        return None

    def step(self, text: str) -> tuple[str | None, float, bool]:
        if self._turn >= len(self._expected):
            raise RuntimeError("ScriptedUserEnv: step after the conversation ended")
        want = self._expected[self._turn]
        reward = 1.0 / len(self._expected) if want is None or self._contains(text, want) else 0.0
        self._turn += 1
        done = self._turn == len(self._expected)
        return (None if done else self._user_turns[self._turn - 1]), reward, done

    def _contains(self, text: str, want: str) -> bool:
        return want in text if self.case_sensitive else want.lower() in text.lower()
