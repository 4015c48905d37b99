"""Reward functions (TRL's signature), measures turned into rewards, and their weighted combination.

See `scoring` for how failures are reported and `measures` for per-sample `{passed, score, reason}` checks.
"""

from agentrl_ray.rewards.builtin import (
    answer_match,
    count_tool_calls,
    efficiency,
    efficiency_reward,
    env_reward,
    final_answer_text,
    numbers_match,
    tool_success,
)
from agentrl_ray.rewards.measures import (
    answer_has_number,
    as_reward,
    ends_with_answer,
    format_reward,
    measure_reward,
    no_malformed_tool_calls,
    split_samples,
    tool_calls_succeeded,
    verdict,
)
from agentrl_ray.rewards.scoring import BUILTIN, RewardFunc, load_reward_functions, reward_name, score

__all__ = [
    "BUILTIN",
    "RewardFunc",
    "answer_has_number",
    "answer_match",
    "as_reward",
    "count_tool_calls",
    "efficiency",
    "efficiency_reward",
    "ends_with_answer",
    "env_reward",
    "final_answer_text",
    "format_reward",
    "load_reward_functions",
    "measure_reward",
    "no_malformed_tool_calls",
    "numbers_match",
    "reward_name",
    "score",
    "split_samples",
    "tool_calls_succeeded",
    "tool_success",
    "verdict",
]
