"""EnvClient: a rollout worker's typed view of its env hosts (the `EnvHost` actors).

One method per kind of call, each batched per host: a rollout worker makes one Ray call per host per phase (create,
one per turn for tools or turns, rewards, close), not one per episode. A trajectory's environment lives on the host
its key hashes to, so every call for that key reaches the same host. The environment's class path and constructor
kwargs go once per host with each batch of creations, not with every environment.

Every host's call finishes before the first error is raised, so a caller that cleans up after an error never races
a call still running.
"""

from __future__ import annotations

import asyncio
import zlib
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

from agentrl_ray.chat_format import ToolCall
from agentrl_ray.envs.host import ToolResult, TurnResult

T = TypeVar("T")


class EnvClient:
    def __init__(
        self, hosts: list[Any], env_path: str, env_kwargs: dict[str, Any], tools: tuple[str, ...] = ()
    ) -> None:
        if not hosts:
            raise ValueError("EnvClient needs at least one env host")
        self.hosts = hosts
        self.env_path = env_path
        self.env_kwargs = env_kwargs
        self.tools = tools  # env.tools: plain functions added to the environment (envs.loading.env_class)

    def host_index(self, key: str) -> int:
        return zlib.crc32(key.encode()) % len(self.hosts)

    async def create(self, items: list[tuple[str, dict[str, Any]]]) -> list[str | None]:
        """Build and reset one environment per (key, dataset row); returns the text each reset() gave. If one
        fails, its host closes the ones it opened in that batch; the caller closes the rest (`close`)."""
        return await self._per_host(
            [key for key, _ in items],
            items,
            lambda host, batch: host.create_many.remote(self.env_path, self.env_kwargs, batch, self.tools),
        )

    async def call_tools(self, requests: list[tuple[str, list[ToolCall], list[str]]]) -> list[list[ToolResult]]:
        """Per (key, parsed tool calls, parse errors): the results of the turn's calls, in order."""
        return await self._per_host([r[0] for r in requests], requests, lambda h, b: h.call_tools_many.remote(b))

    async def call_turns(self, requests: list[tuple[str, str | None]]) -> list[TurnResult]:
        """Per (key, assistant text): a turn-based environment's answer (a game's, text None a forfeit)."""
        return await self._per_host([r[0] for r in requests], requests, lambda h, b: h.call_turn_many.remote(b))

    async def rewards(self, requests: list[tuple[str, str]]) -> list[float | None]:
        """Per (key, last assistant text): the environment's own reward (None: it has none; NaN: it failed)."""
        return await self._per_host([r[0] for r in requests], requests, lambda h, b: h.env_reward_many.remote(b))

    async def close(self, keys: list[str]) -> None:
        """Close these environments (an unknown key is a no-op)."""
        if keys:
            await self._per_host(keys, keys, lambda h, b: h.close_many.remote(b))

    async def _per_host(
        self, keys: list[str], items: list[Any], call: Callable[[Any, list[Any]], Awaitable[list[T]]]
    ) -> list[T]:
        """`call(host, its items)` once per host that has items; results back in `items` order."""
        by_host: dict[int, list[int]] = {}
        for i, key in enumerate(keys):
            by_host.setdefault(self.host_index(key), []).append(i)
        refs = [call(self.hosts[h], [items[i] for i in idx]) for h, idx in by_host.items()]
        outcomes = await asyncio.gather(*refs, return_exceptions=True)
        failed = [o for o in outcomes if isinstance(o, BaseException)]
        if failed:
            raise failed[0]
        out: list[Any] = [None] * len(items)
        for idx, results in zip(by_host.values(), outcomes):
            for i, result in zip(idx, results):
                out[i] = result
        return out
