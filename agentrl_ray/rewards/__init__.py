"""Reward functions (TRL's signature) and their weighted combination; see `scoring` for failure handling."""

from agentrl_ray.rewards.builtin import answer_match, final_answer_text, numbers_match
from agentrl_ray.rewards.scoring import BUILTIN, RewardFunc, load_reward_functions, reward_name, score

__all__ = [
    "BUILTIN",
    "RewardFunc",
    "answer_match",
    "final_answer_text",
    "load_reward_functions",
    "numbers_match",
    "reward_name",
    "score",
]
