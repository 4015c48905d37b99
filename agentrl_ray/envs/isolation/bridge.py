"""A sandboxed child's one way out: a Unix socket whose connections the host pipes to one TCP address.

A child confined at `sandbox` (`confine.py`) has a network namespace of its own with a downed loopback: no port of
this machine or any other is reachable. Where it must talk to one service (an agent program to its endpoint,
`rollout/endpoint/agents.py`), the host listens on a Unix socket under `SOCKETS` (a socket in the filesystem is
reachable from any network namespace; an abstract one is not) and pipes each connection to that service's address,
and to nothing else. The socket's name is random and `SOCKETS` may be listed by root only, so only the child told
the name finds it; `close` removes it and ends every connection through it.
"""

from __future__ import annotations

import asyncio
import functools
import os
import secrets
import stat
from pathlib import Path

SOCKETS = Path("/run/agentrl_ray-bridges")  # root's /run: a sandboxed child cannot plant this directory


class Bridge:
    def __init__(self, host: str, port: int) -> None:
        self.host, self.port = host, port
        self.path = _socket_dir() / f"{secrets.token_hex(16)}.sock"
        self.server: asyncio.AbstractServer | None = None
        self.writers: set[asyncio.StreamWriter] = set()

    @staticmethod
    async def open(host: str, port: int) -> Bridge:
        bridge = Bridge(host, port)
        bridge.server = await asyncio.start_unix_server(bridge._connection, path=str(bridge.path))
        os.chmod(bridge.path, 0o666)  # any uid may connect: finding it takes the name
        return bridge

    async def _connection(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            up_reader, up_writer = await asyncio.open_connection(self.host, self.port)
        except OSError:
            writer.close()
            return
        ends = {writer, up_writer}
        self.writers |= ends
        await asyncio.gather(_pipe(reader, up_writer), _pipe(up_reader, writer))
        self.writers -= ends

    def close(self) -> None:
        self.server.close()
        for writer in self.writers:
            writer.close()
        self.path.unlink(missing_ok=True)


async def _pipe(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    """Copy until either side ends; closing `writer` then ends the other direction too."""
    try:
        while data := await reader.read(1 << 16):
            writer.write(data)
            await writer.drain()
    except OSError:  # the other side went away
        pass
    finally:
        writer.close()


@functools.cache
def _socket_dir() -> Path:
    SOCKETS.mkdir(exist_ok=True)
    info = os.lstat(SOCKETS)
    if not stat.S_ISDIR(info.st_mode) or info.st_uid != 0:
        raise RuntimeError(f"{SOCKETS} must be a directory owned by root")
    os.chmod(SOCKETS, 0o711)  # enter (to connect to a name one knows), not list
    return SOCKETS
