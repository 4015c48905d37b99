"""The child side of `env.isolation = process | sandbox`: one trajectory's environment in a process of its own.

A child is forked by the zygote (`zygote.py`) with one end of a socket pair; it builds the environment, answers a
hello (the constructor's outcome), then serves calls until the host closes the socket. Messages are length-prefixed
frames: the host sends pickles (the host is trusted), the child answers JSON (the child may not be: under
`sandbox` it runs code the host must never unpickle). Every answer is `["ok", value, is_tuple]` or
`["error", detail, is_value_error]`; whatever the environment does, including raising `SystemExit`,
`KeyboardInterrupt` or any other `BaseException`, becomes such an answer or ends the process, which the host
reports as the trajectory's error. A tool's value is turned into text and cut to `max_output_chars` here, so a huge
or unprintable value never crosses the socket; no answer exceeds `MAX_REPLY_BYTES`.
"""

from __future__ import annotations

import asyncio
import inspect
import json
import pickle
import socket
import struct
from dataclasses import dataclass
from typing import Any

MAX_REPLY_BYTES = 4 << 20  # a child answering more is broken or hostile: its answer becomes an error
_HEADER = struct.Struct("!I")


@dataclass(frozen=True)
class ChildSpec:
    """What the zygote needs to start one trajectory's environment."""

    env_path: str
    tools: tuple[str, ...]
    env_kwargs: dict[str, Any]
    max_output_chars: int
    confinement: Any = None  # confine.Confinement under `sandbox`, else None

    # What the zygote calls (any spec it forks a child for has both; see zygote.py).
    def load(self) -> type:
        """The environment's class, loaded (cached) in the zygote before the fork and in the child before its
        confinement, which may lose read access to the venv."""
        from agentrl_ray.envs.loading import env_class

        return env_class(self.env_path, tuple(self.tools))

    def serve(self, sock: socket.socket, cls: type) -> None:
        serve(sock, self, cls)


def describe(e: BaseException, limit: int = 2000) -> str:
    """ "Type: message" of any exception, even one whose message cannot be printed, cut to `limit` characters."""
    try:
        text = str(e)
    except BaseException:  # noqa: BLE001 - a hostile __str__ must not take the caller down
        text = "<message could not be printed>"
    detail = f"{type(e).__name__}: {text}" if text else type(e).__name__
    return detail if len(detail) <= limit else detail[:limit] + f"... [{len(detail) - limit} more characters]"


def as_text(value: Any, limit: int) -> str:
    """A tool's value as the text the model sees: a str as is, anything else JSON-encoded; cut to `limit`."""
    text = value if isinstance(value, str) else json.dumps(value, ensure_ascii=False, default=str)
    if len(text) <= limit:
        return text
    return text[:limit] + f"\n[truncated {len(text) - limit} characters]"


# ---------------------------------------------------------------- framing (both sides)


def frame(body: bytes) -> bytes:
    """`body` length-prefixed, as every message on a child's socket is."""
    return _HEADER.pack(len(body)) + body


def send_frame(sock: socket.socket, body: bytes) -> None:
    sock.sendall(frame(body))


def recv_frame(sock: socket.socket) -> bytes | None:
    """The next frame, or None when the peer closed the socket."""
    header = _recv_exact(sock, _HEADER.size)
    return None if header is None else _recv_exact(sock, _HEADER.unpack(header)[0])


def _recv_exact(sock: socket.socket, n: int) -> bytes | None:
    buf = bytearray()
    while len(buf) < n:
        chunk = sock.recv(min(n - len(buf), 1 << 20))
        if not chunk:
            return None
        buf += chunk
    return bytes(buf)


async def read_reply(reader: asyncio.StreamReader, who: str = "the environment's process") -> list:
    """The child's next answer (host side). Raises EOFError when the child is gone, ValueError when its answer is
    over the size bound or not an answer."""
    try:
        (size,) = _HEADER.unpack(await reader.readexactly(_HEADER.size))
        if size > MAX_REPLY_BYTES:
            raise ValueError(f"{who} sent {size} bytes, over the {MAX_REPLY_BYTES} byte bound")
        reply = json.loads(await reader.readexactly(size))
    except asyncio.IncompleteReadError:
        raise EOFError from None
    except (json.JSONDecodeError, UnicodeDecodeError):
        raise ValueError(f"{who} sent something that is not JSON") from None
    if not (isinstance(reply, list) and len(reply) == 3 and reply[0] in ("ok", "error")):
        raise ValueError(f"{who} sent something that is not an answer")
    return reply


def call_frame(method: str, args: tuple, kwargs: dict[str, Any], text: bool) -> bytes:
    """A host->child call: `env.method(*args, **kwargs)`, its value as tool text when `text`."""
    return frame(pickle.dumps((method, args, kwargs, text)))


# ---------------------------------------------------------------- the child


def serve(sock: socket.socket, spec: ChildSpec, cls: type) -> None:
    """Build the environment (`cls`, the class `spec` names), answer the hello, then serve calls until the host
    closes the socket."""
    env = None
    try:
        env = cls(**spec.env_kwargs)
        hello = _encode(["ok", None, False])
    except BaseException as e:  # noqa: BLE001 - whatever it is, it is this trajectory's error, reported
        hello = _error(e, spec.max_output_chars)
    send_frame(sock, hello)
    while env is not None and (frame := recv_frame(sock)) is not None:
        method, args, kwargs, text = pickle.loads(frame)
        send_frame(sock, _invoke(env, method, args, kwargs, text, spec.max_output_chars))


def _invoke(env: Any, method: str, args: tuple, kwargs: dict, text: bool, limit: int) -> bytes:
    try:
        value = getattr(env, method)(*args, **kwargs)
        if inspect.isawaitable(value):
            value = asyncio.run(_awaited(value))
        if text:
            value = as_text(value, limit)
        body = _encode(["ok", value, isinstance(value, tuple)])
    except BaseException as e:  # noqa: BLE001
        return _error(e, limit)
    if len(body) > MAX_REPLY_BYTES:
        return _encode(["error", f"{method} returned {len(body)} bytes, over the {MAX_REPLY_BYTES} byte bound", 0])
    return body


async def _awaited(awaitable: Any) -> Any:
    return await awaitable


def _error(e: BaseException, limit: int) -> bytes:
    is_value_error = isinstance(e, ValueError)  # a tool's "bad input": its message alone is the observation
    detail = describe(e, limit)
    if is_value_error:
        detail = detail.removeprefix(f"{type(e).__name__}: ")
    try:
        return _encode(["error", detail[:limit], is_value_error])
    except BaseException:  # noqa: BLE001 - e.g. a str subclass json cannot encode
        return _encode(["error", type(e).__name__, False])


def _encode(reply: list) -> bytes:
    return json.dumps(reply, ensure_ascii=False).encode()
