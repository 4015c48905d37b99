"""The gsm_tools reward: reasoning-gym's own `score_answer` on the final answer, thresholded to 0/1.

    reward:
      functions: [examples.gsm_tools.reward:rg_score]

The final answer is read as `answer_match` reads it: the last number of the last assistant message, when that
message calls no tool. It lives here rather than in agentrl_ray/tasks/gsm.py because tasks are the package's bottom
layer, which may not import the answer extraction (chat_format, rewards: tests/unit/test_layers.py).
"""

from __future__ import annotations

from typing import Any

from agentrl_ray.chat_format import extract_final_answer
from agentrl_ray.rewards.builtin import final_answer_text
from agentrl_ray.tasks.gsm import threshold_score


def rg_score(completions: list[Any], rg_entry: list[str], **kwargs: Any) -> list[float | None]:
    """1.0 when reasoning-gym scores the final answer 1.0 for the row's entry (the `rg_entry` column), else 0.0.

    A completion that is not a conversation, or has no final answer, scores 0.0. A row whose `rg_entry` cannot be
    read scores None (TRL's "does not apply"): 0.0 in the total, and counted as `rg_score/none` in the metrics.
    """
    return [_score(completion, entry) for completion, entry in zip(completions, rg_entry, strict=True)]


def _score(completion: Any, rg_entry: Any) -> float | None:
    try:
        text = final_answer_text(completion)
    except (KeyError, TypeError, AttributeError):  # not a string or a list of chat messages
        text = None
    answer = extract_final_answer(text) if isinstance(text, str) else None
    try:
        return threshold_score(answer, rg_entry)
    except (ValueError, KeyError, TypeError):  # not the JSON of an entry, or of an unknown dataset
        return None
