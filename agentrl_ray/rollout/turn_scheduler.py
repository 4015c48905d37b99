"""Continuous batching at turn boundaries, for the streaming pipeline (`sync.pipeline=stream`, learner/stream.py).

The batch pipeline's agent loop generates every live episode of a call in one engine call per turn, then waits for
every episode's environment before the next turn: the slowest tool of the turn holds the engine. Here each episode
runs its own loop and asks the scheduler for its next turn; the scheduler runs one batched `Engine.generate` over
every request waiting at that moment (in a thread, so environments keep answering on the actor's event loop) and
then the next over whatever arrived meanwhile. An episode whose tool is slow only delays itself, and the rollout
calls of several groups (the worker takes many at once in this mode) share one engine.

New weights and the integrity probe take the engine between two such calls (`exclusive`): a weight update lands at a
turn boundary of every in-flight episode, which then continues on the new weights (a partial rollout). Each turn's
generation reports the weights version that produced it, so every sampled token carries its policy version.

A request's tokens depend on its own seed, not on its batch (`Engine.generate`), but its floating-point sums may
depend on the batch it lands in: this mode is not bit-reproducible, the batch pipeline is.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass, field

from agentrl_ray.rollout.engine import Engine, Generation


@dataclass
class _Request:
    prompt: list[int]
    max_tokens: int
    seed: int
    options: tuple  # (temperature, top_p, stop token ids): one engine call per distinct value
    future: asyncio.Future = field(repr=False)


class TurnScheduler:
    def __init__(self, engine: Engine, version: Callable[[], int]) -> None:
        self.engine = engine
        self.version = version  # the weights version the engine holds now
        self._lock = asyncio.Lock()  # held by each batched call, by a weight load and by the probe
        self._queue: list[_Request] = []
        self._runner: asyncio.Task | None = None

    async def generate(
        self,
        prompt: list[int],
        max_tokens: int,
        *,
        temperature: float,
        top_p: float,
        stop_token_ids: list[int],
        seed: int,
    ) -> tuple[Generation, int]:
        """One turn of one episode: its generation and the weights version that produced it."""
        future = asyncio.get_running_loop().create_future()
        self._queue.append(_Request(prompt, max_tokens, seed, (temperature, top_p, tuple(stop_token_ids)), future))
        if self._runner is None or self._runner.done():
            self._runner = asyncio.create_task(self._run())
        return await future

    @asynccontextmanager
    async def exclusive(self):
        """The engine to oneself, between two batched calls (a weight load, the integrity probe)."""
        async with self._lock:
            yield

    async def _run(self) -> None:
        while self._queue:
            async with self._lock:
                batch, self._queue = self._queue, []
                by_options: dict[tuple, list[_Request]] = {}
                for request in batch:
                    by_options.setdefault(request.options, []).append(request)
                version = self.version()
                for (temperature, top_p, stops), requests in by_options.items():
                    try:
                        gens = await asyncio.to_thread(
                            self.engine.generate,
                            [r.prompt for r in requests],
                            [r.max_tokens for r in requests],
                            temperature=temperature,
                            top_p=top_p,
                            stop_token_ids=list(stops),
                            seeds=[r.seed for r in requests],
                        )
                    except BaseException as err:  # every waiting episode gets the engine's error
                        for r in requests:
                            if not r.future.done():
                                r.future.set_exception(err)
                        if not isinstance(err, Exception):
                            raise
                        continue
                    for r, gen in zip(requests, gens):
                        if not r.future.done():
                            r.future.set_result((gen, version))
            await asyncio.sleep(0)  # let finished episodes' environments and a waiting weight load in
