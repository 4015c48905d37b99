"""What an agent program's child runs after the fork (`agents.py` starts it from the shared zygote,
`envs/isolation/zygote.py`, confined at `env.isolation`): `run_agent` gives the user's `run(client, row)` an
`openai.AsyncOpenAI` pointed at the endpoint with the trajectory's key, without retries (a refused call is an answer,
not a network fault). Whatever the program does, raising any `BaseException` included, becomes an answer or ends the
process; the parent treats a process that ends without answering, or runs past its deadline (then killed), as the
trajectory's error.
"""

from __future__ import annotations

import asyncio
import math
import numbers
from typing import Any


def run_agent(fn, base, row: dict[str, Any], base_url: str, api_key: str, timeout_s: float) -> list:
    """`base`: the zygote's client, never used there; a copy with this trajectory's URL and key shares its HTTP
    client, whose creation (TLS context and all, 70-300 ms of CPU) would otherwise be paid by every trajectory."""
    from agentrl_ray.envs.isolation.child import describe

    try:
        client = base.with_options(base_url=base_url, api_key=api_key, timeout=timeout_s)
        result = asyncio.run(fn(client, row))
        if isinstance(result, dict):  # {"reward": float, "parts": {name: float}}: a reward with its components
            parts = result.get("parts") or {}
            if set(result) - {"reward", "parts"} or not isinstance(parts, dict):
                raise TypeError(f"run(client, row) returned {result!r}: a dict holds 'reward' and 'parts' only")
            return [
                "ok",
                {"reward": _reward(result.get("reward")), "parts": {str(k): _reward(v) for k, v in parts.items()}},
            ]
        return ["ok", None if result is None else _reward(result)]
    except BaseException as e:  # noqa: BLE001 - any failure of the user's program is the trajectory's error
        return ["error", describe(e, limit=1000)]


def _reward(value: Any) -> float:
    if not isinstance(value, numbers.Real) or not math.isfinite(float(value)):
        raise TypeError(f"run(client, row) returned {type(value).__name__} {value!r} as a reward: a finite number")
    return float(value)
