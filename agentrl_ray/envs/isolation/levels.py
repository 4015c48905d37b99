"""How an env host runs environment code: `env.isolation = thread | process | sandbox`.

- `thread`: environments are objects in the host's process; sync calls run on a bounded thread pool, async ones on
  the event loop. Cheapest. Any exception type (`SystemExit`, `KeyboardInterrupt` and other `BaseException`s
  included) becomes an error of that call. A call past its deadline cannot be stopped: its thread is "stuck" until
  it returns; stuck threads keep their slot, and once every slot is stuck new calls fail at once with an error that
  says so (`stuck_threads` in the host's stats) instead of queueing forever. Not contained: `os._exit`, a crash of
  the interpreter, memory, an async tool that blocks the loop.
- `process`: each trajectory's environment lives in its own child process, forked from a zygote that imported the
  environment's module (`children.py`). A call past its deadline kills the child; a child that exits or crashes
  costs only its trajectory. Values cross as JSON, tool text cut to `max_output_chars` in the child.
- `auto` (the default): `thread` for this package's own environments (`agentrl_ray.envs.*`: pure Python, known
  not to exit or crash; `CodeExecutionEnv` sandboxes the code it runs itself), `process` for any other (a user's
  environment, or ours with `env.tools` added). Why, with the measured cost of each level: docs/reliability.md.
- `sandbox`: `process` plus the sandbox's layers on the child (`confine.py`): its own uid, cgroup, no network,
  private /tmp, /var/tmp and /dev/shm, its own SysV IPC, rlimits. Root only; elsewhere refused at start.

Whatever the level, a failure reaches the host as an exception derived from `Exception` (an `EnvError` whose
message is the whole story, a `ValueError` from a tool's bad-input convention, or `TimeoutError`), which the host
turns into the trajectory's error observation. Costs per level: docs/reliability.md.
"""

from __future__ import annotations

import asyncio
import inspect
import os
from concurrent.futures import ThreadPoolExecutor
from typing import Any, Literal

from agentrl_ray.envs.isolation.child import as_text, describe
from agentrl_ray.envs.isolation.children import ChildEnv, Children, EnvError, EnvSetupError
from agentrl_ray.envs.isolation.sandbox import SandboxLimits

Level = Literal["auto", "thread", "process", "sandbox"]
LEVELS = ("auto", "thread", "process", "sandbox")
BUILTIN_ENVS = "agentrl_ray.envs."  # `auto` runs these at `thread`: ours, pure Python, cheap (docs/reliability.md)

__all__ = ["LEVELS", "EnvError", "EnvSetupError", "Isolation", "Level"]


class Isolation:
    def __init__(
        self, level: Level, max_threads: int, max_output_chars: int, sandbox: SandboxLimits | None = None
    ) -> None:
        if level not in LEVELS:
            raise ValueError(f"env.isolation must be one of {', '.join(LEVELS)}, got {level!r}")
        if level == "sandbox" and os.geteuid() != 0:
            raise RuntimeError(
                "env.isolation=sandbox needs root on the env host's node (a separate uid per trajectory, cgroups, "
                f"mounts); this process runs as uid {os.geteuid()}. Use env.isolation=process there, or run the "
                "workers as root"
            )
        self.level = level
        self.max_output_chars = max_output_chars
        self.threads = _Threads(max_threads)
        self.children = Children("sandbox", sandbox) if level == "sandbox" else Children("process")

    async def construct(self, cls: type, env_path: str, tools: tuple[str, ...], kwargs: dict, timeout: float) -> Any:
        """One trajectory's environment: the object itself (`thread`) or a proxy of it in a child."""
        if self.level_for(env_path, tools) == "thread":
            return await self.threads.run(lambda: cls(**kwargs), timeout)
        return await self.children.open(cls, env_path, tools, kwargs, self.max_output_chars, timeout)

    def level_for(self, env_path: str, tools: tuple[str, ...]) -> str:
        """The level an environment runs at: `auto` is `thread` for the package's own environments (without added
        tools) and `process` for everything else."""
        if self.level != "auto":
            return self.level
        return "thread" if env_path.startswith(BUILTIN_ENVS) and not tools else "process"

    async def run(self, fn: Any, args: tuple, kwargs: dict[str, Any], timeout: float, text: bool = False) -> Any:
        """`fn(*args, **kwargs)` (a method of an environment) under `timeout`; its value as tool text when `text`."""
        owner = getattr(fn, "__self__", None)
        if isinstance(owner, ChildEnv):
            return await asyncio.wait_for(owner._child.call(fn.__name__, args, kwargs, text), timeout)
        if inspect.iscoroutinefunction(fn):
            try:
                value = await asyncio.wait_for(fn(*args, **kwargs), timeout)
            except (Exception, asyncio.CancelledError):
                raise
            except BaseException as e:  # SystemExit, KeyboardInterrupt, ...: this call's error, not the host's
                raise EnvError(describe(e)) from None
            return as_text(value, self.max_output_chars) if text else value
        limit = self.max_output_chars
        # The value becomes text in the pool thread too: a hostile __str__ or a huge value must not stall the loop.
        return await self.threads.run(
            lambda: as_text(fn(*args, **kwargs), limit) if text else fn(*args, **kwargs), timeout
        )

    async def release(self, env: Any) -> None:
        """After close: end an environment's child (nothing to do for a thread-level environment)."""
        if isinstance(env, ChildEnv):
            await env._child.stop()

    def stats(self) -> dict[str, int]:
        return {"stuck_threads": self.threads.stuck, "children_alive": self.children.live, **self.children.counts}


class _Threads:
    """A thread pool whose threads may never come back: each stuck call keeps its slot until it returns."""

    def __init__(self, max_threads: int) -> None:
        self.max_threads = max_threads
        self.executor = ThreadPoolExecutor(max_workers=max_threads, thread_name_prefix="env-tool")
        self.slots: asyncio.Semaphore | None = None
        self.stuck = 0

    async def run(self, fn: Any, timeout: float) -> Any:
        if self.stuck >= self.max_threads:
            raise EnvError(
                f"all {self.max_threads} environment threads of this env host are stuck in calls that never "
                "returned (past env.tool_timeout_s); env.isolation=process kills such calls instead"
            )
        if self.slots is None:
            self.slots = asyncio.Semaphore(self.max_threads)
        # The deadline starts when a thread is free: waiting behind other rollouts' calls is not this call's time.
        await self.slots.acquire()
        future = asyncio.get_running_loop().run_in_executor(self.executor, _guarded, fn)
        try:
            return await asyncio.wait_for(asyncio.shield(future), timeout)
        finally:
            if future.done():
                self.slots.release()
            else:
                self.stuck += 1
                future.add_done_callback(self._returned)

    def _returned(self, future: asyncio.Future) -> None:
        if not future.cancelled():
            future.exception()  # retrieved: a late failure of an abandoned call is not an unhandled error
        self.stuck -= 1
        self.slots.release()


def _guarded(fn: Any) -> Any:
    """Run in a pool thread: every BaseException that is not an Exception becomes an EnvError (a SystemExit
    raised into the event loop would end the host)."""
    try:
        return fn()
    except Exception:
        raise
    except BaseException as e:  # noqa: BLE001
        raise EnvError(describe(e)) from None
