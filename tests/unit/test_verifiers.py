"""verifiers environments, unchanged (agentrl_ray/envs/adapters/verifiers.py): a ToolEnv and a SingleTurnEnv written
against verifiers' classic API (tests/unit/verifiers_envs.py) run their own rollout loop as agent programs against
the real endpoint: their rows from the environment's dataset, their rubric's reward and components the trajectory's.
The tool path is shown with an engine that answers as a perfect agent would (deterministic), the sampling path with
the real torch engine and the built-in calculator model."""

import asyncio
import json
import re

import pytest
from verifiers_envs import calculator

from agentrl_ray.config import DataConfig, EnvConfig, RewardConfig, RolloutConfig
from agentrl_ray.data import load_rows
from agentrl_ray.rewards import load_reward_functions
from agentrl_ray.rollout.endpoint.agents import AgentRunner
from agentrl_ray.rollout.endpoint.server import Endpoint
from agentrl_ray.rollout.engine import Generation
from agentrl_ray.rollout.torch_engine import TorchEngine
from agentrl_ray.types import RolloutTimings

CFG = RolloutConfig(backend="torch", max_turns=3, max_tokens_per_turn=48, max_total_tokens=512)
AGENT = "agentrl_ray.envs.adapters.verifiers:run"
TOOL_ENV = "verifiers:verifiers_envs:load_environment"
pytestmark = pytest.mark.slow  # each test starts an endpoint and agent processes (15-40 s)


@pytest.fixture(scope="module")
def tok(builtin_model_path):
    from agentrl_ray.builtin.tokenizer import load_tokenizer

    return load_tokenizer(builtin_model_path)


class PerfectAgent:
    """An engine that calls the calculator on the question, then states the tool's result (or, for 125 * 8, a wrong
    number): what a policy that learned the task would sample, as ids of the real tokenizer."""

    def __init__(self, tok):
        self.tok = tok

    def generate(self, prompts, max_tokens, **_):
        out = []
        for ids in prompts:
            text = self.tok.decode(ids)
            results = re.findall(r"<tool_response>\n(.*?)\n</tool_response>", text)
            question = re.findall(r"What is (.*?)\?", text)[-1]
            if results or "# Tools" not in text:  # a tool's result to state, or no tool to call: the answer
                answer = "999" if question == "125 * 8" else (results[-1] if results else calculator(question))
                reply = f"The answer is {answer}."
            else:
                call = {"name": "calculator", "arguments": {"expression": question}}
                reply = f"<tool_call>\n{json.dumps(call)}\n</tool_call>"
            reply_ids = self.tok.encode(reply + "<|im_end|>", add_special_tokens=False)
            out.append(Generation(reply_ids, [-0.5] * len(reply_ids), "stop"))
        return out


def rollout(engine, tok, rows):
    endpoint = Endpoint(engine, tok, CFG, lambda: 0)
    runner = AgentRunner(
        endpoint,
        EnvConfig(agent=AGENT, agent_timeout_s=120.0),
        CFG,
        RewardConfig(),
        load_reward_functions(["answer_match"]),
    )

    async def go():  # the endpoint serves on the event loop it starts on
        await endpoint.start()
        return await runner.rollout(rows, [f"k{i}" for i in range(len(rows))], 1.0, 0, 0, RolloutTimings())

    return asyncio.run(go())


def test_the_rows_are_the_environments_dataset():
    rows = load_rows(TOOL_ENV, DataConfig(), split="train", size=10)
    assert [r["answer"] for r in rows] == ["10063", "717", "982", "1000"]
    assert rows[0]["prompt"] == [{"role": "user", "content": "What is 347 * 29?"}]
    assert {r["verifiers_env"] for r in rows} == {"verifiers_envs:load_environment"}
    assert len({r["id"] for r in rows}) == 4


def test_a_tool_envs_own_loop_runs_its_tool_and_its_rubric_is_the_reward(tok):
    rows = load_rows(TOOL_ENV, DataConfig(), split="train", size=4)
    trajectories = rollout(PerfectAgent(tok), tok, rows)
    for row, t in zip(rows, trajectories, strict=True):
        right = row["answer"] != "1000"  # the engine states a wrong number for 125 * 8
        assert t.finish_reason == "answer" and t.num_steps == 2 and t.num_action_tokens > 0
        roles = [m["role"] for m in t.completion_messages]
        assert roles == ["assistant", "tool", "assistant"]
        assert t.completion_messages[1]["content"] == row["answer"]  # ToolEnv ran the user's calculator
        assert t.reward == float(right)
        assert {k: t.reward_parts[k] for k in ("agent", "agent/correct_answer", "agent/called_the_tool")} == {
            "agent": float(right),
            "agent/correct_answer": float(right),
            "agent/called_the_tool": 1.0,
        }
        assert t.reward_parts["agent/calculator_calls"] == 1.0 and t.reward_parts["agent/vf_error"] == 0.0


def test_the_real_engine_samples_every_call_of_the_environments_loop(tok, builtin_model_path):
    engine = TorchEngine(builtin_model_path, dtype="float32", seed=0, max_model_len=512, max_num_seqs=8)
    rows = load_rows(TOOL_ENV, DataConfig(), split="train", size=4) * 2
    for row, t in zip(rows, rollout(engine, tok, rows), strict=True):
        assert t.finish_reason in ("answer", "max_turns") and t.num_action_tokens > 0
        last = [m for m in t.completion_messages if m["role"] == "assistant"][-1]["content"] or ""
        assert t.reward == float(row["answer"] in last)  # the rubric's verdict on what was sampled
        tools = sum(m["role"] == "tool" for m in t.completion_messages)
        assert t.reward_parts["agent/calculator_calls"] == tools and t.num_steps == tools + 1


def test_a_single_turn_env_is_one_call_without_tools(tok):
    rows = load_rows("verifiers:verifiers_envs:load_single_turn", DataConfig(), split="eval", size=4)
    for row, t in zip(rows, rollout(PerfectAgent(tok), tok, rows), strict=True):
        assert t.num_steps == 1 and t.reward_parts["agent/vf_error"] == 0.0
        assert [m["role"] for m in t.completion_messages] == ["assistant"]
        assert t.reward == float(row["answer"] != "1000")
