"""A weight sync that leaves one tensor out, for tests/ray/test_user_code_in_runs.py's integrity run. Imported by
every process that loads the run's reward functions (the rollout workers among them: Ray puts the repository root
on their sys.path), it wraps the vLLM engine's `load_weights` so that the tensor named by AGENTRL_TEST_SKIP_TENSOR
never arrives; the reward is the built-in answer_match."""

import os

from agentrl_ray.rewards.builtin import answer_match
from agentrl_ray.rollout.vllm_engine import VLLMEngine

_load = VLLMEngine.load_weights


def _load_but_one(self, named_tensors):
    skip = os.environ.get("AGENTRL_TEST_SKIP_TENSOR")
    return _load(self, ((name, t) for name, t in named_tensors if name != skip))


VLLMEngine.load_weights = _load_but_one
answer_match_after_a_partial_sync = answer_match
