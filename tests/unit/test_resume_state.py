"""What a checkpoint carries for a bit-identical resume (agentrl_ray/learner/resume_state.py): RNG states and the
batch sampled for the next step, both through a real `torch.save` / `torch.load(weights_only=True)`."""

from __future__ import annotations

import random

import numpy as np
import torch

from agentrl_ray.learner.resume_state import batch_state, batches_from_state, rng_state, set_rng_state
from agentrl_ray.types import RolloutTimings, Trajectory, TrajectoryGroup


def _round_trip(obj, tmp_path):
    torch.save(obj, tmp_path / "state.pt")
    return torch.load(tmp_path / "state.pt", weights_only=True)  # what Policy.load does: no code runs on load


def test_rng_states_continue_where_they_were(tmp_path):
    random.seed(1), np.random.seed(2), torch.manual_seed(3)
    random.random(), np.random.normal(), torch.rand(3)  # somewhere mid-stream, numpy with a cached gaussian
    saved = _round_trip(rng_state(), tmp_path)
    expected = (random.random(), np.random.normal(), torch.rand(3))
    random.seed(9), np.random.seed(9), torch.manual_seed(9)
    set_rng_state(saved)
    again = (random.random(), np.random.normal(), torch.rand(3))
    assert again[:2] == expected[:2] and torch.equal(again[2], expected[2])


def _trajectory(i: int) -> Trajectory:
    return Trajectory(
        prompt_id="p7",
        sample_index=i,
        token_ids=[1, 2, 3, 4],
        action_mask=[0, 0, 1, 0],
        env_mask=[0, 0, 0, 1],
        template_mask=[0, 0, 0, 0],
        rollout_logprobs=[0.0, 0.0, -0.123456789012345, 0.0],
        reward=0.5 * i,
        policy_version=3,
        finish_reason="answer",
        prompt_len=2,
        reward_parts={"answer_match": 1.0},
        num_tool_calls=1,
        completion_messages=[
            {"role": "assistant", "content": "x", "tool_calls": [{"name": "add", "arguments": {"a": 1, "b": 2.5}}]}
        ],
    )


def test_the_sampled_batch_comes_back_equal(tmp_path):
    ready = {4: ([TrajectoryGroup("p7", [_trajectory(0), _trajectory(1)])], RolloutTimings(generate_s=1.5))}
    back = batches_from_state(_round_trip(batch_state(ready), tmp_path))
    assert back == ready  # dataclass equality: every token, mask, logprob (exact floats) and message
    assert batches_from_state(_round_trip(batch_state({}), tmp_path)) == {}
