"""The agent processes' side: a zygote that imported `openai` and the agent's module once, forking one child per
trajectory (`python -m agentrl_ray.rollout.endpoint.child AGENT`, started by `agents.Zygote`).

Not multiprocessing's fork server: its children re-run the parent's `__main__` (a Ray worker's script) before the
target. Protocol, one JSON object a line, on the zygote's stdout: `{"id": "", "ready": true}` once its imports are
done; then for each request `{"id", "row", "base_url", "key", "timeout_s"}` on its stdin, `{"id", "pid"}` after the
fork, `{"id", "answer": ["ok", reward or None] | ["error", "Type: message"]}` from the child, `{"id", "exit": code}`
once the zygote reaped it. The child answers with one write of at most 4 KiB (atomic on a pipe, so children never
interleave). The user's code prints to stderr: fd 1 is pointed there in the zygote, the protocol uses a copy of it.

In the child, the agent (an import path, or a function pickled by value: `envs.loading.import_object`) gets an
`openai.AsyncOpenAI` pointed at the endpoint with the trajectory's key, without retries (a refused call is an answer,
not a network fault). Whatever the program does, raising any `BaseException` included, becomes an answer or ends the
process; the parent treats a process that ends without answering, or runs past its deadline (then killed), as the
trajectory's error.
"""

from __future__ import annotations

import asyncio
import json
import math
import numbers
import os
import selectors
import sys
from typing import Any

MAX_LINE = 4000


def run_agent(fn, base, row: dict[str, Any], base_url: str, api_key: str, timeout_s: float) -> list:
    """`base`: the zygote's client, never used there; a copy with this trajectory's URL and key shares its HTTP
    client, whose creation (TLS context and all, 70-300 ms of CPU) would otherwise be paid by every trajectory."""
    from agentrl_ray.envs.isolation.child import describe

    try:
        client = base.with_options(base_url=base_url, api_key=api_key, timeout=timeout_s)
        result = asyncio.run(fn(client, row))
        if result is not None and (not isinstance(result, numbers.Real) or math.isnan(float(result))):
            raise TypeError(f"run(client, row) returned {type(result).__name__} {result!r}: a reward (float) or None")
        return ["ok", None if result is None else float(result)]
    except BaseException as e:  # noqa: BLE001 - any failure of the user's program is the trajectory's error
        return ["error", describe(e, limit=1000)]


def _write(fd: int, obj: dict) -> None:
    line = json.dumps(obj)
    if len(line) > MAX_LINE:
        line = json.dumps({"id": obj["id"], "answer": ["error", "the agent's answer could not be encoded"]})
    os.write(fd, line.encode() + b"\n")


def main(agent: str) -> None:
    proto = os.dup(1)
    os.dup2(2, 1)  # the user's prints go to stderr
    import openai  # imported once here, inherited by every child

    from agentrl_ray.envs.loading import import_object

    fn = import_object(agent, "env.agent")
    base = openai.AsyncOpenAI(base_url="http://127.0.0.1/v1", api_key="unset", max_retries=0)
    _write(proto, {"id": "", "ready": True})
    children: dict[int, str] = {}
    selector = selectors.DefaultSelector()
    selector.register(sys.stdin, selectors.EVENT_READ)
    pending = b""
    while True:
        ready = selector.select(timeout=0.05)
        if ready:
            chunk = os.read(sys.stdin.fileno(), 1 << 16)
            if not chunk:
                return  # the worker closed our stdin: it is gone or done
            pending += chunk
            *lines, pending = pending.split(b"\n")
            for line in lines:
                request = json.loads(line)
                pid = os.fork()
                if pid == 0:
                    selector.close()
                    args = (request["row"], request["base_url"], request["key"], request["timeout_s"])
                    _write(proto, {"id": request["id"], "answer": run_agent(fn, base, *args)})
                    os._exit(0)
                children[pid] = request["id"]
                _write(proto, {"id": request["id"], "pid": pid})
        while children:
            pid, status = os.waitpid(-1, os.WNOHANG)
            if pid == 0:
                break
            _write(proto, {"id": children.pop(pid), "exit": os.waitstatus_to_exitcode(status)})


if __name__ == "__main__":
    main(sys.argv[1])
