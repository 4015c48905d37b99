"""An environment and reward functions written the way TRL's docs show run unchanged through EnvHost + score.

TRL's `environment_factory` contract: a plain class, `reset(self, **kwargs)` whose returned text is appended to the
prompt, tools as public methods with type hints and Google docstrings, optional `get_reward(self)`. Reward
functions take `(completions, **kwargs)` and read dataset columns from kwargs.
"""

import asyncio

from transformers.utils import get_json_schema

from agentrl_ray.chat_format import parse_tool_calls
from agentrl_ray.envs.host import EnvHost
from agentrl_ray.envs.loading import load_env_class
from agentrl_ray.envs.tools import tool_schemas
from agentrl_ray.rewards import load_reward_functions, score


class GuessEnv:
    def __init__(self):
        self.secret = None
        self.guesses = 0
        self.solved = False

    def reset(self, **kwargs):
        self.secret = int(kwargs["secret"])
        self.guesses = 0
        self.solved = False
        return " You have 3 guesses."

    def guess(self, number: int) -> str:
        """
        Guess the secret number.

        Args:
            number: The number to guess.

        Returns:
            Whether the guess is too low, too high, or correct.
        """
        self.guesses += 1
        if number == self.secret:
            self.solved = True
            return "correct"
        return "too low" if number < self.secret else "too high"

    def get_reward(self) -> float:
        return 1.0 if self.solved else 0.0


def reward_brevity(completions, **kwargs):
    return [-abs(20 - len(completion[-1]["content"])) / 20 for completion in completions]


def reward_solution(completions, solution, **kwargs):
    return [1.0 if str(s) in completion[-1]["content"] else 0.0 for completion, s in zip(completions, solution)]


ENV_PATH = f"{__name__}:GuessEnv"


def _call(number) -> str:
    return f'<tool_call>\n{{"name": "guess", "arguments": {{"number": {number}}}}}\n</tool_call>'


def test_schema_matches_what_transformers_renders_for_trl():
    ours = tool_schemas(load_env_class(ENV_PATH))[0]["function"]
    theirs = get_json_schema(GuessEnv.guess)["function"]
    assert ours["name"] == theirs["name"] == "guess"
    assert ours["description"] == theirs["description"]
    assert ours["parameters"] == theirs["parameters"]


def test_trl_env_and_rewards_run_unchanged_through_env_host_and_score():
    rows = [{"prompt": "Guess my number.", "secret": 7, "solution": "7"}] * 2
    # Two rollouts of the same row: one finds the secret, one gives up.
    turns = [
        [_call(5), _call('"7"'), "The secret is 7."],
        [_call(9), "I give up."],
    ]

    async def rollout():
        host = EnvHost()
        completions, env_rewards = [], []
        for i, (row, script) in enumerate(zip(rows, turns)):
            key = f"t{i}"
            assert await host.create(key, ENV_PATH, {}, row) == " You have 3 guesses."
            messages = []
            for text in script:
                messages.append({"role": "assistant", "content": text})
                parsed = parse_tool_calls(text)
                for result in await host.call_tools(key, parsed.calls, parsed.errors):
                    messages.append({"role": "tool", "content": result.text})
            completions.append(messages)
            env_rewards.append(await host.env_reward(key, messages[-1]["content"]))
            await host.close(key)
        return completions, env_rewards, host.stats()

    completions, env_rewards, stats = asyncio.run(rollout())
    assert [m["content"] for m in completions[0] if m["role"] == "tool"] == ["too low", "correct"]  # "7" coerced
    assert env_rewards == [1.0, 0.0]
    assert stats["errors"] == 0 and stats["open"] == 0

    funcs = [reward_brevity, reward_solution] + load_reward_functions(["env_reward"])
    columns = {k: [r[k] for r in rows] for k in rows[0]}
    totals, parts = score(funcs, [1.0, 1.0, 1.0], completions, columns, env_rewards=env_rewards)
    brevity = [-abs(20 - len("The secret is 7.")) / 20, -abs(20 - len("I give up.")) / 20]
    assert parts[0] == {"reward_brevity": brevity[0], "reward_solution": 1.0, "env_reward": 1.0}
    assert parts[1] == {"reward_brevity": brevity[1], "reward_solution": 0.0, "env_reward": 0.0}
    assert totals == [brevity[0] + 2.0, brevity[1]]
