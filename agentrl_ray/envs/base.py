"""The environment contract: a plain Python class whose public methods are the agent's tools.

It is the contract of TRL's `GRPOTrainer(environment_factory=...)`, so an environment written for TRL runs here
unchanged:

- `__init__(**env.kwargs)`: built once per trajectory (on an env actor), with the config's `env.kwargs`.
- `reset(self, **row) -> str | None`: receives the dataset row (every column as a keyword). Text it returns is
  appended to the last user message of the prompt.
- Every public method (a name not starting with `_`) that is not a reserved name below is a tool. Its JSON schema
  (what the model sees in the system prompt) comes from the type hints and the docstring (Google, NumPy or Sphinx
  style). A tool returns a string (other values are JSON-encoded) or raises; a raised error becomes an
  "Error: ..." observation for the policy and a tool-error metric, it never ends the rollout. Tools may be
  `async def`.
- Reserved, never tools: `reset`, `close` (optional cleanup, called once when the trajectory ends), `get_reward`
  (optional, TRL's spelling: `get_reward(self) -> float | None` from the env's own state) or `reward` (optional,
  ours: `reward(self, completion: str) -> float | None`, given the final assistant message), and `step`.
- Turn-based environments (a user simulator, a text game) define `step(self, text: str) -> (observation: str |
  None, reward: float, done: bool)` instead of tools: `text` is the assistant's whole turn, `observation` becomes
  the next user message, the episode ends at `done`, and unless the env defines `reward`/`get_reward` its reward
  is the sum of its step rewards. The env host serves them through `call_turn`.

Environments are found by import path ("package.module:Class"), so users add one without editing this package.
Inheriting from `Environment` is optional; it only documents the contract.
"""

from __future__ import annotations

import base64
import enum
import functools
import importlib
import inspect
import math
import re
import types
import typing
from collections.abc import Callable
from typing import Any

import docstring_parser

RESERVED_METHODS = frozenset({"reset", "close", "reward", "get_reward", "step"})


class Environment:
    """Optional base class. Subclasses add tools as typed, documented public methods."""

    def reset(self, **row: Any) -> str | None:
        """Start a trajectory for dataset row `row`; returned text is appended to the prompt."""
        return None

    def close(self) -> None:
        """Release what the environment holds (processes, files). Called once per trajectory."""


# ---------------------------------------------------------------- loading


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
    """The environment class at "package.module:Class", checked against the contract."""
    cls = import_object(path, "environment")
    if not inspect.isclass(cls):
        raise TypeError(f"environment {path!r} must be a class, got {type(cls).__name__}")
    if not callable(getattr(cls, "reset", None)):
        raise TypeError(f"environment class {path!r} must define reset(self, **row) (the TRL environment contract)")
    if callable(getattr(cls, "reward", None)) and callable(getattr(cls, "get_reward", None)):
        raise TypeError(f"environment class {path!r} defines both reward() and get_reward(): keep one")
    tool_schemas(cls)  # fail at load time, not mid-rollout, on a tool whose schema cannot be built
    return cls


@functools.lru_cache(maxsize=64)
def env_class(name: str, tools: tuple[str, ...] = ()) -> type:
    """The environment a config describes: `env.name`'s class with the plain functions of `env.tools` added as
    tools, or, with an empty name, an environment of only those functions. A function tool gets its JSON schema
    from its signature and docstring, like a method."""
    base = load_env_class(name) if name else Environment
    if not tools:
        return base
    added: dict[str, Any] = {}
    for spec in tools:
        fn = import_object(spec, "tool")
        if not inspect.isfunction(fn):
            raise TypeError(f"tool {fn!r} must be a plain function (def or async def), got {type(fn).__name__}")
        taken = set(added) | set(_tool_functions(base)) | RESERVED_METHODS
        if fn.__name__ in taken or fn.__name__.startswith("_"):
            raise ValueError(f"tool {fn.__name__!r}: the name is taken (or private) in environment {name or 'tools'}")
        added[fn.__name__] = staticmethod(fn)
    cls = type(f"{base.__name__}WithTools", (base,), added)
    tool_schemas(cls)
    return cls


# ---------------------------------------------------------------- tools


def _tool_functions(cls: type) -> dict[str, Callable]:
    # Listed on the class, as TRL does: listing an instance would evaluate its properties.
    return {
        name: fn
        for name, fn in inspect.getmembers(cls, predicate=inspect.isfunction)
        if not name.startswith("_") and name not in RESERVED_METHODS
    }


def tool_methods(env: Any) -> dict[str, Callable]:
    """The tools of an environment instance: {name: bound method}."""
    return {name: getattr(env, name) for name in _tool_functions(type(env))}


def tool_schemas(env_or_class: Any) -> list[dict]:
    """OpenAI-format tool schemas of an environment (instance or class), sorted by name."""
    cls = env_or_class if inspect.isclass(env_or_class) else type(env_or_class)
    return [function_schema(fn, owner=cls) for fn in _tool_functions(cls).values()]


def tool_parameters(fn: Callable, owner: type | None = None) -> list[inspect.Parameter]:
    """The parameters the model fills in: the signature without the receiver (`self`) and without *args."""
    params = list(inspect.signature(fn).parameters.values())
    is_static = owner is not None and isinstance(inspect.getattr_static(owner, fn.__name__, None), staticmethod)
    if owner is not None and not is_static and params:
        params = params[1:]  # self
    return [p for p in params if p.kind is not inspect.Parameter.VAR_POSITIONAL]


def function_schema(fn: Callable, owner: type | None = None) -> dict:
    """`{"type": "function", "function": {name, description, parameters}}` from the signature and docstring."""
    where = f"{owner.__name__}.{fn.__name__}" if owner else fn.__name__
    doc = docstring_parser.parse(inspect.getdoc(fn) or "")
    description = "\n\n".join(d for d in (doc.short_description, doc.long_description) if d)
    if not description:
        raise ValueError(f"tool {where} has no docstring: the model needs a description of what it does")
    param_docs = {p.arg_name: p.description for p in doc.params}
    try:
        hints = typing.get_type_hints(fn)
    except NameError as e:  # a string annotation naming something not importable from the tool's module
        raise TypeError(f"tool {where}: cannot resolve its type hints: {e}") from None
    properties: dict[str, dict] = {}
    required: list[str] = []
    for p in tool_parameters(fn, owner):
        if p.kind is inspect.Parameter.VAR_KEYWORD:
            continue
        if p.name not in hints:
            raise TypeError(f"tool {where}: parameter {p.name!r} has no type hint (needed for its JSON schema)")
        try:
            prop = json_schema(hints[p.name])
        except TypeError as e:
            raise TypeError(f"tool {where}: parameter {p.name!r}: {e}") from None
        if param_docs.get(p.name):
            prop["description"] = param_docs[p.name]
        properties[p.name] = prop
        if p.default is inspect.Parameter.empty:
            required.append(p.name)
    parameters: dict[str, Any] = {"type": "object", "properties": properties}
    if required:
        parameters["required"] = required
    return {"type": "function", "function": {"name": fn.__name__, "description": description, "parameters": parameters}}


_JSON_TYPES: dict[Any, str] = {
    str: "string",
    int: "integer",
    float: "number",
    bool: "boolean",
    list: "array",
    tuple: "array",
    dict: "object",
    type(None): "null",
}


def json_schema(hint: Any) -> dict:
    """JSON schema of a type hint built from str/int/float/bool/None, list, tuple, dict, Literal, Enum, unions."""
    if hint is Any:
        return {}
    origin, args = typing.get_origin(hint), typing.get_args(hint)
    if origin is typing.Union or origin is types.UnionType:
        members = [json_schema(a) for a in args if a is not type(None)]
        schema = members[0] if len(members) == 1 else {"anyOf": members}
        if type(None) in args:
            schema["nullable"] = True
        return schema
    if origin is typing.Literal:
        kinds = sorted({_JSON_TYPES[type(a)] for a in args})
        return {"type": kinds[0] if len(kinds) == 1 else kinds, "enum": list(args)}
    if origin in (list, tuple) or hint in (list, tuple):
        schema = {"type": "array"}
        if _homogeneous(origin, args):  # list[X], tuple[X, ...]; fixed tuples (tuple[X, Y]) leave items open
            schema["items"] = json_schema(args[0])
        return schema
    if origin is dict or hint is dict:
        return {"type": "object", **({"additionalProperties": json_schema(args[1])} if len(args) == 2 else {})}
    if inspect.isclass(hint) and issubclass(hint, enum.Enum):
        return {"enum": [m.value for m in hint]}
    if hint in _JSON_TYPES:
        return {"type": _JSON_TYPES[hint]}
    raise TypeError(f"type {hint!r} has no JSON form; use str, int, float, bool, list, dict, Literal or an Enum")


def _homogeneous(origin: Any, args: tuple) -> bool:
    return bool(args) and (origin is list or args[-1] is Ellipsis)


# ---------------------------------------------------------------- arguments


def coerce_arguments(fn: Callable, arguments: dict[str, Any], owner: type | None = None) -> dict[str, Any]:
    """Check model-produced arguments against `fn`'s signature, converting only lossless spellings ("3" -> 3).

    Raises ValueError naming the first problem: an unknown or missing argument, or a value of the wrong type.
    """
    params = {p.name: p for p in tool_parameters(fn, owner)}
    takes_any = any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params.values())
    named = {n: p for n, p in params.items() if p.kind is not inspect.Parameter.VAR_KEYWORD}
    unknown = [k for k in arguments if k not in named]
    if unknown and not takes_any:
        raise ValueError(f"unexpected argument {unknown[0]!r}; {fn.__name__} takes {_names(named)}")
    missing = [n for n, p in named.items() if p.default is inspect.Parameter.empty and n not in arguments]
    if missing:
        raise ValueError(f"missing required argument {missing[0]!r}; {fn.__name__} takes {_names(named)}")
    hints = typing.get_type_hints(fn)
    out = dict(arguments)
    for name, value in arguments.items():
        if name in named and name in hints:
            try:
                out[name] = coerce_value(value, hints[name])
            except ValueError as e:
                raise ValueError(f"argument {name!r}: {e}") from None
    return out


def _names(params: dict[str, inspect.Parameter]) -> str:
    return "(" + ", ".join(params) + ")" if params else "no arguments"


_INT = re.compile(r"[-+]?\d+")


def coerce_value(value: Any, hint: Any) -> Any:
    """`value` as type `hint`, or ValueError. Accepted conversions lose nothing: "3"->3, 3.0->3, 3->3.0, 3->"3"."""
    if hint is Any:
        return value
    origin, args = typing.get_origin(hint), typing.get_args(hint)
    if origin is typing.Union or origin is types.UnionType:
        if value is None and type(None) in args:
            return None
        members = [a for a in args if a is not type(None)]
        # Exact matches win, so `int | str` keeps "3" a string.
        for member in members:
            if inspect.isclass(member) and type(value) is member:
                return value
        for member in members:
            try:
                return coerce_value(value, member)
            except ValueError:
                pass
        raise ValueError(f"expected {_type_name(hint)}, got {_describe(value)}")
    if origin is typing.Literal:
        for choice in args:
            if value == choice and type(value) is type(choice):  # type check: True == 1 but is not the choice 1
                return choice
        raise ValueError(f"must be one of {list(args)}, got {_describe(value)}")
    if origin in (list, tuple) or hint in (list, tuple):
        if not isinstance(value, list | tuple):
            raise ValueError(f"expected an array, got {_describe(value)}")
        items = [coerce_value(v, args[0]) for v in value] if _homogeneous(origin, args) else value
        return tuple(items) if (origin or hint) is tuple else list(items)
    if origin is dict or hint is dict:
        if not isinstance(value, dict):
            raise ValueError(f"expected an object, got {_describe(value)}")
        return {k: coerce_value(v, args[1]) for k, v in value.items()} if len(args) == 2 else value
    if inspect.isclass(hint) and issubclass(hint, enum.Enum):
        try:
            return hint(value)
        except ValueError:
            raise ValueError(f"must be one of {[m.value for m in hint]}, got {_describe(value)}") from None
    return _coerce_scalar(value, hint)


def _coerce_scalar(value: Any, hint: Any) -> Any:
    is_number = isinstance(value, int | float) and not isinstance(value, bool)
    if hint is bool:
        if isinstance(value, bool):
            return value
        if isinstance(value, str) and value.strip().lower() in ("true", "false"):
            return value.strip().lower() == "true"
    elif hint is int:
        if is_number and float(value).is_integer():
            return int(value)
        if isinstance(value, str) and _INT.fullmatch(value.strip()):
            return int(value)
    elif hint is float:
        if is_number:
            return float(value)
        if isinstance(value, str):
            try:
                number = float(value)
            except ValueError:
                number = math.nan
            if math.isfinite(number):
                return number
    elif hint is str:
        if isinstance(value, str):
            return value
        if is_number:
            return str(value)
    elif hint is type(None):
        if value is None:
            return None
    else:
        return value  # a type with no JSON form: function_schema already refused it for tools
    raise ValueError(f"expected {_type_name(hint)}, got {_describe(value)}")


def _type_name(hint: Any) -> str:
    return json_schema(hint).get("type", str(hint)) if hint is not Any else "any"


def _describe(value: Any) -> str:
    text = repr(value)
    return f"{type(value).__name__} {text if len(text) <= 60 else text[:60] + '...'}"
