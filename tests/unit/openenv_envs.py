"""Two environments written against OpenEnv's own API (openenv 0.10.0 ships none), as a user would write them;
tests/unit/test_openenv.py trains against them unchanged.

- `GuessEnv`: an `Environment[GuessAction, GuessObservation, State]`: guess a number in 1..10; each observation
  says higher or lower; the right guess pays 1.0 and ends the episode.
- `ArithmeticEnv`: an `MCPEnvironment` whose FastMCP server serves `add` and `submit`; `submit(answer)` ends the
  episode with reward 1.0 when the answer is the sum asked for at reset, else 0.0.
"""

from __future__ import annotations

import random
from typing import Any

from fastmcp import FastMCP
from openenv.core.env_server.interfaces import Environment
from openenv.core.env_server.mcp_environment import MCPEnvironment
from openenv.core.env_server.types import Action, Observation, State
from pydantic import Field


class GuessAction(Action):
    guess: str = Field(description="the guessed number, as text")


class GuessObservation(Observation):
    message: str = ""


class GuessEnv(Environment[GuessAction, GuessObservation, State]):
    def __init__(self, high: int = 10) -> None:
        super().__init__()
        self.high = high
        self.target = 1
        self._state = State(episode_id=None, step_count=0)

    def reset(self, seed: int | None = None, episode_id: str | None = None, **kwargs: Any) -> GuessObservation:
        self.target = random.Random(seed).randint(1, self.high)
        self._state = State(episode_id=episode_id, step_count=0)
        return GuessObservation(message=f"Guess a number in 1..{self.high}: reply with the number only.")

    def step(self, action: GuessAction, timeout_s: float | None = None, **kwargs: Any) -> GuessObservation:
        self._state.step_count += 1
        text = action.guess.strip()
        guess = int(text) if text.isdigit() else None
        if guess == self.target:
            return GuessObservation(message="Right.", done=True, reward=1.0)
        hint = "not a number" if guess is None else ("higher" if guess < self.target else "lower")
        return GuessObservation(message=hint, done=False, reward=0.0)

    @property
    def state(self) -> State:
        return self._state


class ArithmeticEnv(MCPEnvironment):
    def __init__(self) -> None:
        mcp = FastMCP("arithmetic")
        self.a = self.b = 0

        @mcp.tool()
        def add(x: int, y: int) -> int:
            """Add two integers.

            Args:
                x: the first
                y: the second
            """
            return x + y

        @mcp.tool()
        def submit(answer: int) -> str:
            """Submit the final answer."""
            return "submitted"

        super().__init__(mcp)
        self._state = State(episode_id=None, step_count=0)

    def reset(self, seed: int | None = None, episode_id: str | None = None, **kwargs: Any) -> Observation:
        rng = random.Random(seed)
        self.a, self.b = rng.randint(100, 999), rng.randint(100, 999)
        self._state = State(episode_id=episode_id, step_count=0)
        return Observation(metadata={"task": f"What is {self.a} + {self.b}? Use the tools, then submit."})

    def step(self, action: Action, timeout_s: float | None = None, **kwargs: Any) -> Observation:
        return self._scored(action, super().step(action, timeout_s=timeout_s, **kwargs))

    async def step_async(self, action: Action, timeout_s: float | None = None, **kwargs: Any) -> Observation:
        # What OpenEnv's server calls: a served MCPEnvironment sets its rewards here.
        return self._scored(action, await super().step_async(action, timeout_s=timeout_s, **kwargs))

    def _scored(self, action: Action, observation: Observation) -> Observation:
        self._state.step_count += 1
        if getattr(action, "tool_name", None) == "submit":  # the episode's end and its reward
            observation.done = True
            observation.reward = 1.0 if action.arguments.get("answer") == self.a + self.b else 0.0
        return observation

    def _step_impl(self, action: Action, timeout_s: float | None = None, **kwargs: Any) -> Observation:
        return Observation(metadata={"error": f"unknown action {type(action).__name__}"})

    @property
    def state(self) -> State:
        return self._state
