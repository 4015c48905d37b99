"""Our type checker for config values, and the helpers every section's `check` uses.

Ours rather than pydantic's (which Ray and vLLM install): it is about 70 lines, its messages name the dotted key
and the fix in one line (`learner.lr: expected a number, got 'fast'`), it reads YAML 1.1's "1e-6" (a string) as the
number the user meant, and the sections stay plain dataclasses whose attribute docstrings are the `agentrl-ray
config --help` text. A pydantic model would bring its own multi-line error format and validation rules to learn.
"""

from __future__ import annotations

import dataclasses
import types
import typing
from typing import Any, Literal


class ConfigError(ValueError):
    """A config that cannot run: the message names the key and the problem."""


def need(ok: bool, msg: str) -> None:
    if not ok:
        raise ConfigError(msg)


def check_resources(section: str, resources: dict[str, float]) -> None:
    """A section's `resources`: custom Ray resources only, never CPU/GPU/memory (those have keys of their own)."""
    need(
        not ({"CPU", "GPU", "memory"} & set(resources)),
        f"{section}.resources holds custom resources only: set CPUs/GPUs with their own keys, got {sorted(resources)}",
    )
    need(all(v >= 0 for v in resources.values()), f"{section}.resources: amounts must be >= 0")


# Keys that old configs may still set, and what to do instead.
REMOVED_KEYS = {
    "run.sync_check": "the integrity checks replace it and are on by default (run.integrity): after every sync a "
    "teacher-forced probe compares each engine's log-probs with the learner's (integrity/weights/* in metrics.jsonl); "
    "run.strict_integrity=true stops the run when one fails",
    "reward.answer_column": "it was never read. answer_match compares against the dataset's `answer` column: "
    "rename your column to `answer`, or pass a reward function of your own that reads it",
}


def check_value(value: Any, tp: Any, where: str) -> Any:
    origin = typing.get_origin(tp)
    if origin is Literal:
        if value not in typing.get_args(tp):
            choices = ", ".join(repr(a) for a in typing.get_args(tp))
            raise ConfigError(f"{where}: {value!r} is not one of {choices}")
        return value
    if origin in (list, tuple):
        if not isinstance(value, (list, tuple)):
            raise ConfigError(f"{where}: expected a list, got {value!r}")
        (item_tp,) = typing.get_args(tp)[:1]
        return [check_value(v, item_tp, f"{where}[{i}]") for i, v in enumerate(value)]
    if origin is dict:
        if not isinstance(value, dict):
            raise ConfigError(f"{where}: expected a mapping, got {value!r}")
        return dict(value)
    if origin in (typing.Union, types.UnionType):
        return value
    if tp is Any:
        return value
    if dataclasses.is_dataclass(tp):
        if not isinstance(value, dict):
            raise ConfigError(f"{where}: expected a mapping of {tp.__name__} fields, got {value!r}")
        return build(tp, value, where)
    if tp is bool:
        if not isinstance(value, bool):
            raise ConfigError(f"{where}: expected true/false, got {value!r}")
        return value
    if tp is int:
        if isinstance(value, bool) or not isinstance(value, int):
            raise ConfigError(f"{where}: expected an integer, got {value!r}")
        return value
    if tp is float:
        if isinstance(value, str):  # YAML 1.1 reads "1e-6" (no dot) as a string
            try:
                value = float(value)
            except ValueError:
                pass
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise ConfigError(f"{where}: expected a number, got {value!r}")
        return float(value)
    if tp is str:
        if not isinstance(value, str):
            raise ConfigError(f"{where}: expected a string, got {value!r}")
        return value
    raise ConfigError(f"{where}: unsupported config type {tp!r}")


def build(cls: type, data: dict[str, Any], where: str = "") -> Any:
    hints = typing.get_type_hints(cls)
    names = {f.name for f in dataclasses.fields(cls)}
    unknown = sorted(set(data) - names)
    prefix = f"{where}." if where else ""
    for key in unknown:
        if prefix + key in REMOVED_KEYS:
            raise ConfigError(f"config key {prefix + key} was removed: {REMOVED_KEYS[prefix + key]}")
    if unknown:
        raise ConfigError(
            f"unknown config key(s): {', '.join(prefix + k for k in unknown)} "
            f"(valid keys under {where or 'the top level'}: {', '.join(sorted(names))})"
        )
    kwargs = {k: check_value(v, hints[k], f"{where}.{k}" if where else k) for k, v in data.items()}
    return cls(**kwargs)
