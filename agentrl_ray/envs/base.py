"""The environment contract: a plain Python class whose public methods are the agent's tools.

It is the contract of TRL's `GRPOTrainer(environment_factory=...)`, so an environment written for TRL runs here
unchanged:

- `__init__(**env.kwargs)`: built once per trajectory (on an env actor), with the config's `env.kwargs`.
- `reset(self, **row) -> str | None`: receives the dataset row (every column as a keyword). Text it returns is
  appended to the last user message of the prompt.
- Every public method (a name not starting with `_`) that is not a reserved name below is a tool. Its JSON schema
  (what the model sees in the system prompt) comes from the type hints and the docstring (Google, NumPy or Sphinx
  style). A tool returns a string (other values are JSON-encoded) or raises; a raised error becomes an
  "Error: ..." observation for the policy and a tool-error metric, it never ends the rollout. Tools may be
  `async def`.
- Reserved, never tools: `reset`, `close` (optional cleanup, called once when the trajectory ends), `get_reward`
  (optional, TRL's spelling: `get_reward(self) -> float | None` from the env's own state) or `reward` (optional,
  ours: `reward(self, completion: str) -> float | None`, given the final assistant message), and `step`.
- Turn-based environments (a user simulator, a text game) define `step(self, text: str) -> (observation: str |
  None, reward: float, done: bool)` instead of tools: `text` is the assistant's whole turn, `observation` becomes
  the next user message, the episode ends at `done`, and unless the env defines `reward`/`get_reward` its reward
  is the sum of its step rewards. The env host serves them through `call_turn`.
- A turn-based environment that runs tools itself (a multi-turn benchmark whose user asks again after the
  assistant answers: `examples/bfcl/multi_turn.py`) returns its observation as messages instead of a string: a list
  of `{"role": "tool", "content": ...}`, one per call of the turn, in order, then at most one
  `{"role": "user", "content": ...}` (the next question), last. Tool results are rendered as the template renders
  tool messages (and are environment tokens, ECHO's target), the user message as a user turn.
- A game of two players, both played by the policy (self-play, `rollout/selfplay.py`), says so on its class:
  `players = 2`. One instance is one game, reset with the row; each seat's turns are a trajectory of their own.
  `reset(**row)` returns seat 0's first observation (seat 0 moves first). `step(text) -> (seat, observation,
  rewards)`: `text` is the move of the seat to move; while the game goes on, `seat` is the one to move next (the
  same one after a move it may retry) and `observation` what that seat sees before its move (its first one is
  appended to its prompt, later ones are user turns), `rewards` None; once the game is over, `rewards` holds each
  seat's reward (its trajectory's). `step(None)`: the seat to move cannot move (its token budget or its turns ran
  out) and forfeits: the game must end and score it.

Environments are found by import path ("package.module:Class"), so users add one without editing this package
(`loading.py`). The tools' JSON schemas and the coercion of the model's arguments are in `tools.py`; how the env host
runs environment code (threads, child processes, a sandbox) in `isolation/`; the built-in environments in
`builtin/`. Inheriting from `Environment` is optional; it only documents the contract.
"""

from __future__ import annotations

from typing import Any

RESERVED_METHODS = frozenset({"reset", "close", "reward", "get_reward", "step"})


def players(cls: type) -> int:
    """The seats of an environment class: 1, or 2 for a game of two players (its `players`)."""
    n = getattr(cls, "players", 1)
    if n not in (1, 2) or isinstance(n, bool):
        raise ValueError(f"{cls.__name__}.players must be 1 or 2 (self-play of more seats is not adapted), got {n!r}")
    if n == 2 and not callable(getattr(cls, "step", None)):
        raise ValueError(f"{cls.__name__} is a game of two players without step(text): a game is turn-based")
    return n


class Environment:
    """Optional base class. Subclasses add tools as typed, documented public methods."""

    def reset(self, **row: Any) -> str | None:
        """Start a trajectory for dataset row `row`; returned text is appended to the prompt."""
        return None

    def close(self) -> None:
        """Release what the environment holds (processes, files). Called once per trajectory."""
