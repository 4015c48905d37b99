"""Batched env-host calls through the typed `EnvClient` (one Ray call per host per turn): each entry behaves as its
single call, results keep their order, and a batch of creations opens all its environments or none."""

import asyncio
import math
import time

import pytest
from test_agent_loop import LocalHandle

from agentrl_ray.chat_format import ToolCall
from agentrl_ray.envs.client import EnvClient
from agentrl_ray.envs.host import EnvHost

CALC = "agentrl_ray.envs.builtin.calculator:CalculatorEnv"
PICKY = "test_env_host_batched:PickyEnv"


class PickyEnv:
    def reset(self, **row):
        time.sleep(row.get("slow", 0.0))
        if row.get("bad"):
            raise ValueError(f"row {row['id']} is bad")
        return f"ready {row['id']}"

    def echo(self, text: str) -> str:
        """Echo.

        Args:
            text: What to say back.
        """
        return text


def test_batched_calls_keep_order_across_hosts():
    async def main():
        hosts = [LocalHandle(EnvHost()), LocalHandle(EnvHost())]
        envs = EnvClient(hosts, CALC, {})
        keys = [f"k{i}" for i in range(6)]
        await envs.create([(k, {}) for k in keys])
        opened = [h.host.stats()["open"] for h in hosts]
        calls = [(k, [ToolCall("calculator", {"expression": f"{i} * 10"})], []) for i, k in enumerate(keys)]
        results = await envs.call_tools(calls)
        await envs.close(keys)
        return opened, results, [h.host.stats()["open"] for h in hosts], [envs.host_index(k) for k in keys]

    opened, results, still_open, placed = asyncio.run(main())
    assert [r[0].text for r in results] == [str(i * 10) for i in range(6)]
    assert opened == [placed.count(0), placed.count(1)] and still_open == [0, 0]


def test_a_failing_reset_costs_only_its_own_trajectory():
    async def main():
        host = EnvHost()
        texts = await host.create_many(PICKY, {}, [(f"k{i}", {"id": i, "bad": i == 2}) for i in range(4)])
        calls = [(f"k{i}", [ToolCall("echo", {"text": f"hi {i}"})], []) for i in range(4)]
        results = await host.call_tools_many(calls)
        rewards = await host.env_reward_many([(f"k{i}", "done") for i in range(4)])
        opened = host.stats()
        await host.close_many([f"k{i}" for i in range(4)])
        return texts, results, rewards, opened, host.stats()

    texts, results, rewards, opened, stats = asyncio.run(main())
    assert texts == ["ready 0", "ready 1", None, "ready 3"]
    assert [r[0].text for i, r in enumerate(results) if i != 2] == ["hi 0", "hi 1", "hi 3"]
    assert results[2][0].error and "could not start: row 2 is bad" in results[2][0].text
    assert [r is None for r in rewards] == [True, True, False, True] and math.isnan(rewards[2])
    assert opened["open"] == 4 and opened["start_errors"] == 1 and opened["created"] == 3
    assert stats["open"] == 0 and stats["closed"] == 3


def test_an_error_is_raised_only_after_every_host_finished():
    """A worker closes the whole batch when creation fails (a key already open, a class that cannot be loaded):
    no host may still be creating at that moment."""

    async def main():
        fast_bad, slow_good = LocalHandle(EnvHost()), LocalHandle(EnvHost())
        envs = EnvClient([fast_bad, slow_good], PICKY, {})
        x, y = _key_on(envs, 0), _key_on(envs, 1)
        await envs.create([(x, {"id": x})])
        with pytest.raises(ValueError, match="already open"):
            await envs.create([(x, {"id": x}), (y, {"id": y, "slow": 0.5})])
        created_before_raise = slow_good.host.stats()["created"]
        await envs.close([x, y])
        return created_before_raise, [h.host.stats()["open"] for h in (fast_bad, slow_good)]

    created, still_open = asyncio.run(main())
    assert created == 1 and still_open == [0, 0]


def _key_on(envs: EnvClient, host: int) -> str:
    """A key that the client routes to host number `host`."""
    return next(k for k in (f"key{i}" for i in range(1000)) if envs.host_index(k) == host)
