"""Turn-based environments (step contract) on their own and through EnvHost.call_turn."""

import asyncio
import time

import pytest

from agentrl_ray.envs.host import EnvHost, TurnResult
from agentrl_ray.envs.tools import tool_methods
from examples.conversation.env import ScriptedUserEnv
from examples.task_actions.env import ActionTaskEnv

SCRIPTED = "examples.conversation.env:ScriptedUserEnv"
TASK = "examples.task_actions.env:ActionTaskEnv"


def test_turn_based_envs_expose_no_tools():
    assert tool_methods(ScriptedUserEnv()) == {} and tool_methods(ActionTaskEnv()) == {}


def test_scripted_user_checks_each_reply_and_plays_the_script():
    env = ScriptedUserEnv()
    env.reset(expected=["hello", None, "Paris"], user_turns=["Tell me a joke.", "Capital of France?"])
    assert env.step("Hello there!") == ("Tell me a joke.", pytest.approx(1 / 3), False)
    assert env.step("Why did the chicken...") == ("Capital of France?", pytest.approx(1 / 3), False)
    assert env.step("It is Lyon.") == (None, 0.0, True)
    with pytest.raises(RuntimeError, match="after the conversation ended"):
        env.step("more")


def test_scripted_user_rejects_inconsistent_rows():
    with pytest.raises(ValueError, match="need 1 user follow-ups between them, the row has 0"):
        ScriptedUserEnv().reset(expected=["a", "b"])
    with pytest.raises(ValueError, match="empty"):
        ScriptedUserEnv().reset(expected=[])


def test_action_task_unordered_success_and_unknown_actions():
    env = ActionTaskEnv()
    intro = env.reset(required_actions=["open_door", "take_key"], actions=["open_door", "take_key", "jump"])
    assert "jump, open_door, take_key" in intro
    assert env.step("ACTION: take_key\nACTION: fly") == ("done: take_key\nunknown action 'fly'", 0.0, False)
    assert env.step("action: open_door") == ("done: open_door\nTask complete.", 1.0, True)


def test_action_task_ordered_criterion_and_limits():
    env = ActionTaskEnv(max_steps=2)
    env.reset(required_actions=["a", "b"], ordered=True)
    assert env.step("ACTION: b")[1:] == (0.0, False)
    assert env.step("ACTION: a") == ("done: a\nOut of steps.", 0.0, True)  # b before a does not count
    env.reset(required_actions=["a", "b"], ordered=True)
    assert env.step("ACTION: a\nACTION: b")[1:] == (1.0, True)
    env.reset(required_actions=["a"])
    assert env.step("I think I am done.") == (None, 0.0, True)
    with pytest.raises(ValueError, match=r"required actions \['z'\] are not among"):
        env.reset(required_actions=["z"], actions=["a"])


class BrokenStepEnv:
    def reset(self, **row):
        self.mode = row["mode"]

    def step(self, text):
        if self.mode == "raise":
            raise RuntimeError("lost the plot")
        if self.mode == "shape":
            return "only an observation"
        if self.mode == "slow":
            time.sleep(2)
        return "ok", 0.5, False


def test_env_host_call_turn_rewards_and_failures():
    async def scenario():
        host = EnvHost(tool_timeout_s=0.3)
        await host.create("chat", SCRIPTED, {}, {"expected": ["hi", "bye"], "user_turns": ["Goodbye now."]})
        turns = [await host.call_turn("chat", "Hi!"), await host.call_turn("chat", "Bye!")]
        chat_reward = await host.env_reward("chat", "Bye!")
        results = {}
        for mode in ("raise", "shape", "slow", "fine"):
            await host.create(mode, f"{__name__}:BrokenStepEnv", {}, {"mode": mode})
            results[mode] = await host.call_turn(mode, "go")
        fine_reward = await host.env_reward("fine", "")
        await host.create("calc", "agentrl_ray.envs.builtin.calculator:CalculatorEnv", {}, {})
        with pytest.raises(TypeError, match="no step\\(text\\): it is a tool environment"):
            await host.call_turn("calc", "2+2")
        return turns, chat_reward, results, fine_reward, host.stats()

    turns, chat_reward, results, fine_reward, stats = asyncio.run(scenario())
    assert turns == [TurnResult("Goodbye now.", 0.5, False), TurnResult(None, 0.5, True)]
    assert chat_reward == 1.0  # sum of step rewards
    assert results["raise"] == TurnResult("Error: step failed: RuntimeError: lost the plot", 0.0, True, True)
    assert results["shape"].error and "must return (observation, reward, done)" in results["shape"].observation
    assert results["slow"] == TurnResult("Error: step timed out after 0.3 s", 0.0, True, True)
    assert results["fine"] == TurnResult("ok", 0.5, False) and fine_reward == 0.5
    assert (stats["turns"], stats["errors"], stats["timeouts"]) == (6, 3, 1)
