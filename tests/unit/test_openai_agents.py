"""Containment of agent programs (`env.agent`, `rollout/endpoint/agents.py`) with a real engine and the real
`openai` client: a hang, a crash or an exception costs its own trajectory; calls past the budget are refused with an
OpenAI-style error and the trajectory is scored on what it did; a returned number is the reward."""

import asyncio

import pytest

from agentrl_ray.config import EnvConfig, RewardConfig, RolloutConfig
from agentrl_ray.rewards import load_reward_functions
from agentrl_ray.rollout.endpoint.agents import AgentRunner
from agentrl_ray.rollout.endpoint.server import Endpoint
from agentrl_ray.rollout.torch_engine import TorchEngine
from agentrl_ray.types import RolloutTimings

CFG = RolloutConfig(backend="torch", max_turns=3, max_tokens_per_turn=48, max_total_tokens=320)
ROW = {"id": "q0", "prompt": "What is 347 * 29?", "answer": "10063"}


@pytest.fixture(scope="module")
def endpoint(builtin_model_path):
    from transformers import AutoTokenizer

    engine = TorchEngine(builtin_model_path, dtype="float32", seed=0, max_model_len=512, max_num_seqs=8)
    return Endpoint(engine, AutoTokenizer.from_pretrained(builtin_model_path), CFG, lambda: 0)


def test_agent_programs_are_contained(endpoint):
    behaviours = ["calculator"] * 4 + ["hangs", "crashes", "raises", "greedy", "rewarded"]
    rows = [{**ROW, "id": f"q{i}", "behaviour": b} for i, b in enumerate(behaviours)]
    keys = [f"{b}-{i}" for i, b in enumerate(behaviours)]
    funcs = load_reward_functions(["answer_match"])
    # The hang runs beside the others, under a deadline of its own: the others end by themselves and get a deadline
    # that a loaded 2-core machine cannot reach (a calculator's two calls once took over 8 s in CI beside the unit
    # tier's learner benchmark); the hang's deadline leaves its one 4-token call time to be answered.
    ends = AgentRunner(
        endpoint, EnvConfig(agent="data.agents_zoo:run", agent_timeout_s=120.0), CFG, RewardConfig(), funcs
    )
    hang = AgentRunner(
        endpoint, EnvConfig(agent="data.agents_zoo:run", agent_timeout_s=8.0), CFG, RewardConfig(), funcs
    )
    i = behaviours.index("hangs")
    others = [j for j in range(len(rows)) if j != i]

    async def all_at_once():  # one event loop (the endpoint serves on the loop it started on, as in the worker)
        await endpoint.start()
        return await asyncio.gather(
            ends.rollout([rows[j] for j in others], [keys[j] for j in others], 1.0, 0, 0, RolloutTimings()),
            hang.rollout([rows[i]], [keys[i]], 1.0, 0, 0, RolloutTimings()),
        )

    ended, hung = asyncio.run(all_at_once())
    got = {**dict(zip([keys[j] for j in others], ended)), keys[i]: hung[0]}
    good = [got[k] for k in keys if k.startswith("calculator")]
    assert all(t.finish_reason in ("answer", "max_turns") and t.num_action_tokens > 0 for t in good), [
        (t.finish_reason, t.num_action_tokens, t.completion_messages) for t in good
    ]
    assert any(m["role"] == "tool" for t in good for m in t.completion_messages)  # the transcript shows the loop
    # A hang (killed at its deadline), a crash and an exception cost their own trajectory only.
    for key in ("hangs-4", "crashes-5", "raises-6"):
        t = got[key]
        assert (t.finish_reason, t.reward, t.reward_parts.get("agent/error")) == ("error", 0.0, 1.0), key
        assert (t.num_action_tokens > 0) == (key == "hangs-4")  # the call it made before hanging is trained
    # Calls past rollout.max_turns are refused; the trajectory is scored on what it did.
    assert got["greedy-7"].finish_reason == "max_turns" and got["greedy-7"].num_steps == CFG.max_turns
    assert got["rewarded-8"].reward == 0.75 and got["rewarded-8"].reward_parts == {"agent": 0.75}
