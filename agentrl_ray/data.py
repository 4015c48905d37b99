"""Prompt datasets: the built-in arithmetic and grid tasks, JSONL files, or Hugging Face datasets on disk.

Rows follow TRL's conventions: a `prompt` column (a string, or a list of chat messages) plus any other columns,
which reward functions receive as keyword arguments. Every row is checked when loaded, so a malformed row fails
before training starts (with its index), never halfway through a run.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from agentrl_ray.config import ConfigError, DataConfig
from agentrl_ray.tasks.arithmetic import make_arithmetic_rows


def load_rows(spec: str, cfg: DataConfig, *, split: str, size: int) -> list[dict[str, Any]]:
    if spec == "builtin:arithmetic":
        rows = make_arithmetic_rows(size, cfg.seed, split)
    elif spec == "builtin:grid":
        from agentrl_ray.tasks.grid import make_grid_rows

        rows = make_grid_rows(size, cfg.seed, split)
    else:
        rows = _load_file_or_dataset(spec, split)[:size]
    return [_check_row(row, i, spec, cfg.prompt_column) for i, row in enumerate(rows)]


def _load_file_or_dataset(spec: str, split: str) -> list[dict[str, Any]]:
    path = Path(spec).expanduser()
    if not path.exists():
        raise ConfigError(
            f"dataset {spec!r} does not exist (use builtin:arithmetic, builtin:grid, a .jsonl file or a folder)"
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
    out.setdefault("id", f"{index}")
    out["id"] = str(out["id"])
    return out
