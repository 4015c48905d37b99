"""`agentrl-ray config --help`: every config key with its type, default and description.

The descriptions are the attribute docstrings under each field of the config sections (a string literal right after an
annotated assignment), read from the dataclass source with `ast`, so the schema stays the single source.
"""

from __future__ import annotations

import ast
import dataclasses
import inspect
import textwrap
import typing
from dataclasses import dataclass
from typing import Any

from agentrl_ray.config import Config


@dataclass
class KeyDoc:
    key: str  # dotted, e.g. "learner.lr"
    type: str
    default: Any
    doc: str


def field_docs(cls: type) -> dict[str, str]:
    """{field name: its attribute docstring} of a dataclass ('' for a field without one)."""
    tree = ast.parse(textwrap.dedent(inspect.getsource(cls)))
    body = tree.body[0].body
    docs: dict[str, str] = {}
    for node, after in zip(body, body[1:] + [None]):
        if isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
            is_doc = isinstance(after, ast.Expr) and isinstance(getattr(after, "value", None), ast.Constant)
            text = after.value.value if is_doc and isinstance(after.value.value, str) else ""
            docs[node.target.id] = " ".join(text.split())
    return docs


def _type_name(tp: Any) -> str:
    if typing.get_origin(tp) is typing.Literal:
        return " | ".join(repr(a) for a in typing.get_args(tp))
    return getattr(tp, "__name__", None) if not typing.get_args(tp) else str(tp).replace("typing.", "")


def describe(cls: type = Config, prefix: str = "") -> list[KeyDoc]:
    """One entry per leaf key, depth first, in declaration order."""
    hints = typing.get_type_hints(cls)
    docs = field_docs(cls)
    defaults = cls()
    out: list[KeyDoc] = []
    for f in dataclasses.fields(cls):
        tp = hints[f.name]
        key = f"{prefix}{f.name}"
        if dataclasses.is_dataclass(tp):
            out.extend(describe(tp, f"{key}."))
        else:
            out.append(KeyDoc(key, _type_name(tp), getattr(defaults, f.name), docs.get(f.name, "")))
    return out


def render() -> str:
    lines = [
        "Config keys (set them in a YAML file or as section.key=value overrides; the profile preset sits under both):",
        "",
    ]
    section = None
    for k in describe():
        head = k.key.split(".")[0] if "." in k.key else ""
        if head != section:
            section = head
            if head:
                lines.append(f"[{head}]")
        lines.append(f"  {k.key}: {k.type} = {k.default!r}")
        lines.append(textwrap.fill(k.doc, width=116, initial_indent="      ", subsequent_indent="      "))
    return "\n".join(lines)
