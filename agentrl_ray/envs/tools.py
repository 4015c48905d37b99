"""Tools: the JSON schema the model sees for each tool (from its type hints and docstring) and the coercion of the
arguments the model wrote to the types the tool declares.
"""

from __future__ import annotations

import enum
import inspect
import math
import re
import types
import typing
from collections.abc import Callable
from typing import Any

import docstring_parser

from agentrl_ray.envs.base import RESERVED_METHODS


def tool_functions(cls: type) -> dict[str, Callable]:
    # Listed on the class, as TRL does: listing an instance would evaluate its properties.
    return {
        name: fn
        for name, fn in inspect.getmembers(cls, predicate=inspect.isfunction)
        if not name.startswith("_") and name not in RESERVED_METHODS
    }


def tool_methods(env: Any) -> dict[str, Callable]:
    """The tools of an environment instance: {name: bound method}."""
    return {name: getattr(env, name) for name in tool_functions(type(env))}


def tool_schemas(env_or_class: Any) -> list[dict]:
    """OpenAI-format tool schemas of an environment (instance or class), sorted by name."""
    cls = env_or_class if inspect.isclass(env_or_class) else type(env_or_class)
    return [function_schema(fn, owner=cls) for fn in tool_functions(cls).values()]


def tool_parameters(fn: Callable, owner: type | None = None) -> list[inspect.Parameter]:
    """The parameters the model fills in: the signature without the receiver (`self`) and without *args."""
    params = list(inspect.signature(fn).parameters.values())
    is_static = owner is not None and isinstance(inspect.getattr_static(owner, fn.__name__, None), staticmethod)
    if owner is not None and not is_static and params:
        params = params[1:]  # self
    return [p for p in params if p.kind is not inspect.Parameter.VAR_POSITIONAL]


def function_schema(fn: Callable, owner: type | None = None) -> dict:
    """`{"type": "function", "function": {name, description, parameters}}` from the signature and docstring, or the
    schema a tool carries as `__tool_schema__` (an MCP server's tool: envs/adapters/mcp_tools.py)."""
    given = getattr(fn, "__tool_schema__", None)
    if given is not None:
        return given
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
        if isinstance(value, int) and not isinstance(value, bool):
            return value  # whatever its size: float() of an int past 1e308 overflows
        if is_number and float(value).is_integer():
            return int(value)
        if isinstance(value, str) and _INT.fullmatch(value.strip()):
            return int(value)
    elif hint is float:
        if is_number:
            try:
                return float(value)
            except OverflowError:  # an int past float's range (10**400): an argument error, not a crash
                pass
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
            try:
                return str(value)
            except ValueError:  # an int past Python's 4,300-digit limit for str()
                pass
    elif hint is type(None):
        if value is None:
            return None
    else:
        return value  # a type with no JSON form: function_schema already refused it for tools
    raise ValueError(f"expected {_type_name(hint)}, got {_describe(value)}")


def _type_name(hint: Any) -> str:
    return json_schema(hint).get("type", str(hint)) if hint is not Any else "any"


def _describe(value: Any) -> str:
    try:
        text = repr(value)
    except ValueError:  # an int past Python's 4,300-digit limit for str()
        return f"{type(value).__name__} of {value.bit_length()} bits"
    return f"{type(value).__name__} {text if len(text) <= 60 else text[:60] + '...'}"
