"""The host side of `env.isolation = process | sandbox`: environments in child processes forked by a zygote (and,
through `Children.spawn`, the agent programs of `rollout/endpoint/agents.py`, confined the same way).

`Children.open(...)` forks a child for one trajectory (see `zygote.py`, `child.py`) and returns a proxy: an object
of a class made from the environment's class, with the same public methods (same signatures and docstrings, so the
host lists tools, builds schemas and checks arguments exactly as for an in-process environment), each an `async`
method that forwards the call to the child. When a call is cancelled (the host's timeout), the child is killed at
once: a hung tool costs its trajectory and one process, never a thread. A child that dies (`os._exit`, a
segfault, the OOM killer) fails its trajectory's next call with how it died.
"""

from __future__ import annotations

import asyncio
import dataclasses
import errno
import functools
import inspect
import itertools
import json
import logging
import os
import pickle
import signal
import socket
import subprocess
import sys
from collections.abc import Callable
from contextlib import ExitStack
from typing import Any, Literal

from agentrl_ray.envs.base import RESERVED_METHODS
from agentrl_ray.envs.isolation import cgroups
from agentrl_ray.envs.isolation.child import ChildSpec, call_frame, read_reply
from agentrl_ray.envs.isolation.sandbox import SandboxLimits
from agentrl_ray.envs.isolation.sandbox_uids import SANDBOX_UID_BASE, kill_uid, sandbox_uid
from agentrl_ray.envs.loading import BY_VALUE
from agentrl_ray.envs.tools import tool_functions

logger = logging.getLogger(__name__)

_EXIT_REPORT_WAIT_S = 1.0  # how long a dead child's exit status may take to arrive from the zygote


class EnvError(Exception):
    """An environment failed (raised, timed out, died); its message is the whole observation."""


class EnvSetupError(Exception):
    """The config cannot work at this isolation level (every trajectory would fail): raised, not observed."""


Confine = Literal["process", "limits", "sandbox"]


class Children:
    """A zygote and the children it forked for one env host (or one rollout worker's agent programs), each child
    confined at `level`: "process" not at all; "limits" in the cgroup of a leased slot (as root; its final kill is
    then exact) under `limits`' rlimits, with the host's uid, files and network; "sandbox" every layer of
    `confine.py`."""

    def __init__(self, level: Confine, limits: SandboxLimits | None = None) -> None:
        self.level, self.limits = level, limits or SandboxLimits()
        self._zygote: _Zygote | None = None
        self.counts = {"children_started": 0, "children_killed": 0, "children_died": 0}
        self.live = 0

    async def spawn(self, spec: Any, preload: list[str]) -> _Child:
        """A new child for `spec` (a dataclass with `confinement`, `load()` and `serve(sock, loaded)`: zygote.py),
        confined at this level, its socket connected; the zygote, started on first use, imports `preload`."""
        if self._zygote is None or self._zygote.dead:
            self._zygote = await _Zygote.start(preload)
        lease = ExitStack()
        ours, theirs = socket.socketpair()
        try:
            if self.level != "process":
                spec = dataclasses.replace(spec, confinement=self._confine(lease))
            pid, pidfd = await self._zygote.spawn(spec, theirs)
        except BaseException:
            ours.close()
            lease.close()
            raise
        finally:
            theirs.close()
        reader, writer = await asyncio.open_unix_connection(sock=ours)
        self.counts["children_started"] += 1
        self.live += 1
        return _Child(self, pid, pidfd, reader, writer, lease)

    async def open(
        self, cls: type, env_path: str, tools: tuple[str, ...], env_kwargs: dict, limit: int, timeout: float
    ) -> ChildEnv:
        """A proxy of `cls` whose instance lives in a new child; raises EnvError when it could not be built."""
        module = "" if env_path.startswith(BY_VALUE) else env_path.partition(":")[0]
        preload = [m for m in (module, *(t.partition(":")[0] for t in tools)) if m]
        child = await self.spawn(ChildSpec(env_path, tuple(tools), env_kwargs, limit), preload)
        try:
            status, detail, _ = await asyncio.wait_for(child.hello(), timeout)
        except BaseException as e:
            await child.kill("its constructor timed out" if isinstance(e, TimeoutError) else "its start failed")
            if isinstance(e, TimeoutError):
                raise EnvError(f"the environment's constructor timed out after {timeout:g} s") from None
            raise
        if status != "ok":
            await child.kill("its constructor failed")
            raise EnvError(detail)
        return proxy_class(cls)(child)

    def _confine(self, lease: ExitStack):
        from agentrl_ray.envs.isolation.confine import Confinement, hidepid_available
        from agentrl_ray.envs.isolation.sandbox_layers import warn_once

        limits = self.limits
        uid = lease.enter_context(sandbox_uid())  # None when not root (then no cgroup either, and no sandbox)
        cgroup = cgroups.slot_cgroup(uid - SANDBOX_UID_BASE) if uid is not None else None
        procs: tuple[str, ...] = ()
        if cgroup is not None:
            cgroup.prepare(limits.total_memory_mb << 20, limits.max_processes + 1)
            procs = tuple(str(p) for p in cgroup.procs_files())
            lease.callback(cgroup.kill_all)
        if self.level == "limits":
            return Confinement(None, procs, limits)  # the slot lends its cgroup only: the child keeps our uid
        lease.callback(kill_uid, uid)  # runs first: whatever of its uid is left, wherever it went
        hide = hidepid_available()
        if hide is not None:
            warn_once(f"a sandboxed child can list the host's processes in /proc: {hide}")
        return Confinement(uid, procs, limits, hide_processes=hide is None)


class _Child:
    def __init__(self, owner: Children, pid: int, pidfd: int, reader, writer, lease: ExitStack) -> None:
        self.owner, self.pid, self.pidfd = owner, pid, pidfd
        self.reader, self.writer, self.lease = reader, writer, lease
        self.gone: str | None = None  # why the child can no longer be called
        self.lock = asyncio.Lock()

    async def hello(self) -> list:
        return await read_reply(self.reader)

    async def call(self, method: str, args: tuple, kwargs: dict, text: bool) -> Any:
        if self.gone:
            if method == "close":
                return None  # nothing left to close: the failure that ended it was reported with that call
            raise EnvError(f"the environment's process is gone ({self.gone})")
        async with self.lock:
            try:
                self.writer.write(call_frame(method, args, kwargs, text))
                await self.writer.drain()
                status, value, flag = await read_reply(self.reader)
            except asyncio.CancelledError:  # the host's timeout (or its caller gave up): the call cannot be stopped
                self.owner.counts["children_killed"] += self.gone is None
                await asyncio.shield(self.kill(f"killed: {method} ran past its deadline"))
                raise
            except (EOFError, ConnectionError) as e:
                await self.died(e)
                raise EnvError(f"the environment's process died during {method}: {self.gone}") from None
            except ValueError as e:
                await self.kill(str(e))
                raise EnvError(str(e)) from None
        if status == "ok":
            return tuple(value) if flag else value
        if flag:
            raise ValueError(value)
        raise EnvError(value)

    async def died(self, e: BaseException) -> None:
        status = await self.owner._zygote.exit_status(self.pid, _EXIT_REPORT_WAIT_S)
        self.owner.counts["children_died"] += 1
        await self.kill(_how_it_ended(status))

    async def kill(self, why: str) -> None:
        """End the child and everything it started; idempotent."""
        if self.gone is None:
            self.gone = why
        if self.pidfd is None:
            return
        for kill in (lambda: signal.pidfd_send_signal(self.pidfd, signal.SIGKILL), lambda: os.killpg(self.pid, 9)):
            try:
                kill()
            except (ProcessLookupError, PermissionError):
                pass
        pidfd, self.pidfd = self.pidfd, None
        if self.owner.level != "process":  # the uid sweep (a /proc scan) and cgroup kill, then the slot is free
            await asyncio.to_thread(self.lease.close)
        os.close(pidfd)
        self.writer.close()
        self.owner.live -= 1

    async def stop(self) -> None:
        """The trajectory is over: let the child exit on EOF, kill what is left of it."""
        if self.pidfd is not None:
            self.writer.close()
            await self.owner._zygote.exit_status(self.pid, _EXIT_REPORT_WAIT_S)
            await self.kill("closed")


def _how_it_ended(status: int | None) -> str:
    if status is None:
        return "it ended and its exit status is unknown"
    code = os.waitstatus_to_exitcode(status)
    if code < 0:
        return f"killed by signal {signal.Signals(-code).name}"
    return f"it exited with code {code}"


class ChildEnv:
    """Base of the proxies: holds the child; the public methods come from the environment's class."""

    def __init__(self, child: _Child) -> None:
        self._child = child


@functools.lru_cache(maxsize=64)
def proxy_class(cls: type) -> type:
    """A ChildEnv subclass with an async forwarder for each of `cls`'s tools and reserved methods."""
    names = set(tool_functions(cls)) | {n for n in RESERVED_METHODS if callable(getattr(cls, n, None))}
    return type(f"{cls.__name__}InChild", (ChildEnv,), {n: _forwarder(cls, n) for n in sorted(names)})


def _forwarder(cls: type, name: str) -> Callable:
    fn = getattr(cls, name)

    async def forward(self: ChildEnv, *args: Any, **kwargs: Any) -> Any:
        return await self._child.call(name, args, kwargs, False)

    functools.update_wrapper(forward, fn)  # signature, annotations (and their module), docstring
    if isinstance(inspect.getattr_static(cls, name), staticmethod):  # an env.tools function: add the receiver
        params = list(inspect.signature(fn).parameters.values())
        receiver = inspect.Parameter("self", inspect.Parameter.POSITIONAL_ONLY)
        forward.__signature__ = inspect.signature(fn).replace(parameters=[receiver, *params])
    return forward


class _Zygote:
    def __init__(self, proc: subprocess.Popen, control: socket.socket) -> None:
        self.proc, self.control = proc, control
        self.dead = False
        self.ids = itertools.count()
        self.pending: dict[int, asyncio.Future] = {}
        self.exits: dict[int, int] = {}
        self.exit_waiters: dict[int, asyncio.Future] = {}

    @staticmethod
    async def start(modules: list[str]) -> _Zygote:
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        argv = [sys.executable, "-m", "agentrl_ray.envs.isolation.zygote", str(theirs.fileno()), *modules]
        # The zygote imports what this process can import (a test's module, a job's working dir), as a
        # multiprocessing child would.
        env = {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in sys.path if p)}
        proc = subprocess.Popen(argv, pass_fds=[theirs.fileno()], stdin=subprocess.DEVNULL, env=env)
        theirs.close()
        ours.setblocking(False)
        zygote = _Zygote(proc, ours)
        asyncio.get_running_loop().add_reader(ours.fileno(), zygote._receive)
        return zygote

    async def spawn(self, spec: ChildSpec, sock: socket.socket) -> tuple[int, int]:
        request = next(self.ids)
        future = self.pending[request] = asyncio.get_running_loop().create_future()
        message = pickle.dumps((request, spec))
        while True:
            try:
                socket.send_fds(self.control, [message], [sock.fileno()])
                break
            except BlockingIOError:
                await asyncio.sleep(0.001)
            except OSError as e:
                if e.errno == errno.EMSGSIZE:  # one message per datagram: the spec is bounded by the socket buffer
                    self.pending.pop(request)
                    raise EnvSetupError(
                        f"env.kwargs are too large to pass to the environment's process ({len(message)} "
                        "bytes pickled): pass a path to the data instead"
                    ) from None
                self._lost(f"the zygote is gone: {e}")
                raise EnvError(f"could not start the environment's process: {e}") from None
        return await future

    async def exit_status(self, pid: int, wait_s: float) -> int | None:
        if pid not in self.exits and not self.dead:
            waiter = self.exit_waiters.setdefault(pid, asyncio.get_running_loop().create_future())
            try:
                await asyncio.wait_for(asyncio.shield(waiter), wait_s)
            except TimeoutError:
                pass
            self.exit_waiters.pop(pid, None)
        return self.exits.pop(pid, None)

    def _receive(self) -> None:
        try:
            message, fds, _, _ = socket.recv_fds(self.control, 4096, 1)
        except BlockingIOError:
            return
        except OSError as e:
            message, fds = b"", []
            logger.warning("env zygote control socket failed: %s", e)
        if not message:
            self._lost(f"the zygote exited (status {self.proc.poll()})")
            return
        kind, a, b = json.loads(message)
        if kind == "started":
            future = self.pending.pop(a)
            if not future.done():
                future.set_result((b, fds[0]))
            else:  # its spawn was cancelled while the zygote forked it: nobody will talk to it
                signal.pidfd_send_signal(fds[0], signal.SIGKILL)
                os.close(fds[0])
        elif kind == "exited":
            self.exits[a] = b
            waiter = self.exit_waiters.get(a)
            if waiter is not None and not waiter.done():
                waiter.set_result(None)
            if len(self.exits) > 4096:  # statuses nobody asked for (closed children): keep memory bounded
                self.exits.pop(next(iter(self.exits)))

    def _lost(self, why: str) -> None:
        if self.dead:
            return
        self.dead = True
        asyncio.get_running_loop().remove_reader(self.control.fileno())
        self.control.close()
        for future in self.pending.values():
            if not future.done():
                future.set_exception(EnvError(why))
        for waiter in self.exit_waiters.values():
            if not waiter.done():
                waiter.set_result(None)
        self.pending.clear()
        logger.warning("env zygote lost: %s; the next environment starts a new one", why)
