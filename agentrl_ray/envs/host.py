"""EnvHost: holds the environment instances of many trajectories; the caller wraps it as a Ray actor. A game of
two players played by self-play is one instance for both its seats' trajectories (`envs.base`, `rollout/selfplay.py`).

    host = ray.remote(EnvHost).options(max_concurrency=1000).remote(tool_timeout_s=10.0, isolation="process")

Its methods are `async`, so Ray runs it as an async actor: one event loop serves every trajectory. The calls of one
trajectory run in order (a stateful env sees its tool calls as the model wrote them); different trajectories run
concurrently.

Where environment code runs is `isolation` (`env.isolation`; see `isolation.py` for what each level contains):
`thread` (objects in this process, sync calls on a bounded thread pool), `process` (a child process per
trajectory, killed at its deadline) or `sandbox` (that child under the sandbox's limits). Whatever an environment
does in its constructor, `reset`, a tool, `step`, its reward or `close` - raise any exception, time out, and at
`process`/`sandbox` also exit or crash - costs only its trajectory: an error observation (a failed start: every
later call of that trajectory answers with why; a failed reward: NaN, reported by the reward functions) and a
counter in `stats()`. Every call, the constructor and `reset` included, has the `tool_timeout_s` deadline.
"""

from __future__ import annotations

import asyncio
import logging
import math
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from agentrl_ray.chat_format import ToolCall
from agentrl_ray.envs.base import players
from agentrl_ray.envs.isolation.child import describe
from agentrl_ray.envs.isolation.levels import EnvError, EnvSetupError, Isolation, Level
from agentrl_ray.envs.isolation.sandbox import SandboxLimits
from agentrl_ray.envs.loading import env_class
from agentrl_ray.envs.tools import coerce_arguments, tool_methods

logger = logging.getLogger(__name__)


@dataclass
class ToolResult:
    text: str  # the observation shown to the policy
    error: bool = False


@dataclass
class TurnResult:
    """What a turn-based environment (one with `step`) answers to an assistant turn."""

    # The next user message (str); or tool results and user messages, in order (a list of {"role": "tool" | "user",
    # "content": str}); None when the environment has nothing to add.
    observation: str | list[dict[str, str]] | None
    reward: float
    done: bool
    error: bool = False
    # A game of two players (`envs.base`): the seat the observation is for (the one to move next), and once the
    # game is over each seat's reward.
    seat: int | None = None
    rewards: list[float] | None = None


@dataclass
class _Open:
    env: Any
    tools: dict[str, Callable]  # bound methods
    step_reward: float = 0.0  # sum of the rewards `step` returned so far
    steps: int = 0
    failed: str | None = None  # why the environment could not start: every call of the trajectory says so
    players: int = 1  # 2: a game, both seats' moves come to this one instance (envs.base)


class EnvHost:
    def __init__(
        self,
        tool_timeout_s: float = 10.0,
        max_output_chars: int = 2000,
        max_threads: int = 32,
        isolation: Level = "thread",
        sandbox: SandboxLimits | None = None,
    ) -> None:
        if tool_timeout_s <= 0:
            raise ValueError(f"tool_timeout_s must be positive, got {tool_timeout_s}")
        if max_output_chars <= 0:
            raise ValueError(f"max_output_chars must be positive, got {max_output_chars}")
        self.tool_timeout_s = tool_timeout_s
        self.max_output_chars = max_output_chars
        self._iso = Isolation(isolation, max_threads, max_output_chars, sandbox)
        self._open: dict[str, _Open] = {}
        self._counts: Counter[str] = Counter()

    # ---------------------------------------------------------------- lifecycle

    async def create(
        self, key: str, env_path: str, env_kwargs: dict, row: dict, tools: tuple[str, ...] = ()
    ) -> str | None:
        """Build the environment of trajectory `key` and reset it with `row`; returns the text reset() gave.
        `env_path` and `tools` are the config's `env.name` and `env.tools` (see `envs.loading.env_class`).

        A constructor or reset that fails or times out costs only this trajectory: it is opened as failed (None is
        returned, every later call answers with the error). A class that cannot be loaded raises: that is the
        config's error, not one trajectory's."""
        if key in self._open:
            raise ValueError(f"environment {key!r} is already open on this host; close it before reusing the key")
        cls = env_class(env_path, tuple(tools))
        env = None
        try:
            env = await self._iso.construct(cls, env_path, tuple(tools), env_kwargs, self.tool_timeout_s)
            text = await self._run(env.reset, row)
            if text is not None and not isinstance(text, str):
                raise TypeError(f"{cls.__name__}.reset() must return str or None, got {type(text).__name__}")
        except EnvSetupError:
            raise
        except Exception as e:
            why = f"timed out after {self.tool_timeout_s:g} s" if isinstance(e, TimeoutError) else _detail(e)
            self._counts["start_errors"] += 1
            logger.warning("environment %r could not start: %s", key, why)
            if env is not None:
                await self._close_env(env, key)
            self._open[key] = _Open(None, {}, failed=f"the environment could not start: {why}")
            return None
        self._open[key] = _Open(env, tool_methods(env), players=players(cls))
        self._counts["created"] += 1
        return text

    async def close(self, key: str) -> bool:
        """Close trajectory `key`'s environment; safe to repeat or for an unknown key. Returns whether it was open."""
        opened = self._open.pop(key, None)
        if opened is None:
            return False
        if opened.failed is None:
            await self._close_env(opened.env, key)
            self._counts["closed"] += 1
        return True

    async def _close_env(self, env: Any, key: str) -> None:
        close = getattr(env, "close", None)
        try:
            if close is not None:
                await self._run(close, {})
        except Exception as e:
            # A failing close must not fail the rollout that already finished; it is counted and logged instead.
            self._counts["close_errors"] += 1
            logger.warning("closing environment %r failed: %s", key, _detail(e))
        finally:
            await self._iso.release(env)

    def stats(self) -> dict[str, int]:
        """Counters since start: open instances, tool calls, turns, errors (incl. timeouts and parse errors), ..."""
        keys = (
            "created",
            "closed",
            "calls",
            "turns",
            "errors",
            "timeouts",
            "parse_errors",
            "close_errors",
            "reward_errors",
            "start_errors",
        )
        return {"open": len(self._open), **{k: self._counts[k] for k in keys}, **self._iso.stats()}

    # ---------------------------------------------------------------- tools

    async def call_tools(self, key: str, calls: list[ToolCall], parse_errors: list[str]) -> list[ToolResult]:
        """Run one turn's tool calls in order; then one error observation per malformed call."""
        opened = self._get(key)
        results = [await self._call_one(opened, call) for call in calls]
        for message in parse_errors:
            self._counts["parse_errors"] += 1
            results.append(self._error(f"could not parse tool call: {message}"))
        return results

    async def _call_one(self, opened: _Open, call: ToolCall) -> ToolResult:
        self._counts["calls"] += 1
        if opened.failed:
            return self._error(opened.failed)
        fn = opened.tools.get(call.name)
        if fn is None:
            available = ", ".join(sorted(opened.tools)) or "none"
            return self._error(f"unknown tool {call.name!r}; available tools: {available}")
        try:
            arguments = coerce_arguments(fn, call.arguments)
        except ValueError as e:
            return self._error(f"{call.name}: {e}")
        try:
            text = await self._run(fn, arguments, text=True)
        except TimeoutError:
            self._counts["timeouts"] += 1
            return self._error(f"{call.name} timed out after {self.tool_timeout_s:g} s")
        except Exception as e:
            return self._error(f"{call.name}: {_detail(e)}")
        return ToolResult(text, error=False)  # already cut to max_output_chars where it was made

    def _error(self, message: str) -> ToolResult:
        self._counts["errors"] += 1
        return ToolResult(self._truncate(f"Error: {message}"), error=True)

    def _truncate(self, text: str) -> str:
        if len(text) <= self.max_output_chars:
            return text
        return text[: self.max_output_chars] + f"\n[truncated {len(text) - self.max_output_chars} characters]"

    # ---------------------------------------------------------------- turns

    async def call_turn(self, key: str, assistant_text: str | None) -> TurnResult:
        """Feed one assistant turn to a turn-based environment's `step(text) -> (observation, reward, done)`; to
        a game's (`players = 2`) `step(text) -> (seat, observation, rewards)`, text None a forfeit (`envs.base`).

        A step that raises, times out or returns the wrong shape ends the episode with an error observation: the
        environment's state is unknown after that, so continuing would train on noise.
        """
        opened = self._get(key)
        if opened.failed:
            self._counts["turns"] += 1
            return self._turn_error(opened.failed)
        step = getattr(opened.env, "step", None)
        if step is None:
            name = type(opened.env).__name__
            raise TypeError(f"environment {key!r} ({name}) has no step(text): it is a tool environment, use call_tools")
        self._counts["turns"] += 1
        try:
            out = await self._run(step, {}, args=(assistant_text,))
            if opened.players > 1:
                seat, observation, rewards = _checked_move(out, opened.players)
            else:
                observation, reward, done = _checked_step(out)
        except TimeoutError:
            self._counts["timeouts"] += 1
            return self._turn_error(f"step timed out after {self.tool_timeout_s:g} s")
        except Exception as e:
            return self._turn_error(f"step failed: {_detail(e)}")
        if opened.players > 1:
            observation = None if observation is None else self._truncate(observation)
            return TurnResult(observation, 0.0, rewards is not None, seat=seat, rewards=rewards)
        opened.step_reward += reward
        opened.steps += 1
        if isinstance(observation, list):
            observation = [{"role": m["role"], "content": self._truncate(m["content"])} for m in observation]
        elif observation is not None:
            observation = self._truncate(observation)
        return TurnResult(observation, reward, done)

    def _turn_error(self, message: str) -> TurnResult:
        self._counts["errors"] += 1
        return TurnResult(self._truncate(f"Error: {message}"), 0.0, done=True, error=True)

    # ---------------------------------------------------------------- reward

    async def env_reward(self, key: str, completion: str) -> float | None:
        """The environment's own reward for trajectory `key`: its `reward(completion)` or `get_reward()`, else the sum
        of its step rewards for a turn-based environment; None when it has none, NaN when it failed."""
        opened = self._get(key)
        env = opened.env
        if opened.failed:
            self._counts["reward_errors"] += 1
            return math.nan
        if callable(getattr(env, "reward", None)):
            fn, arguments = env.reward, {"completion": completion}
        elif callable(getattr(env, "get_reward", None)):
            fn, arguments = env.get_reward, {}  # TRL's spelling: the env judges from its own state
        elif opened.steps:
            return opened.step_reward
        else:
            return None
        try:
            value = await self._run(fn, arguments)
            if value is None:
                return None
            if isinstance(value, bool) or not isinstance(value, int | float) or math.isnan(value):
                raise TypeError(f"must return a finite number or None, got {value!r}")
            return float(value)
        except Exception as e:
            # NaN, not an exception: the rollout survives and the reward functions report it as an error.
            self._counts["reward_errors"] += 1
            logger.warning("reward of environment %r failed: %s", key, _detail(e))
            return math.nan

    # ---------------------------------------------------------------- batched calls
    # One actor call per host for a whole batch of episodes instead of one per episode: a rollout worker makes a
    # handful of Ray calls per turn, not hundreds. Each entry runs exactly as the single call would, concurrently.

    async def create_many(
        self, env_path: str, env_kwargs: dict, items: list[tuple[str, dict]], tools: tuple[str, ...] = ()
    ) -> list[str | None]:
        """`create(key, env_path, env_kwargs, row, tools)` for each (key, row). If any fails, the ones that were
        created are closed and the first error is raised: a batch opens all its environments on this host or none."""
        creating = (self.create(key, env_path, env_kwargs, row, tools) for key, row in items)
        out = await asyncio.gather(*creating, return_exceptions=True)
        failed = [r for r in out if isinstance(r, BaseException)]
        if failed:
            await self.close_many([key for (key, _), r in zip(items, out) if not isinstance(r, BaseException)])
            raise failed[0]
        return out

    async def close_many(self, keys: list[str]) -> list[bool]:
        return list(await asyncio.gather(*(self.close(k) for k in keys)))

    async def call_tools_many(self, requests: list[tuple[str, list[ToolCall], list[str]]]) -> list[list[ToolResult]]:
        return list(await asyncio.gather(*(self.call_tools(*r) for r in requests)))

    async def call_turn_many(self, requests: list[tuple[str, str | None]]) -> list[TurnResult]:
        return list(await asyncio.gather(*(self.call_turn(*r) for r in requests)))

    async def env_reward_many(self, requests: list[tuple[str, str]]) -> list[float | None]:
        return list(await asyncio.gather(*(self.env_reward(*r) for r in requests)))

    # ---------------------------------------------------------------- helpers

    def _get(self, key: str) -> _Open:
        try:
            return self._open[key]
        except KeyError:
            raise KeyError(f"no open environment {key!r} on this host (create it first, or it was closed)") from None

    async def _run(self, fn: Callable, arguments: dict[str, Any], args: tuple = (), text: bool = False) -> Any:
        """Call `fn(*args, **arguments)` under the tool timeout, where the isolation level runs it; its value as
        tool text (cut to max_output_chars) when `text`."""
        return await self._iso.run(fn, args, arguments, self.tool_timeout_s, text)


def _detail(e: Exception) -> str:
    # ValueError is the conventional "bad input" signal of a tool, and an EnvError's message is already the whole
    # story: their message alone; anything else with its type. Never raises, even for an unprintable exception.
    if isinstance(e, ValueError | EnvError):
        detail = describe(e)
        return detail.removeprefix(f"{type(e).__name__}: ") if ": " in detail else detail
    return describe(e)


OBSERVATION_ROLES = ("tool", "user")


def _checked_step(out: Any) -> tuple[str | list[dict[str, str]] | None, float, bool]:
    if not (isinstance(out, tuple) and len(out) == 3):
        raise TypeError(f"step must return (observation, reward, done), got {out!r}")
    observation, reward, done = out
    if isinstance(observation, list):
        _check_observation_messages(observation)
    elif observation is not None and not isinstance(observation, str):
        raise TypeError(f"step observation must be str, a list of messages or None, got {type(observation).__name__}")
    if isinstance(reward, bool) or not isinstance(reward, int | float) or not math.isfinite(reward):
        raise TypeError(f"step reward must be a finite number, got {reward!r}")
    if not isinstance(done, bool):
        raise TypeError(f"step done must be a bool, got {type(done).__name__}")
    return observation, float(reward), done


def _checked_move(out: Any, players: int) -> tuple[int | None, str | None, list[float] | None]:
    """A game's answer to a move: (seat to move next, its observation, None), or (_, _, each seat's reward)."""
    if not (isinstance(out, tuple | list) and len(out) == 3):  # a list: a tuple that crossed from an env child
        raise TypeError(f"a game's step must return (seat, observation, rewards), got {out!r:.200}")
    seat, observation, rewards = out
    if rewards is not None:
        numbers = isinstance(rewards, list | tuple) and all(
            isinstance(r, int | float) and not isinstance(r, bool) and math.isfinite(r) for r in rewards
        )
        if not numbers or len(rewards) != players:
            raise TypeError(f"a game's rewards must be {players} finite numbers (one per seat), got {rewards!r:.200}")
        return None, None, [float(r) for r in rewards]
    if not isinstance(seat, int) or isinstance(seat, bool) or not 0 <= seat < players:
        raise TypeError(f"a game's step must name the seat to move next (0 to {players - 1}), got {seat!r}")
    if observation is not None and not isinstance(observation, str):
        raise TypeError(f"a game's observation must be str or None, got {type(observation).__name__}")
    return seat, observation, None


def _check_observation_messages(messages: list) -> None:
    """A step's observation as messages: each {"role": "tool" | "user", "content": str}, the tool results of the
    turn's calls first, in order, then at most one user message (the conversation's next question) last."""
    for i, m in enumerate(messages):
        if not isinstance(m, dict) or m.get("role") not in OBSERVATION_ROLES or not isinstance(m.get("content"), str):
            raise TypeError(
                f"step observation[{i}] must be {{'role': 'tool' | 'user', 'content': str}}, got {m!r:.200}"
            )
        if m["role"] == "user" and i != len(messages) - 1:
            raise TypeError(f"step observation[{i}]: a user message must come last (after the tool results)")
