"""Batched env-host calls (one Ray call per host per turn): each entry behaves as its single call, results keep
their order, and a batch of creations opens all its environments or none."""

import asyncio
import time

import pytest
from test_agent_loop import LocalHandle

from agentrl_ray.chat_format import ToolCall
from agentrl_ray.envs.host import EnvHost
from agentrl_ray.rollout.agent_loop import per_host

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
        keys = [f"k{i}" for i in range(6)]
        pairs = [(hosts[i % 2], k) for i, k in enumerate(keys)]
        for host, k in pairs:
            await host.host.create(k, CALC, {}, {})
        calls = [(h, (k, [ToolCall("calculator", {"expression": f"{i} * 10"})], [])) for i, (h, k) in enumerate(pairs)]
        results = await per_host(calls, "call_tools")
        closed = await per_host(pairs, "close")
        return results, closed, [h.host.stats()["open"] for h in hosts]

    results, closed, still_open = asyncio.run(main())
    assert [r[0].text for r in results] == [str(i * 10) for i in range(6)]
    assert closed == [True] * 6 and still_open == [0, 0]


def test_a_failing_creation_leaves_nothing_open():
    async def main():
        host = EnvHost()
        with pytest.raises(ValueError, match="row 2 is bad"):
            await host.create_many([(f"k{i}", PICKY, {}, {"id": i, "bad": i == 2}) for i in range(4)])
        stats = host.stats()
        texts = await host.create_many([("a", PICKY, {}, {"id": "a"}), ("b", PICKY, {}, {"id": "b"})])
        return stats, texts

    stats, texts = asyncio.run(main())
    assert stats["open"] == 0 and stats["created"] == 3 and stats["closed"] == 3
    assert texts == ["ready a", "ready b"]


def test_an_error_is_raised_only_after_every_host_finished():
    """A worker closes the whole batch when creation fails: no host may still be creating at that moment."""

    async def main():
        fast_bad, slow_good = LocalHandle(EnvHost()), LocalHandle(EnvHost())
        requests = [
            (fast_bad, ("x", PICKY, {}, {"id": "x", "bad": True})),
            (slow_good, ("y", PICKY, {}, {"id": "y", "slow": 0.5})),
        ]
        with pytest.raises(ValueError, match="row x is bad"):
            await per_host(requests, "create")
        created_before_raise = slow_good.host.stats()["created"]
        await per_host([(fast_bad, "x"), (slow_good, "y")], "close")
        return created_before_raise, [h.host.stats()["open"] for h in (fast_bad, slow_good)]

    created, still_open = asyncio.run(main())
    assert created == 1 and still_open == [0, 0]
