"""The tool timeout counts a tool's own running time, not the time its call waits for a free thread."""

import asyncio
import time

from agentrl_ray.chat_format import ToolCall
from agentrl_ray.envs.host import EnvHost


class NapEnv:
    def reset(self, **row):
        return None

    def nap(self, seconds: float) -> str:
        """Sleep, then answer.

        Args:
            seconds: How long to sleep.
        """
        time.sleep(seconds)
        return "rested"


def test_queueing_for_a_thread_does_not_count_against_the_timeout():
    async def main():
        host = EnvHost(tool_timeout_s=1.0, max_threads=1)
        keys = ["a", "b", "c"]
        for k in keys:
            await host.create(k, "test_env_host_timeout:NapEnv", {}, {"id": k})
        t0 = time.perf_counter()
        # One thread: the three 0.6 s naps run one after another (1.8 s), each well within its own 1 s.
        results = await asyncio.gather(*(host.call_tools(k, [ToolCall("nap", {"seconds": 0.6})], []) for k in keys))
        return results, time.perf_counter() - t0, host.stats()

    results, wall, stats = asyncio.run(main())
    assert wall >= 1.7  # they did queue
    assert [r[0].text for r in results] == ["rested"] * 3
    assert stats["timeouts"] == 0


def test_a_tool_that_runs_too_long_still_times_out():
    async def main():
        host = EnvHost(tool_timeout_s=0.3, max_threads=1)
        await host.create("a", "test_env_host_timeout:NapEnv", {}, {"id": "a"})
        return await host.call_tools("a", [ToolCall("nap", {"seconds": 1.0})], [])

    (result,) = asyncio.run(main())
    assert result.error and "timed out after 0.3 s" in result.text
