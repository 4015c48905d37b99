"""The environment class a config names: "package.module:Class" (or a class given by value), checked against the
contract in `base.py`, with the plain functions of `env.tools` added as tools. `import_object` and `object_spec` also
serve reward functions and the Python API's objects.
"""

from __future__ import annotations

import base64
import functools
import importlib
import inspect
from typing import Any

from agentrl_ray.config.rollout import MCP_PREFIX
from agentrl_ray.envs.base import RESERVED_METHODS, Environment
from agentrl_ray.envs.tools import tool_functions, tool_schemas

BY_VALUE = "pickled:"  # a config value holding the object itself (see `object_spec`)


def object_spec(obj: Any, what: str) -> str:
    """How a config names a function or class given as a Python object (the Python API's tools, rewards, env).

    Its import path when it has one that resolves back to it: readable, the same string a YAML config would hold,
    and importable by Ray workers wherever the code is (an installed package, or a `ray job submit --working-dir`,
    which Ray puts on every worker's path). Otherwise (defined in `__main__`, a notebook, a closure) the object
    itself, pickled by value with cloudpickle as Ray does for such functions: a Ray worker cannot import
    `__main__:fn`, because its `__main__` is not the user's script.
    """
    module, qualname = getattr(obj, "__module__", None), getattr(obj, "__qualname__", "")
    if module and module != "__main__" and "<" not in qualname:
        path = f"{module}:{qualname}"
        try:
            if import_object(path, what) is obj:
                return path
        except (ImportError, AttributeError):
            pass
    import cloudpickle

    return BY_VALUE + base64.b64encode(cloudpickle.dumps(obj)).decode("ascii")


def import_object(path: str, what: str) -> Any:
    """Import "package.module:name" (dots allowed after the colon for nested attributes), or unpickle an object
    given by value (`object_spec`)."""
    if path.startswith(BY_VALUE):
        import cloudpickle

        try:
            return cloudpickle.loads(base64.b64decode(path.removeprefix(BY_VALUE)))
        except Exception as e:
            raise ValueError(f"{what} given by value cannot be unpickled here: {type(e).__name__}: {e}") from None
    module_name, sep, attr = path.partition(":")
    if not sep or not module_name or not attr:
        raise ValueError(f"{what} must be an import path 'package.module:Name', got {path!r}")
    try:
        module = importlib.import_module(module_name)
    except ImportError as e:
        raise ImportError(f"cannot import module {module_name!r} for {what} {path!r}: {e}") from e
    obj: Any = module
    for part in attr.split("."):
        try:
            obj = getattr(obj, part)
        except AttributeError:
            raise AttributeError(f"{what} {path!r}: module {module_name!r} has no attribute {attr!r}") from None
    return obj


def load_env_class(path: str) -> type:
    """The environment class at "package.module:Class" (or a served OpenEnv app's, "openenv:http://..."), checked
    against the contract."""
    from agentrl_ray.envs.adapters import openenv

    if path.startswith(openenv.SERVED):
        return _checked(openenv.served_class(path.removeprefix(openenv.SERVED)), path)
    cls = import_object(path, "environment")
    if not inspect.isclass(cls):
        raise TypeError(f"environment {path!r} must be a class, got {type(cls).__name__}")
    if openenv.is_openenv_class(cls):  # an OpenEnv environment, unchanged: our contract around it
        cls = openenv.adapt(cls)
    return _checked(cls, path)


def _checked(cls: type, path: str) -> type:
    if not callable(getattr(cls, "reset", None)):
        raise TypeError(f"environment class {path!r} must define reset(self, **row) (the TRL environment contract)")
    if callable(getattr(cls, "reward", None)) and callable(getattr(cls, "get_reward", None)):
        raise TypeError(f"environment class {path!r} defines both reward() and get_reward(): keep one")
    tool_schemas(cls)  # fail at load time, not mid-rollout, on a tool whose schema cannot be built
    return cls


@functools.lru_cache(maxsize=64)
def env_class(name: str, tools: tuple[str, ...] = ()) -> type:
    """The environment a config describes: `env.name`'s class with the plain functions of `env.tools` and the tools
    of the MCP servers of `env.mcp_servers` (entries "mcp:{...}", `EnvConfig.tool_specs`) added as tools, or, with
    an empty name, an environment of only those. A function tool gets its JSON schema from its signature and
    docstring, like a method; an MCP tool the schema its server lists (envs/adapters/mcp_tools.py)."""
    base = load_env_class(name) if name else Environment
    if not tools:
        return base
    servers = tuple(t for t in tools if t.startswith(MCP_PREFIX))
    added: dict[str, Any] = {}
    for spec in tools:
        if spec in servers:
            continue
        fn = import_object(spec, "tool")
        if not inspect.isfunction(fn):
            raise TypeError(f"tool {fn!r} must be a plain function (def or async def), got {type(fn).__name__}")
        taken = set(added) | set(tool_functions(base)) | RESERVED_METHODS
        if fn.__name__ in taken or fn.__name__.startswith("_"):
            raise ValueError(f"tool {fn.__name__!r}: the name is taken (or private) in environment {name or 'tools'}")
        added[fn.__name__] = staticmethod(fn)
    if servers:
        from agentrl_ray.envs.adapters import mcp_tools

        for tool, method in mcp_tools.server_methods(servers).items():
            if tool in added or tool in tool_functions(base) or tool in RESERVED_METHODS:
                raise ValueError(f"MCP tool {tool!r}: the name is taken in environment {name or 'tools'}")
            added[tool] = method
        added["close"] = _closing_mcp(getattr(base, "close", None))
    cls = type(f"{base.__name__}WithTools", (base,), added)
    tool_schemas(cls)
    return cls


def _closing_mcp(base_close: Any) -> Any:
    """`close` that ends the trajectory's MCP sessions (stopping their stdio servers), then runs the base's own."""
    from agentrl_ray.envs.adapters.mcp_tools import close_connections

    if inspect.iscoroutinefunction(base_close):

        async def close_async(self: Any) -> None:
            try:
                close_connections(self)
            finally:
                await base_close(self)

        return close_async

    def close(self: Any) -> None:
        try:
            close_connections(self)
        finally:
            if callable(base_close):
                base_close(self)

    return close
