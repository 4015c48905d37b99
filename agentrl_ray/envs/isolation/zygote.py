"""The zygote of `env.isolation = process | sandbox`: a small single-threaded process that forks one child per
trajectory. It serves user environments (`child.ChildSpec`) and agent programs (`rollout/endpoint/agents.py`'s
`AgentSpec`) alike: a spec says what to load before the fork (`load()`), how to confine the child
(`confinement`, `confine.py`) and what the child then does with its socket (`serve(sock, loaded)`).

Why a zygote: forking the env host itself (a Ray actor with gRPC and thread pools) is unsafe, and starting a fresh
interpreter per trajectory costs ~100 ms and its own memory. The zygote starts once per env host, imports the
environment's module, and forks: a child costs a fork, shares the zygote's memory copy-on-write, and can be killed
without touching anything else.

Protocol on the control socket (SOCK_SEQPACKET, one message per datagram, file descriptors attached):
- host -> zygote: pickle((request_id, spec)) with the child's end of its socket pair attached; a spec holds no
  per-trajectory data (a row, a key): what one child is sent after its fork, on its own socket, never passes
  through the zygote, whose memory every later child inherits;
- zygote -> host: JSON ["started", request_id, pid] with a pidfd of the child attached (the host kills by pidfd:
  no pid-reuse race), and ["exited", pid, wait_status] when the zygote reaps a child, so the host can say how an
  environment died (a signal, an exit code).
The zygote exits when the host closes the control socket, killing the children it still has.

Run by the host as `python -m agentrl_ray.envs.isolation.zygote CONTROL_FD [MODULE ...]`.
"""

from __future__ import annotations

import gc
import importlib
import json
import os
import pickle
import select
import signal
import socket
import sys

_MAX_REQUEST = 1 << 24  # a spec holds env.kwargs and nothing per row; 16 MiB is far above any real one


def main(argv: list[str]) -> None:
    control = socket.socket(fileno=int(argv[0]))
    # Everything a child needs is imported here, before a sandboxed child drops to a uid that may not read the venv.
    preload = (
        "agentrl_ray.envs.loading",
        "agentrl_ray.envs.tools",
        "agentrl_ray.envs.isolation.child",
        "agentrl_ray.envs.isolation.confine",
        "cloudpickle",
    )
    for module in (*preload, *argv[1:]):
        try:
            importlib.import_module(module)  # shared copy-on-write by every child; a failure shows in the child
        except Exception:  # noqa: BLE001
            pass
    children: dict[int, int] = {}  # our pidfd of a child -> its pid
    poller = select.poll()
    poller.register(control, select.POLLIN)
    while True:
        for fd, _ in poller.poll():
            if fd != control.fileno():
                pid = children.pop(fd)
                poller.unregister(fd)
                os.close(fd)
                _, status = os.waitpid(pid, 0)
                _tell(control, ["exited", pid, status])
                continue
            try:
                message, fds, _, _ = socket.recv_fds(control, _MAX_REQUEST, 1)
            except ConnectionError:
                message = b""
            if not message:  # the host is gone: so are its environments
                for pid in children.values():
                    _kill_group(pid)
                return
            request_id, spec = pickle.loads(message)
            _warm(spec)
            pid = _fork_child(fds[0], spec, control, list(children))
            os.close(fds[0])
            pidfd = os.pidfd_open(pid)  # not reaped before we poll it: the pid is still this child's
            children[pidfd] = pid
            poller.register(pidfd, select.POLLIN)
            _tell(control, ["started", request_id, pid], [pidfd])


def _warm(spec) -> None:
    """Load what the spec needs here (once: `load` is cached), so that a child starts with it loaded, and move
    everything loaded so far out of the garbage collector's reach (`gc.freeze`): a child's collections then do not
    touch, and so copy, the zygote's memory. Measured: ~10 ms of CPU per child without, see docs/reliability.md."""
    try:
        loaded = spec.load()  # a cache hit after the first time
    except Exception:  # noqa: BLE001 - the child fails the same way and reports it
        return
    if id(loaded) not in _warm.seen:
        _warm.seen.add(id(loaded))  # cached objects: their ids stay theirs
        gc.freeze()


_warm.seen = set()


def _fork_child(fd: int, spec, control: socket.socket, sibling_pidfds: list[int]) -> int:
    pid = os.fork()
    if pid:
        return pid
    code = 0
    try:
        control.close()
        for pidfd in sibling_pidfds:  # a child must not hold handles on its siblings
            os.close(pidfd)
        signal.signal(signal.SIGINT, signal.SIG_DFL)
        os.setsid()  # its own process group: the host kills what it forked with it
        sock = socket.socket(fileno=fd)
        # Loaded (imports, unpickling what was given by value) before the confinement, which may lose read access
        # to the venv; a cache hit after `_warm`.
        loaded = spec.load()
        if spec.confinement is not None:
            from agentrl_ray.envs.isolation.confine import confine

            confine(spec.confinement, keep_fd=fd)
        spec.serve(sock, loaded)
    except BaseException:  # noqa: BLE001 - the host sees the exit code and reports the environment as failed
        code = 70
    os._exit(code)  # never return into the zygote's loop (nor run its atexit handlers)


def _tell(control: socket.socket, message: list, fds: list[int] = ()) -> None:
    try:
        socket.send_fds(control, [json.dumps(message).encode()], list(fds))  # the host gets its own pidfd copy
    except OSError:
        pass  # the host is gone; the next poll sees it


def _kill_group(pid: int) -> None:
    try:
        os.killpg(pid, signal.SIGKILL)  # not reaped yet, so the group is still this child's
    except (ProcessLookupError, PermissionError):
        pass


if __name__ == "__main__":
    main(sys.argv[1:])
