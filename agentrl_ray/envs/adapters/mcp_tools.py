"""MCP tool servers as tools of any environment: `env.mcp_servers`.

    env:
      name: ""                       # or any environment class: the servers' tools are added to its own
      mcp_servers:
        - {command: python, args: [-m, my_package.server]}     # stdio: a subprocess per trajectory
        - {url: "http://tools.internal:8000/mcp"}               # Streamable HTTP: a session per trajectory
        - {command: python, args: [-m, pkg.stateless], shared: true}  # one session (and server) per process

Each server's `list_tools` becomes tool schemas (its `inputSchema` as the function's parameters, as the model sees
them in the system prompt); a call the model makes goes to `call_tool(name, arguments)` on that server. Arguments
are checked against the schema first (a missing or mistyped argument is an error observation naming it, as for our
own tools); a result with `is_error` becomes an "Error: ..." observation; text content is the observation (other
content blocks are described, structured content alone is JSON).

A stdio server is started lazily, at a trajectory's first call to one of its tools, and stopped when the trajectory
ends (`close`): its state is the trajectory's own, as an environment instance's is, and it runs at the trajectory's
`env.isolation` (inside its child process at `process`; at `sandbox` with no network, so only stdio servers whose
files the sandbox can read). Listing the tools starts the server once more per process that builds the class (the
driver's pre-flight, each env host). The server's stderr goes to a file whose tail is quoted when it fails to start.

Starting a server costs its interpreter and imports (~1 CPU-s for a Python MCPServer), per trajectory. A stateless
server can say `shared: true`: one session per process, which at `env.isolation: thread` is one per env host for all
its trajectories. A shared session that breaks (its server died) costs the calls in flight; the next call starts the
server again.

This module needs the `mcp` package (2.x), which vLLM's CPU wheel already pulls in: `pip install 'mcp>=2.3'`.
"""

from __future__ import annotations

import asyncio
import atexit
import concurrent.futures
import functools
import inspect
import json
import os
import sys
import tempfile
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

from agentrl_ray.config.rollout import MCP_PREFIX

CONNECT_TIMEOUT_S = 60.0


def _entry(spec: str) -> dict[str, Any]:
    return json.loads(spec.removeprefix(MCP_PREFIX))


def _describe(entry: dict[str, Any]) -> str:
    return entry.get("url") or " ".join([entry["command"], *entry.get("args", [])])


def _command(command: str) -> str:
    """`python` is the interpreter that runs the trainer (a venv's, which need not be on PATH)."""
    return sys.executable if command in ("python", "python3") else command


def _server_env(extra: dict[str, str] | None) -> dict[str, str]:
    """What the SDK passes (its safe defaults: HOME, PATH, ...), plus PYTHONPATH, which carries the user's folders
    (infra/user_code.py) so that `python -m their.server` resolves as the config's import paths do, plus the
    entry's own `env`."""
    env = {"PYTHONPATH": os.environ["PYTHONPATH"]} if os.environ.get("PYTHONPATH") else {}
    return {**env, **(extra or {})}


def _innermost(e: BaseException) -> str:
    """The first leaf of an exception group (the SDK's task groups wrap what went wrong), as "Type: message"."""
    while isinstance(e, BaseExceptionGroup) and e.exceptions:
        e = e.exceptions[0]
    return f"{type(e).__name__}: {e}"


class Connection:
    """One MCP client session to one server, on an event loop of its own (a daemon thread), used synchronously.

    One task owns the client from connect to close (the SDK's task groups must be left by the task that entered
    them); calls from other threads are scheduled on that loop.
    """

    def __init__(self, entry: dict[str, Any], timeout_s: float = CONNECT_TIMEOUT_S) -> None:
        self.entry = entry
        self.client: Any = None
        self._stderr = tempfile.NamedTemporaryFile("w+", prefix="mcp-server-", suffix=".log")  # noqa: SIM115
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, name="mcp-client", daemon=True)
        self._thread.start()
        self._ready: concurrent.futures.Future = concurrent.futures.Future()
        self._closing: asyncio.Event | None = None
        self._owner = asyncio.run_coroutine_threadsafe(self._own(), self._loop)
        try:
            self._ready.result(timeout_s)
        except BaseException as e:
            why = f"no answer in {timeout_s:g} s" if isinstance(e, TimeoutError) else _innermost(e)
            message = f"MCP server {_describe(entry)!r} did not start: {why}{self._stderr_tail()}"
            self.close()
            raise RuntimeError(message) from None

    async def _own(self) -> None:
        from mcp import Client
        from mcp.client.stdio import StdioServerParameters, stdio_client

        self._closing = asyncio.Event()
        try:
            if "url" in self.entry:
                server: Any = self.entry["url"]
            else:
                params = StdioServerParameters(
                    command=_command(self.entry["command"]),
                    args=list(self.entry.get("args", [])),
                    env=_server_env(self.entry.get("env")),
                    cwd=self.entry.get("cwd"),
                )
                server = stdio_client(params, errlog=self._stderr)
            async with Client(server) as client:
                self.client = client
                self._ready.set_result(None)
                await self._closing.wait()
        except BaseException as e:
            if not self._ready.done():
                self._ready.set_exception(e)
            raise

    def run(self, coro_fn: Callable[[Any], Any], timeout_s: float | None) -> Any:
        return asyncio.run_coroutine_threadsafe(coro_fn(self.client), self._loop).result(timeout_s)

    def list_tools(self, timeout_s: float = CONNECT_TIMEOUT_S) -> list[Any]:
        async def every(client: Any) -> list[Any]:
            tools, cursor = [], None
            while True:
                page = await client.list_tools(cursor=cursor)
                tools.extend(page.tools)
                cursor = getattr(page, "next_cursor", None)
                if not cursor:
                    return tools

        return self.run(every, timeout_s)

    def call(self, name: str, arguments: dict[str, Any], timeout_s: float | None = None) -> Any:
        return self.run(lambda client: client.call_tool(name, arguments), timeout_s)

    def close(self) -> None:
        """Stop the session (and a stdio server's process) and the loop; safe to call twice."""
        if self._loop.is_closed():
            return
        if self._closing is not None:
            self._loop.call_soon_threadsafe(self._closing.set)
        try:
            self._owner.result(10)
        except BaseException:  # noqa: BLE001 - a server that failed or hangs on exit: the loop goes anyway
            self._owner.cancel()
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(10)
        if not self._thread.is_alive():
            self._loop.close()
        self._stderr.close()

    def _stderr_tail(self, lines: int = 8) -> str:
        try:
            self._stderr.flush()
            text = Path(self._stderr.name).read_text(errors="replace").strip().splitlines()[-lines:]
        except OSError:
            return ""
        return ("; its stderr ends:\n" + "\n".join(text)) if text else ""


@functools.lru_cache(maxsize=32)
def server_tools(spec: str) -> tuple[dict, ...]:
    """The OpenAI tool schemas of the server `spec` names, listed once per process."""
    entry = _entry(spec)
    connection = Connection(entry)
    try:
        tools = connection.list_tools()
    finally:
        connection.close()
    if not tools:
        raise ValueError(f"MCP server {_describe(entry)!r} lists no tools")
    return tuple(
        {
            "type": "function",
            "function": {
                "name": t.name,
                "description": inspect.cleandoc(t.description or t.title or t.name),
                "parameters": _untitled(t.input_schema or {"type": "object", "properties": {}}),
            },
        }
        for t in tools
    )


def _untitled(schema: dict[str, Any]) -> dict[str, Any]:
    """The input schema without the `title` keys pydantic-built servers add to it and each property ("A" for `a`):
    prompt tokens that tell the model nothing."""
    out = {k: v for k, v in schema.items() if k != "title"}
    if isinstance(out.get("properties"), dict):
        out["properties"] = {k: _property(v) for k, v in out["properties"].items()}
    return out


def _property(schema: Any) -> Any:
    """A property without its title, `type` first as our own tools write it (the prompt reads the same)."""
    if not isinstance(schema, dict):
        return schema
    rest = {k: v for k, v in schema.items() if k not in ("title", "type")}
    return {**({"type": schema["type"]} if "type" in schema else {}), **rest}


def result_text(result: Any) -> str:
    """What the model reads of a `CallToolResult`: its text blocks; other blocks by type; else its structured
    content as JSON."""
    parts = []
    for block in result.content or []:
        text = getattr(block, "text", None)
        parts.append(text if isinstance(text, str) else f"[{getattr(block, 'type', 'content')} content]")
    if not parts and getattr(result, "structured_content", None) is not None:
        parts.append(json.dumps(result.structured_content))
    return "\n".join(parts)


def check_arguments(arguments: dict[str, Any], schema: dict[str, Any]) -> None:
    """The model's arguments against the tool's input schema; the first problem as a ValueError (the host's error
    observation puts the tool's name before it)."""
    import jsonschema

    try:
        jsonschema.validate(arguments, schema)
    except jsonschema.ValidationError as e:
        where = "/".join(str(p) for p in e.absolute_path)
        raise ValueError(f"{('argument ' + where + ': ') if where else ''}{e.message}") from None
    except jsonschema.SchemaError as e:
        raise ValueError(f"the server's input schema is not valid JSON schema: {e.message}") from None


_shared: dict[str, Connection] = {}
_shared_lock = threading.Lock()


def connection(env: Any, spec: str) -> Connection:
    """The session a call of trajectory `env` goes through: its own, opened at its first call, or with `shared:
    true` the process's one (opened at the first call of any trajectory, closed at exit)."""
    if _entry(spec).get("shared"):
        with _shared_lock:
            if spec not in _shared:
                if not _shared:
                    atexit.register(_close_shared)
                _shared[spec] = Connection(_entry(spec))
            return _shared[spec]
    opened = env.__dict__.setdefault("_mcp_connections", {})
    if spec not in opened:
        opened[spec] = Connection(_entry(spec))
    return opened[spec]


def _lost(spec: str, e: BaseException) -> RuntimeError:
    """A call that failed outside the tool (the server died, the session broke): a shared session is dropped so that
    the next call starts the server again; the trajectory's error says what happened."""
    with _shared_lock:
        gone = _shared.pop(spec, None)
    if gone is not None:
        gone.close()
    return RuntimeError(f"MCP server {_describe(_entry(spec))!r}: {_innermost(e)}")


def _close_shared() -> None:
    with _shared_lock:
        opened = list(_shared.values())
        _shared.clear()
    for c in opened:
        c.close()


def close_connections(env: Any) -> None:
    for c in env.__dict__.pop("_mcp_connections", {}).values():
        c.close()


def tool_method(spec: str, schema: dict) -> Callable:
    """A method of the environment class that forwards one tool to its server. `__tool_schema__` is the schema the
    model sees (envs.tools.function_schema takes it as it is)."""
    name, parameters = schema["function"]["name"], schema["function"]["parameters"]

    def call(self: Any, **arguments: Any) -> str:
        check_arguments(arguments, parameters)
        try:
            result = connection(self, spec).call(name, arguments)
        except Exception as e:  # noqa: BLE001 - what the server's process or transport did, as this call's error
            raise _lost(spec, e) from None
        text = result_text(result)
        if result.is_error:  # the SDK's MCPServer prefixes this to a ToolError's text: the host names the tool already
            raise ValueError(text.removeprefix(f"Error executing tool {name}: ") or "the tool reported an error")
        return text

    call.__name__ = call.__qualname__ = name
    call.__doc__ = schema["function"]["description"]
    call.__tool_schema__ = schema  # type: ignore[attr-defined]
    return call


def server_methods(specs: tuple[str, ...]) -> dict[str, Callable]:
    """{tool name: method} of every server in `specs`."""
    methods: dict[str, Callable] = {}
    for spec in specs:
        for schema in server_tools(spec):
            name = schema["function"]["name"]
            if name in methods:
                raise ValueError(f"MCP tool {name!r} is listed by two servers of env.mcp_servers")
            methods[name] = tool_method(spec, schema)
    return methods
