"""Load reward functions by name and combine them into one reward per trajectory.

A reward function that raises, returns the wrong number of values or returns a non-number/NaN scores 0.0 for the
samples concerned, and the failure is reported twice: a log line naming the function, and `"<name>/error": 1.0` in
that sample's reward parts (averaged by the learner into an error rate). It never passes silently. `None` is TRL's
"does not apply to this sample": it scores 0.0 and shows as `"<name>/none": 1.0`.
"""

from __future__ import annotations

import asyncio
import inspect
import logging
import math
import numbers
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

from agentrl_ray.envs.loading import import_object
from agentrl_ray.rewards import builtin, measures

logger = logging.getLogger(__name__)

RewardFunc = Callable[..., list[float | None]]


@dataclass
class RewardState:
    """The part of TRL's `trainer_state` that reward functions read for shaping over training."""

    global_step: int


BUILTIN: dict[str, RewardFunc] = {
    "answer_match": builtin.answer_match,  # final answer equals the `answer` column
    "format": measures.format_reward,  # well-formed tool calls, ends with an answer (partial credit)
    "tool_success": builtin.tool_success,  # share of tool calls that succeeded
    "efficiency": builtin.efficiency,  # few tokens and tool calls (a tie-breaker: give it a small weight)
    "env_reward": builtin.env_reward,  # the environment's own verdict (its reward / get_reward)
}

# Dataset columns TRL withholds from reward functions (it passes the prompts as `prompts` instead).
_WITHHELD_COLUMNS = ("prompt", "completion", "completion_ids")


def load_reward_functions(names: list[str]) -> list[RewardFunc]:
    """Built-in names (see `BUILTIN`) or import paths "package.module:function"."""
    funcs = []
    for name in names:
        if name in BUILTIN:
            funcs.append(BUILTIN[name])
        elif ":" in name:
            fn = import_object(name, "reward function")
            if not callable(fn):
                raise TypeError(f"reward function {name!r} is not callable (got {type(fn).__name__})")
            funcs.append(fn)
        else:
            raise ValueError(
                f"unknown reward function {name!r}: use a built-in name ({', '.join(sorted(BUILTIN))}) "
                "or an import path 'package.module:function'"
            )
    return funcs


def reward_name(fn: RewardFunc) -> str:
    return getattr(fn, "__name__", type(fn).__name__)


def score(
    funcs: list[RewardFunc],
    weights: list[float],
    completions: list[Any],
    columns: dict[str, list],
    **extra: Any,
) -> tuple[list[float], list[dict[str, float]]]:
    """Weighted sum of the reward functions per sample, and each sample's parts {name: unweighted value, ...}.

    Functions are called as TRL calls them: `fn(prompts=..., completions=..., **columns, **extra)`.
    """
    n = len(completions)
    if len(weights) != len(funcs):
        raise ValueError(f"{len(funcs)} reward functions but {len(weights)} weights")
    for column, values in columns.items():
        if len(values) != n:
            raise ValueError(f"column {column!r} has {len(values)} values for {n} completions")
    clash = set(extra) & set(columns)
    if clash:
        raise ValueError(f"extra reward arguments {sorted(clash)} collide with dataset columns of the same name")
    kwargs = {k: v for k, v in columns.items() if k not in _WITHHELD_COLUMNS}
    kwargs.update(extra)
    prompts = columns.get("prompt")
    totals = [0.0] * n
    parts: list[dict[str, float]] = [{} for _ in range(n)]
    for fn, weight in zip(funcs, weights, strict=True):
        name = reward_name(fn)
        values, errors = _evaluate(fn, name, n, prompts=prompts, completions=completions, **kwargs)
        for i in range(n):
            value = values[i]
            parts[i][name] = 0.0 if value is None else value
            if errors[i]:
                parts[i][f"{name}/error"] = 1.0
            elif value is None:
                parts[i][f"{name}/none"] = 1.0
            else:
                totals[i] += weight * value
    return totals, parts


def _evaluate(fn: RewardFunc, name: str, n: int, **kwargs: Any) -> tuple[list[float | None], list[bool]]:
    """The function's values (None where it abstains or failed) and a per-sample failure flag."""
    try:
        out = fn(**kwargs)
        if inspect.isawaitable(out):
            out = _run_coroutine(out)
        out = list(out)
    except Exception as e:
        logger.warning("reward function %r raised %s: %s; scoring 0.0 for all %d samples", name, type(e).__name__, e, n)
        return [None] * n, [True] * n
    if len(out) != n:
        logger.warning("reward function %r returned %d values for %d samples; scoring 0.0", name, len(out), n)
        return [None] * n, [True] * n
    values: list[float | None] = []
    errors: list[bool] = []
    for v in out:
        ok = v is None or (isinstance(v, numbers.Real) and math.isfinite(v))  # numbers.Real admits numpy floats
        values.append(float(v) if ok and v is not None else None)
        errors.append(not ok)
    if any(errors):
        bad = [v for v, e in zip(out, errors) if e]
        logger.warning("reward function %r returned %d non-numeric or NaN/inf values, e.g. %r", name, len(bad), bad[0])
    return values, errors


def _run_coroutine(coro: Any) -> Any:
    # Async reward functions (LLM judges) are allowed, as in TRL. `score` may be called from inside a running event
    # loop (the rollout worker is an async actor), where asyncio.run is refused, so the coroutine gets its own loop.
    with ThreadPoolExecutor(max_workers=1) as pool:
        return pool.submit(asyncio.run, coro).result()
