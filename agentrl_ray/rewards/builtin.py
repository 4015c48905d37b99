"""Built-in reward functions, in TRL's signature: `fn(completions, **kwargs) -> list[float]`.

`completions` holds one completion per sample in TRL's conversational format, a list of messages
`{"role": "assistant" | "tool", "content": str}` (a plain string is read as a single assistant message);
kwargs carry the dataset columns (one value per sample), `trajectories` and `env_rewards`.
"""

from __future__ import annotations

import math
from typing import Any

from agentrl_ray.rollout.tool_parser import extract_final_answer, parse_tool_calls

Completion = list[dict[str, Any]] | str


def messages_of(completion: Completion) -> list[dict[str, Any]]:
    return [{"role": "assistant", "content": completion}] if isinstance(completion, str) else completion


def final_answer_text(completion: Completion) -> str | None:
    """The last assistant message, if it is a final answer (no tool calls in it); else None."""
    assistant = [m for m in messages_of(completion) if m["role"] == "assistant"]
    if not assistant:
        return None
    parsed = parse_tool_calls(assistant[-1]["content"] or "")
    # A last turn that still asks for a tool was cut off (turn or token limit): it answers nothing.
    if parsed.calls or parsed.errors:
        return None
    return parsed.content


def numbers_match(predicted: str | None, expected: Any, rel_tol: float = 1e-6) -> bool:
    """Numeric equality within `rel_tol` relative tolerance; unparsable values never match."""
    if predicted is None or expected is None:
        return False
    try:
        a, b = float(predicted), float(str(expected).replace(",", ""))
    except ValueError:
        return False
    return math.isfinite(a) and math.isfinite(b) and math.isclose(a, b, rel_tol=rel_tol, abs_tol=1e-12)


def answer_match(completions: list[Completion], answer: list[Any], **kwargs: Any) -> list[float]:
    """1.0 when the last number of the final answer equals the `answer` column (relative tolerance 1e-6), else 0.0."""
    out = []
    for completion, expected in zip(completions, answer, strict=True):
        text = final_answer_text(completion)
        out.append(float(numbers_match(extract_final_answer(text) if text else None, expected)))
    return out
