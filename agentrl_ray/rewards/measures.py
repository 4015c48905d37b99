"""Measures: per-sample checks that say whether a trajectory did something, and why not.

A measure is `fn(completion, **sample) -> (passed: bool, reason: str)`, where `sample` holds this sample's value
of every dataset column plus `prompt`, `stats` and `env_reward` (the singular of the batch arguments). It is
easier to write and to test than a batch reward function, and the reason makes a failure readable:

    @measure_reward
    def cites_source(completion, source, **sample):
        text = final_answer_text(completion) or ""
        return source in text, "" if source in text else f"answer does not mention {source!r}"

`as_reward(m1, m2, ..., partial=True)` turns several measures into one reward: the fraction passed (partial
credit) or, with `partial=False`, 1.0 only when all pass. `reward.explain(completion, **sample)` lists each
measure's verdict and reason, for debugging and for completion tables.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

from agentrl_ray.chat_format import extract_final_answer, parse_tool_calls
from agentrl_ray.rewards.builtin import Completion, count_tool_calls, final_answer_text, messages_of

Measure = Callable[..., tuple[bool, str]]

# Batch arguments whose per-sample value is passed to a measure under its singular name.
_SINGULAR = {"prompts": "prompt", "episode_stats": "stats", "env_rewards": "env_reward"}


def split_samples(n: int, kwargs: dict[str, Any]) -> list[dict[str, Any]]:
    """Per-sample keyword arguments from batch ones: lists of length n are split, anything else is shared."""
    rows: list[dict[str, Any]] = [{} for _ in range(n)]
    for key, value in kwargs.items():
        if isinstance(value, list | tuple) and len(value) == n:
            for row, v in zip(rows, value):
                row[_SINGULAR.get(key, key)] = v
        else:
            for row in rows:
                row[key] = value  # TRL's trainer_state, log_metric, ...
    return rows


def _verdict(measure: Measure, completion: Completion, sample: dict[str, Any]) -> tuple[bool, str]:
    result = measure(completion, **sample)
    if not (isinstance(result, tuple) and len(result) == 2 and isinstance(result[0], bool)):
        name = getattr(measure, "__name__", repr(measure))
        raise TypeError(f"measure {name!r} must return (passed: bool, reason: str), got {result!r}")
    return result


def as_reward(*measures: Measure, name: str | None = None, partial: bool = True) -> Callable[..., list[float]]:
    """A TRL-signature reward from measures: fraction passed (`partial`) or 1.0 only if all pass."""
    if not measures:
        raise ValueError("as_reward needs at least one measure")

    def reward(completions: list[Completion], **kwargs: Any) -> list[float]:
        out = []
        for completion, sample in zip(completions, split_samples(len(completions), kwargs), strict=True):
            passed = sum(_verdict(m, completion, sample)[0] for m in measures)
            out.append(passed / len(measures) if partial else float(passed == len(measures)))
        return out

    def explain(completion: Completion, **sample: Any) -> list[tuple[str, bool, str]]:
        return [(m.__name__, *_verdict(m, completion, sample)) for m in measures]

    reward.__name__ = name or "+".join(m.__name__ for m in measures)
    reward.explain = explain  # type: ignore[attr-defined]
    return reward


def measure_reward(measure: Measure) -> Callable[..., list[float]]:
    """Decorator: one measure as a 1/0 reward function with the measure's name."""
    return functools.update_wrapper(as_reward(measure, name=measure.__name__), measure)


# ---------------------------------------------------------------- built-in measures


def no_malformed_tool_calls(completion: Completion, **sample: Any) -> tuple[bool, str]:
    """Every `<tool_call>` block of every assistant turn parsed."""
    for turn, m in enumerate(x for x in messages_of(completion) if x["role"] == "assistant"):
        errors = parse_tool_calls(m["content"] or "").errors
        if errors:
            return False, f"turn {turn}: {errors[0]}"
    return True, ""


def ends_with_answer(completion: Completion, stats: dict | None = None, **sample: Any) -> tuple[bool, str]:
    """The last assistant turn is a non-empty final answer (no tool call), not cut off by the token limit."""
    if stats is not None and stats["finish_reason"] != "answer":
        return False, f"episode ended by {stats['finish_reason']!r}, not by an answer"
    text = final_answer_text(completion)
    if text is None:
        return False, "the last assistant turn calls a tool instead of answering"
    if not text.strip():
        return False, "the final answer is empty"
    return True, ""


def answer_has_number(completion: Completion, **sample: Any) -> tuple[bool, str]:
    """The final answer states a number."""
    text = final_answer_text(completion)
    if text is None or extract_final_answer(text) is None:
        return False, "no number in the final answer"
    return True, ""


def tool_calls_succeeded(completion: Completion, stats: dict | None = None, **sample: Any) -> tuple[bool, str]:
    """No tool call of the episode failed (a sample without tool calls passes)."""
    calls, errors = count_tool_calls(completion, stats)
    return errors == 0, "" if errors == 0 else f"{errors} of {calls} tool calls failed"


format_reward = as_reward(no_malformed_tool_calls, ends_with_answer, name="format", partial=True)
