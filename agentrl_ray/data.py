"""Prompt datasets: the built-in arithmetic, grid and long-tail tasks, JSONL files, or Hugging Face datasets on disk.

Rows follow TRL's conventions: a `prompt` column (a string, or a list of chat messages) plus any other columns,
which reward functions receive as keyword arguments. An optional `tools` column (a list of OpenAI tool schemas, or
that list as a JSON string) gives a row tools of its own: its prompt is rendered with them instead of the
environment's (BFCL's questions each come with their functions). Every row is checked when loaded, so a malformed
row fails before training starts (with its index), never halfway through a run.
"""

from __future__ import annotations

import importlib
import json
from pathlib import Path
from typing import Any

from agentrl_ray.config import ConfigError, DataConfig
from agentrl_ray.tasks.arithmetic import make_arithmetic_rows


def load_rows(spec: str, cfg: DataConfig, *, split: str, size: int) -> list[dict[str, Any]]:
    if spec == "builtin:arithmetic":
        rows = make_arithmetic_rows(size, cfg.seed, split)
    elif spec == "builtin:longtail":
        from agentrl_ray.tasks.longtail import make_longtail_rows

        rows = make_longtail_rows(size, cfg.seed, split)
    elif spec.startswith(VERIFIERS_PREFIX):  # a verifiers environment's own dataset (envs/adapters/verifiers.py)
        rows = verifiers_rows(spec, split)[:size]
    elif spec == "builtin:grid":
        from agentrl_ray.tasks.grid import make_grid_rows

        rows = make_grid_rows(size, cfg.seed, split)
    else:
        rows = _load_file_or_dataset(spec, split, cfg.make)[:size]
    return [_check_row(row, i, spec, cfg.prompt_column) for i, row in enumerate(rows)]


VERIFIERS_PREFIX = "verifiers:"
VERIFIERS_ENV_COLUMN = "verifiers_env"  # the column naming a row's environment loader (envs/adapters/verifiers.py)


def verifiers_rows(spec: str, split: str) -> list[dict[str, Any]]:
    """A data source `verifiers:pkg.mod:fn`: `fn()` (a verifiers environment's `load_environment`) and its dataset's
    rows (its eval dataset for `split` eval; verifiers falls back to the train set), each naming its loader."""
    loader = spec.removeprefix(VERIFIERS_PREFIX)
    module_name, sep, name = loader.partition(":")
    if not sep or not module_name or not name:
        raise ConfigError(f"dataset {spec!r}: name the environment's loader, verifiers:package.module:function")
    try:
        fn = getattr(importlib.import_module(module_name), name)
    except (ImportError, AttributeError) as e:
        raise ConfigError(f"dataset {spec!r}: cannot load {loader!r} ({e})") from e
    env = fn()
    dataset = env.get_eval_dataset() if split == "eval" else env.get_dataset()
    rows = []
    for i, row in enumerate(dataset):
        row = dict(row)
        row.setdefault("id", f"{split}-{row.get('example_id', i)}")
        row[VERIFIERS_ENV_COLUMN] = loader
        rows.append(row)
    return rows


def _load_file_or_dataset(spec: str, split: str, make: str = "") -> list[dict[str, Any]]:
    path = Path(spec).expanduser()
    if not path.exists() and make:
        raise ConfigError(f"dataset {spec!r} does not exist: write it first with `{make}` (the config's data.make)")
    if not path.exists():
        raise ConfigError(
            f"dataset {spec!r} does not exist "
            "(use builtin:arithmetic, builtin:grid, builtin:longtail, a .jsonl file or a folder)"
        )
    if path.suffix == ".jsonl":
        rows = []
        for n, line in enumerate(path.read_text().splitlines(), 1):
            if not line.strip():
                continue
            try:
                rows.append(json.loads(line))
            except json.JSONDecodeError as exc:
                raise ConfigError(f"{path}:{n}: not valid JSON ({exc.msg})") from exc
            except RecursionError as exc:
                raise ConfigError(f"{path}:{n}: JSON nested too deeply for Python's decoder") from exc
            except ValueError as exc:  # e.g. an integer of over 4,300 digits
                raise ConfigError(f"{path}:{n}: JSON that Python cannot read ({exc})") from exc
        return rows
    import datasets

    if (path / "dataset_info.json").exists() or (path / "dataset_dict.json").exists():
        ds = datasets.load_from_disk(str(path))
    else:
        ds = datasets.load_dataset(str(path))
    if isinstance(ds, datasets.DatasetDict):
        if split not in ds:
            raise ConfigError(f"dataset {spec!r} has splits {list(ds)}, not {split!r}")
        ds = ds[split]
    return [dict(r) for r in ds]


def _check_row(row: Any, index: int, spec: str, prompt_column: str) -> dict[str, Any]:
    where = f"dataset {spec!r} row {index}"
    if not isinstance(row, dict):
        raise ConfigError(f"{where}: expected a mapping, got {type(row).__name__}")
    if prompt_column not in row:
        raise ConfigError(f"{where}: no {prompt_column!r} column (columns: {sorted(row)})")
    prompt = row[prompt_column]
    if isinstance(prompt, list):
        for m in prompt:
            if not (isinstance(m, dict) and isinstance(m.get("role"), str) and isinstance(m.get("content"), str)):
                raise ConfigError(f"{where}: prompt messages need string 'role' and 'content', got {m!r}")
    elif not isinstance(prompt, str) or not prompt:
        raise ConfigError(f"{where}: prompt must be a non-empty string or a list of chat messages")
    out = dict(row)
    out["prompt"] = prompt
    if row.get("tools") is not None:
        out["tools"] = _check_tools(row["tools"], where)
    out.setdefault("id", f"{index}")
    out["id"] = str(out["id"])
    return out


def _check_tools(tools: Any, where: str) -> list[dict[str, Any]]:
    """A row's own tools: OpenAI function schemas, given as a list or as its JSON text (HF datasets keep nested
    schemas of different shapes best as strings)."""
    if isinstance(tools, str):
        try:
            tools = json.loads(tools)
        except json.JSONDecodeError as exc:
            raise ConfigError(f"{where}: the tools column is not valid JSON ({exc.msg})") from exc
    if not isinstance(tools, list):
        raise ConfigError(f"{where}: tools must be a list of OpenAI tool schemas, got {type(tools).__name__}")
    for tool in tools:
        function = tool.get("function") if isinstance(tool, dict) else None
        if not (isinstance(function, dict) and isinstance(function.get("name"), str) and function["name"]):
            raise ConfigError(
                f"{where}: each tool needs the OpenAI shape {{'type': 'function', 'function': "
                f"{{'name': ..., 'parameters': ...}}}}, got {str(tool)[:80]!r}"
            )
    return tools


def row_tools(row: dict[str, Any], default: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The tool schemas a row's prompt is rendered with: its own `tools` column if it has one, else `default`
    (the environment's)."""
    tools = row.get("tools")
    return default if tools is None else tools
