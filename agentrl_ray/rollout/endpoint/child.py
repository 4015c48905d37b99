"""The child side of an agent process: one trajectory's `run(client, row)`, forked from the worker's fork server.

It imports the agent (an import path, or a function pickled by value: `envs.loading.import_object`), points an
`openai.AsyncOpenAI` at the endpoint with the trajectory's key (no retries: a refused call is an answer, not a
network fault), runs the coroutine and sends back ("ok", reward or None) or ("error", "Type: message"). Whatever the
program does, raising any `BaseException` included, becomes such an answer or ends the process; the parent treats a
process that ends without answering, or runs past its deadline (then killed), as the trajectory's error.
"""

from __future__ import annotations

import asyncio
import math
import numbers
from typing import Any


def run_agent(conn, agent: str, row: dict[str, Any], base_url: str, api_key: str, timeout_s: float) -> None:
    from agentrl_ray.envs.isolation.child import describe

    try:
        import openai

        from agentrl_ray.envs.loading import import_object

        fn = import_object(agent, "env.agent")
        client = openai.AsyncOpenAI(base_url=base_url, api_key=api_key, max_retries=0, timeout=timeout_s)
        result = asyncio.run(fn(client, row))
        if result is not None and (not isinstance(result, numbers.Real) or math.isnan(float(result))):
            raise TypeError(f"run(client, row) returned {type(result).__name__} {result!r}: a reward (float) or None")
        answer = ("ok", None if result is None else float(result))
    except BaseException as e:  # noqa: BLE001 - any failure of the user's program is the trajectory's error
        answer = ("error", describe(e))
    conn.send(answer)
    conn.close()
