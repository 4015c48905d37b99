"""OpenEnv environments (`openenv` 0.10.0), unchanged: `env.name` names the OpenEnv class itself.

    env:
      name: my_package.envs:MyEnvironment      # an openenv Environment subclass; env.kwargs go to its constructor

`envs.loading` sees an `openenv.core.env_server.interfaces.Environment` subclass and hands it to `adapt`, which
makes a class of our contract (`envs.base`) around it, one OpenEnv instance per trajectory:

- **An `MCPEnvironment`** (tools served by its FastMCP server) becomes a tool environment: its `ListToolsAction`
  answer, listed once per process, gives the tools and their JSON schemas (what the model sees in the system
  prompt); a call the model makes is `step(CallToolAction(name, arguments))`, checked against the schema first. The
  result's text is the observation; a `ToolError` is an "Error: ..." observation and a tool-error metric, as for our
  own tools. The rewards its observations carry add up to the trajectory's `get_reward()` (the `env_reward`
  function); once one says `done`, later calls answer that the episode is over.
- **Any other `Environment[Action, Observation, State]`** becomes a turn-based environment: the assistant's whole
  turn is the action (an action model with one required string field gets the text in it; any other is read from
  the turn as a JSON object, and one that does not validate is an observation naming its errors, so the policy
  sees them), the observation is the next user turn, and `done` and `reward` come from it (rewards summed).
- `reset(**row)` is `reset(seed=row's seed, else one from its id, episode_id=row's id)`; its observation is
  appended to the prompt. An observation as text: its fields other than `done`, `reward` and `metadata` (its
  `metadata` where it has no other), the one string among them as it is, else all of them as JSON.

**A served app** (`create_app(...)` / `create_fastapi_app(...)` on a port, in a container, on a Space) is reached
over its WebSocket, one session per trajectory, with no package of the environment's installed here:

    env:
      name: openenv:http://127.0.0.1:8000      # or agentrl_ray.envs.adapters.openenv:OpenEnvServer, kwargs.url

Its `/schema` says which shape it is. An app whose action is OpenEnv's `CallToolAction` (an `MCPEnvironment`) is a
tool environment as above, through OpenEnv's `MCPToolClient`: tools listed once per process, each call a
`CallToolAction` step, the rewards and `done` its step results carry (a served `MCPEnvironment` answers through its
`step_async`: that is where its rewards must be set). Any other app is turn-based through OpenEnv's
`GenericEnvClient`: the action's fields come from `/schema` (read once per process), and an action read from JSON is
checked against that schema before it is sent (an error observation otherwise). (Its `/mcp` route answers
`tools/list` and `tools/call` but not MCP's `initialize`: an MCP client of `env.mcp_servers` cannot connect to it.)
The server's environment runs in the server's processes: our isolation covers the client side only.
"""

from __future__ import annotations

import functools
import json
import sys
import typing
import zlib
from types import SimpleNamespace
from typing import Any

INSTALL = (
    "pip install --no-deps openenv==0.10.0 fastmcp==4.2.3 fastmcp-slim==4.2.3 py-key-value-aio beartype "
    "exceptiongroup joserfc uncalled-for (its declared fastmcp<4 needs mcp<2; make install does this)"
)
BASE_FIELDS = frozenset({"done", "reward", "metadata"})


def is_openenv_class(cls: type) -> bool:
    """Whether `cls` is an OpenEnv environment (without importing openenv where the class's module did not)."""
    interfaces = sys.modules.get("openenv.core.env_server.interfaces")
    return interfaces is not None and isinstance(cls, type) and issubclass(cls, interfaces.Environment)


@functools.cache
def adapt(cls: type) -> type:
    """A class of our contract around the OpenEnv environment class `cls` (one per process)."""
    from openenv.core.env_server.mcp_environment import MCPEnvironment

    if issubclass(cls, MCPEnvironment):
        return _tool_environment(cls)
    return type(f"OpenEnv{cls.__name__}", (_TurnBased,), {"_openenv_class": cls, "_action": _action_class(cls)})


class _Trajectory:
    """What both shapes share: one OpenEnv instance per trajectory, reset with the row."""

    _openenv_class: type

    def __init__(self, **kwargs: Any) -> None:
        self._kwargs = kwargs
        self._env: Any = None
        self._reward: float | None = None
        self._done = False

    def reset(self, **row: Any) -> str | None:
        self.close()
        self._env = self._openenv_class(**self._kwargs)
        self._reward, self._done = None, False
        seed = row.get("seed")
        if seed is None:
            seed = zlib.crc32(str(row.get("id", "")).encode())
        observation = self._env.reset(seed=int(seed), episode_id=str(row.get("id", "")) or None)
        self._take(observation)
        return observation_text(observation) or None

    def _take(self, observation: Any) -> None:
        if getattr(observation, "reward", None) is not None:
            self._reward = (self._reward or 0.0) + float(observation.reward)
        self._done = self._done or bool(getattr(observation, "done", False))

    def close(self) -> None:
        if self._env is not None:
            env, self._env = self._env, None
            env.close()


class _TurnBased(_Trajectory):
    _action: type

    def step(self, text: str) -> tuple[str | None, float, bool]:
        if self._env is None:
            raise RuntimeError("step before reset")
        action, error = text_action(self._action, text)
        if action is None:
            return error, 0.0, False  # the policy sees what it got wrong; the episode goes on
        observation = self._env.step(action)
        reward = float(observation.reward or 0.0)
        self._take(observation)
        return (None if self._done else observation_text(observation)), reward, self._done


class _Tools(_Trajectory):
    def get_reward(self) -> float | None:
        """The rewards the observations of this trajectory carried, added up (None: none carried one)."""
        return self._reward


def _tool_environment(cls: type) -> type:
    from openenv.core.env_server.mcp_types import ListToolsAction

    probe = cls()
    try:
        listed = probe.step(ListToolsAction()).tools
    finally:
        probe.close()
    methods: dict[str, Any] = {"_openenv_class": cls}
    for tool in listed:
        schema = {
            "type": "function",
            "function": {
                "name": tool.name,
                "description": tool.description or "",
                "parameters": tool.input_schema or {"type": "object", "properties": {}},
            },
        }
        methods[tool.name] = _tool_method(schema)
    return type(f"OpenEnv{cls.__name__}", (_Tools,), methods)


def _tool_method(schema: dict) -> Any:
    """One tool of the environment's server as a method: `step(CallToolAction(...))` on the trajectory's instance.
    `__tool_schema__` is the schema the model sees (envs.tools.function_schema takes it as it is)."""
    from openenv.core.env_server.mcp_types import CallToolAction

    from agentrl_ray.envs.adapters.mcp_tools import check_arguments, result_text

    name, parameters = schema["function"]["name"], schema["function"]["parameters"]

    def call(self: _Trajectory, **arguments: Any) -> str:
        if self._env is None:
            raise RuntimeError("tool call before reset")
        if self._done:
            raise ValueError("the episode is over: the environment said done")
        check_arguments(arguments, parameters)
        observation = self._env.step(CallToolAction(tool_name=name, arguments=arguments))
        self._take(observation)
        if observation.error is not None:
            raise ValueError(observation.error.message or str(observation.error.error_type))
        result = observation.result
        if isinstance(result, dict) and "content" in result:  # served: the CallToolResult as JSON
            result = SimpleNamespace(
                content=[SimpleNamespace(**block) for block in result["content"] or []],
                structured_content=result.get("structured_content"),
            )
        return result_text(result) if hasattr(result, "content") else _text(result)

    call.__name__ = call.__qualname__ = name
    call.__doc__ = schema["function"]["description"]
    call.__tool_schema__ = schema  # type: ignore[attr-defined]
    return call


def _action_class(cls: type) -> type:
    """The action model of `Environment[Action, Observation, State]`: its first type argument, else `step`'s."""
    for base in getattr(cls, "__orig_bases__", ()):
        args = typing.get_args(base)
        if args and isinstance(args[0], type):
            return args[0]
    hint = typing.get_type_hints(cls.step).get("action")
    if isinstance(hint, type):
        return hint
    raise TypeError(f"OpenEnv environment {cls.__name__}: cannot tell its action model (Environment[Action, ...])")


def text_action(action_class: type, text: str) -> tuple[Any, str]:
    """(the action the assistant's turn spells, "") or (None, what is wrong with it)."""
    from pydantic import ValidationError

    required = [n for n, f in action_class.model_fields.items() if f.is_required() and n not in BASE_FIELDS]
    if len(required) == 1 and action_class.model_fields[required[0]].annotation is str:
        return action_class(**{required[0]: text}), ""
    fields, error = _json_fields(text, required)
    if fields is None:
        return None, error
    try:
        return action_class.model_validate(fields), ""
    except ValidationError as e:
        return None, f"Error: the action does not validate: {e}"


def _json_fields(text: str, required: list[str]) -> tuple[dict[str, Any] | None, str]:
    """The JSON object a turn spells (a ```json fence allowed), or (None, what is wrong with it)."""
    body = text.strip().removeprefix("```json").removeprefix("```").removesuffix("```").strip()
    try:
        fields = json.loads(body)
    except (ValueError, RecursionError) as e:
        return None, f"Error: the action must be a JSON object with the fields {required} ({e})"
    if not isinstance(fields, dict):
        return None, f"Error: the action must be a JSON object with the fields {required}"
    return fields, ""


def observation_text(observation: Any) -> str:
    return fields_text(observation.model_dump())


def fields_text(observation: dict[str, Any]) -> str:
    """An observation's fields as text: its own (else its metadata), the one string among them as it is, else JSON."""
    fields = {k: v for k, v in observation.items() if k not in BASE_FIELDS} or dict(observation.get("metadata") or {})
    if len(fields) == 1 and isinstance(next(iter(fields.values())), str):
        return next(iter(fields.values()))
    return _text(fields) if fields else ""


# ---------------------------------------------------------------------------------------------------- a served app


@functools.cache
def _action_schema(url: str) -> dict[str, Any]:
    import httpx

    response = httpx.get(f"{url.rstrip('/')}/schema", timeout=30)
    response.raise_for_status()
    return response.json()["action"]


class OpenEnvServer:
    """A served OpenEnv environment, turn-based, one WebSocket session per trajectory (see the module's docstring)."""

    def __init__(self, url: str) -> None:
        try:
            from openenv.core.generic_client import GenericEnvClient
        except ModuleNotFoundError:
            raise ModuleNotFoundError(f"OpenEnvServer needs the openenv package: {INSTALL}") from None
        self._client_class = GenericEnvClient
        self.url = url
        self.schema = _action_schema(url)
        self._client: Any = None
        self._done = False

    def reset(self, **row: Any) -> str | None:
        self.close()
        self._client = self._client_class(base_url=self.url).sync()
        seed = row.get("seed")
        if seed is None:
            seed = zlib.crc32(str(row.get("id", "")).encode())
        result = self._client.reset(seed=int(seed), episode_id=str(row.get("id", "")) or None)
        self._done = bool(result.done)
        return fields_text(result.observation or {}) or None

    def step(self, text: str) -> tuple[str | None, float, bool]:
        if self._client is None:
            raise RuntimeError("step before reset")
        action, error = schema_action(self.schema, text)
        if action is None:
            return error, 0.0, False
        result = self._client.step(action)
        self._done = bool(result.done)
        return (None if self._done else fields_text(result.observation or {})), float(result.reward or 0.0), self._done

    def close(self) -> None:
        if self._client is not None:
            client, self._client = self._client, None
            client.close()


def schema_action(schema: dict[str, Any], text: str) -> tuple[dict[str, Any] | None, str]:
    """`text_action` for an action known by its JSON schema: the dict to send, or (None, what is wrong)."""
    from agentrl_ray.envs.adapters.mcp_tools import check_arguments

    properties = schema.get("properties") or {}
    required = [n for n in schema.get("required") or [] if n not in BASE_FIELDS]
    if len(required) == 1 and (properties.get(required[0]) or {}).get("type") == "string":
        return {required[0]: text}, ""
    fields, error = _json_fields(text, required)
    if fields is None:
        return None, error
    try:
        check_arguments(fields, schema)
    except ValueError as e:
        return None, f"Error: the action does not validate: {e}"
    return fields, ""


def _text(value: Any) -> str:
    return value if isinstance(value, str) else json.dumps(value, default=str)


SERVED = "openenv:"  # env.name "openenv:http://host:port": a served app (envs.loading)


def served_class(url: str) -> type:
    """The environment class of the app served at `url`: tools for an `MCPEnvironment`'s, else turn-based."""
    if not url.startswith(("http://", "https://")):
        raise ValueError(f"env.name {SERVED}{url!r}: expected {SERVED}http://host:port (a served OpenEnv app)")
    if "tool_name" not in _action_schema(url).get("properties", {}):
        return type("OpenEnvServed", (OpenEnvServer,), {"__init__": lambda self: OpenEnvServer.__init__(self, url)})
    return _tool_environment(type("ServedMCPEnvironment", (_ServedMCP,), {"url": url}))


class _ServedMCP:
    """A served `MCPEnvironment` as an instance `_Trajectory` drives: a session of OpenEnv's MCPToolClient (its
    WebSocket); each step result's reward and `done` on its observation, as an in-process step returns them."""

    url: str

    def __init__(self) -> None:
        from openenv.core.mcp_client import MCPToolClient

        self._client = MCPToolClient(base_url=self.url).sync()

    def reset(self, **kwargs: Any) -> Any:
        return self._observation(self._client.reset(**kwargs))

    def step(self, action: Any) -> Any:
        return self._observation(self._client.step(action))

    def close(self) -> None:
        self._client.close()

    @staticmethod
    def _observation(result: Any) -> Any:
        observation = result.observation
        observation.reward = result.reward if result.reward is not None else observation.reward
        observation.done = bool(result.done or observation.done)
        return observation
