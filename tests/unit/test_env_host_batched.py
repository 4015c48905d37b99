"""Batched env-host calls through the typed `EnvClient` (one Ray call per host per turn): each entry behaves as its
single call, results keep their order, and a batch of creations opens all its environments or none."""

import asyncio
import time

import pytest
from test_agent_loop import LocalHandle

from agentrl_ray.chat_format import ToolCall
from agentrl_ray.envs.client import EnvClient
from agentrl_ray.envs.host import EnvHost

CALC = "agentrl_ray.envs.calculator:CalculatorEnv"
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


def test_a_failing_creation_leaves_nothing_open():
    async def main():
        host = EnvHost()
        with pytest.raises(ValueError, match="row 2 is bad"):
            await host.create_many(PICKY, {}, [(f"k{i}", {"id": i, "bad": i == 2}) for i in range(4)])
        stats = host.stats()
        texts = await host.create_many(PICKY, {}, [("a", {"id": "a"}), ("b", {"id": "b"})])
        return stats, texts

    stats, texts = asyncio.run(main())
    assert stats["open"] == 0 and stats["created"] == 3 and stats["closed"] == 3
    assert texts == ["ready a", "ready b"]


def test_an_error_is_raised_only_after_every_host_finished():
    """A worker closes the whole batch when creation fails: no host may still be creating at that moment."""

    async def main():
        fast_bad, slow_good = LocalHandle(EnvHost()), LocalHandle(EnvHost())
        envs = EnvClient([fast_bad, slow_good], PICKY, {})
        x, y = _key_on(envs, 0), _key_on(envs, 1)
        with pytest.raises(ValueError, match="is bad"):
            await envs.create([(x, {"id": x, "bad": True}), (y, {"id": y, "slow": 0.5})])
        created_before_raise = slow_good.host.stats()["created"]
        await envs.close([x, y])
        return created_before_raise, [h.host.stats()["open"] for h in (fast_bad, slow_good)]

    created, still_open = asyncio.run(main())
    assert created == 1 and still_open == [0, 0]


def _key_on(envs: EnvClient, host: int) -> str:
    """A key that the client routes to host number `host`."""
    return next(k for k in (f"key{i}" for i in range(1000)) if envs.host_index(k) == host)
