"""Measures: per-sample checks that say whether a trajectory did something, how well, and why not.

A measure is `fn(completion, **sample) -> {"passed": bool, "score": float, "reason": str}`, where `sample` holds
this sample's value of every dataset column plus `prompt`, `stats` and `env_reward` (the singular of the batch
arguments). `score` in [0, 1] is partial credit (default: 1.0 if passed else 0.0); `reason` says what failed. The
older `(passed, reason)` tuple is still accepted. A measure is easier to write and to test than a batch reward
function, and the reason makes a failure readable:

    @measure_reward
    def cites_source(completion, source, **sample):
        text = final_answer_text(completion) or ""
        return {"passed": source in text, "reason": "" if source in text else f"answer does not mention {source!r}"}

`as_reward(m1, m2, ..., partial=True, pass_value=1.0, fail_value=0.0)` turns measures into one reward: each measure
earns 1 when it passes and, with `partial`, its score when it fails (0 without); the reward is `fail_value` plus
`(pass_value - fail_value)` times the mean credit, or with `partial=False` `pass_value` only when all pass.
`reward.explain(completion, **sample)` lists each measure's verdict, for debugging and for completion tables.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

from agentrl_ray.chat_format import extract_final_answer, parse_tool_calls
from agentrl_ray.rewards.builtin import Completion, count_tool_calls, final_answer_text, messages_of

Measure = Callable[..., dict[str, Any] | tuple[bool, str]]

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


def verdict(passed: bool, score: float | None = None, reason: str = "") -> dict[str, Any]:
    """A measure's result; `score` (partial credit in [0, 1]) defaults to 1.0 if passed else 0.0."""
    return {"passed": passed, "score": float(passed) if score is None else float(score), "reason": reason}


def _verdict(measure: Measure, completion: Completion, sample: dict[str, Any]) -> dict[str, Any]:
    result = measure(completion, **sample)
    name = getattr(measure, "__name__", repr(measure))
    if isinstance(result, tuple) and len(result) == 2 and isinstance(result[0], bool):
        return verdict(result[0], reason=str(result[1]))  # the older (passed, reason) form
    if not (isinstance(result, dict) and isinstance(result.get("passed"), bool)):
        raise TypeError(
            f"measure {name!r} must return {{'passed': bool, 'score': float, 'reason': str}}, got {result!r}"
        )
    out = verdict(result["passed"], result.get("score"), str(result.get("reason", "")))
    if not 0.0 <= out["score"] <= 1.0:
        raise ValueError(f"measure {name!r} returned score {out['score']!r}, outside [0, 1]")
    return out


def as_reward(
    *measures: Measure,
    name: str | None = None,
    partial: bool = True,
    pass_value: float = 1.0,
    fail_value: float = 0.0,
) -> Callable[..., list[float]]:
    """A TRL-signature reward from measures (see the module docstring for how credit adds up)."""
    if not measures:
        raise ValueError("as_reward needs at least one measure")

    def credit(v: dict[str, Any]) -> float:
        return 1.0 if v["passed"] else (v["score"] if partial else 0.0)

    def reward(completions: list[Completion], **kwargs: Any) -> list[float]:
        out = []
        for completion, sample in zip(completions, split_samples(len(completions), kwargs), strict=True):
            verdicts = [_verdict(m, completion, sample) for m in measures]
            if partial:
                share = sum(credit(v) for v in verdicts) / len(verdicts)
                out.append(fail_value + (pass_value - fail_value) * share)
            else:
                out.append(pass_value if all(v["passed"] for v in verdicts) else fail_value)
        return out

    def explain(completion: Completion, **sample: Any) -> list[dict[str, Any]]:
        return [{"measure": m.__name__, **_verdict(m, completion, sample)} for m in measures]

    reward.__name__ = name or "+".join(m.__name__ for m in measures)
    reward.explain = explain  # type: ignore[attr-defined]
    return reward


def measure_reward(measure: Measure) -> Callable[..., list[float]]:
    """Decorator: one measure as a reward function with the measure's name (its score is the partial credit)."""
    return functools.update_wrapper(as_reward(measure, name=measure.__name__), measure)


# ---------------------------------------------------------------- built-in measures


def no_malformed_tool_calls(completion: Completion, **sample: Any) -> dict[str, Any]:
    """Every tool-call block of every assistant turn parsed; score: the share of turns without a malformed one."""
    turns = [x for x in messages_of(completion) if x["role"] == "assistant"]
    bad = [(i, parse_tool_calls(m["content"] or "").errors) for i, m in enumerate(turns)]
    bad = [(i, errors) for i, errors in bad if errors]
    if not bad:
        return verdict(True)
    return verdict(False, 1 - len(bad) / len(turns), f"turn {bad[0][0]}: {bad[0][1][0]}")


def ends_with_answer(completion: Completion, stats: dict | None = None, **sample: Any) -> dict[str, Any]:
    """The last assistant turn is a non-empty final answer (no tool call), not cut off by the token limit."""
    if stats is not None and stats["finish_reason"] != "answer":
        return verdict(False, reason=f"episode ended by {stats['finish_reason']!r}, not by an answer")
    text = final_answer_text(completion)
    if text is None:
        return verdict(False, reason="the last assistant turn calls a tool instead of answering")
    if not text.strip():
        return verdict(False, reason="the final answer is empty")
    return verdict(True)


def answer_has_number(completion: Completion, **sample: Any) -> dict[str, Any]:
    """The final answer states a number."""
    text = final_answer_text(completion)
    if text is None or extract_final_answer(text) is None:
        return verdict(False, reason="no number in the final answer")
    return verdict(True)


def tool_calls_succeeded(completion: Completion, stats: dict | None = None, **sample: Any) -> dict[str, Any]:
    """No tool call of the episode failed (a sample without tool calls passes); score: the share that succeeded."""
    calls, errors = count_tool_calls(completion, stats)
    if errors == 0:
        return verdict(True)
    return verdict(False, (calls - errors) / calls if calls else 0.0, f"{errors} of {calls} tool calls failed")


format_reward = as_reward(no_malformed_tool_calls, ends_with_answer, name="format", partial=True)
