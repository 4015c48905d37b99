"""BFCL v4 single-turn tasks as prompt rows, and their ground truths as supervised conversations.

The data is the installed `bfcl-eval` package's (`bfcl_eval/data/BFCL_v4_<category>.json`, one JSON object a line:
`id`, `question` = the turns of the conversation, `function` = BFCL's function docs), with the answers in
`possible_answer/BFCL_v4_<category>.json` (`ground_truth` = a list of `{function_name: {argument: [allowed
values]}}`, one entry per expected call; an allowed value of "" means the argument may be left out). The
irrelevance category has no answers: the right response there is no call at all.

Split, fixed by id: a task is held out ("eval") when `zlib.crc32(id) % 4 == 0`, else "train", whatever else is
loaded. With bfcl-eval 2026.3.23 that gives

    category            tasks   train   eval
    simple_python         400     299    101
    multiple              200     149     51
    parallel              200     149     51
    parallel_multiple     200     151     49
    irrelevance           240     180     60
    all                  1240     928    312

(tests/unit/test_bfcl_matcher.py asserts these counts, so a new BFCL release that moves them fails loudly).

Function docs become OpenAI tool schemas (`tool_schema`): BFCL's types map to JSON schema's (dict -> object, float
-> number, tuple -> array, any -> no type constraint), nested `properties` and `items` too; a name with dots such
as `math.factorial` is kept as BFCL spells it, since the checker compares names exactly. Row columns are
JSON-friendly for JSONL and Hugging Face datasets alike: nested structures the matcher reads (`ground_truth`,
`functions`) are JSON strings.
"""

from __future__ import annotations

import functools
import json
import zlib
from dataclasses import dataclass
from pathlib import Path
from typing import Any

CATEGORIES = ("simple_python", "multiple", "parallel", "parallel_multiple", "irrelevance")
SPLITS = ("train", "eval")
EVAL_BUCKETS = 4  # one task in EVAL_BUCKETS is held out
INSTALL = "pip install --no-deps bfcl-eval==2026.3.23"
NO_CALL = "irrelevance"  # the category whose right answer is no call
REFUSAL = "None of the available functions can answer this."  # the SFT answer on an irrelevance task
OPTIONAL = ""  # BFCL's allowed value meaning "may be left out"

_JSON_TYPES = {
    "dict": "object",
    "float": "number",
    "tuple": "array",
    "any": None,  # no type constraint
    "string": "string",
    "integer": "integer",
    "boolean": "boolean",
    "array": "array",
}
_NOT_SCHEMA = ("optional",)  # BFCL's own doc keys, not JSON schema


@dataclass(frozen=True)
class Task:
    id: str
    category: str
    messages: tuple[dict[str, str], ...]  # the first turn
    functions: tuple[dict[str, Any], ...]  # BFCL's function docs
    ground_truth: tuple[dict[str, dict[str, list]], ...]  # () on an irrelevance task

    @property
    def split(self) -> str:
        return split_of(self.id)


def split_of(task_id: str) -> str:
    return "eval" if zlib.crc32(task_id.encode()) % EVAL_BUCKETS == 0 else "train"


def data_dir() -> Path:
    """The folder of BFCL's data files inside the installed bfcl-eval package."""
    try:
        import bfcl_eval  # its __init__ is empty: nothing heavy is imported
    except ModuleNotFoundError:
        raise ModuleNotFoundError(f"the BFCL tasks need the bfcl-eval package: {INSTALL}") from None
    return Path(bfcl_eval.__file__).parent / "data"


def _json_lines(path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


@functools.cache
def load_tasks(category: str) -> tuple[Task, ...]:
    """Every task of one category, in BFCL's order."""
    if category not in CATEGORIES:
        raise ValueError(f"BFCL category must be one of {CATEGORIES}, got {category!r}")
    root = data_dir()
    entries = _json_lines(root / f"BFCL_v4_{category}.json")
    answers: dict[str, list] = {}
    if category != NO_CALL:
        answers = {
            a["id"]: a["ground_truth"] for a in _json_lines(root / "possible_answer" / f"BFCL_v4_{category}.json")
        }
    tasks = []
    for entry in entries:
        if category != NO_CALL and entry["id"] not in answers:
            raise ValueError(f"BFCL task {entry['id']} has no possible answer")
        tasks.append(
            Task(
                id=entry["id"],
                category=category,
                messages=tuple({"role": m["role"], "content": m["content"]} for m in entry["question"][0]),
                functions=tuple(entry["function"]),
                ground_truth=tuple(answers.get(entry["id"], ())),
            )
        )
    return tuple(tasks)


def tasks_of(split: str, categories: tuple[str, ...] = CATEGORIES) -> list[Task]:
    if split not in SPLITS:
        raise ValueError(f"split must be one of {SPLITS}, got {split!r}")
    return [t for c in categories for t in load_tasks(c) if t.split == split]


# ---------------------------------------------------------------- tool schemas


def json_schema(bfcl: dict[str, Any]) -> dict[str, Any]:
    """A BFCL parameter doc (its types, nested `properties` and `items`) as JSON schema."""
    out: dict[str, Any] = {}
    for key, value in bfcl.items():
        if key == "type":
            if value not in _JSON_TYPES:
                raise ValueError(f"BFCL type {value!r} has no JSON schema type here (known: {sorted(_JSON_TYPES)})")
            if _JSON_TYPES[value] is not None:
                out["type"] = _JSON_TYPES[value]
        elif key == "properties":
            out["properties"] = {name: json_schema(p) for name, p in value.items()}
        elif key == "items":
            out["items"] = json_schema(value)
        elif key not in _NOT_SCHEMA:
            out[key] = value
    return out


def tool_schema(function: dict[str, Any]) -> dict[str, Any]:
    """One BFCL function doc as an OpenAI tool schema; the name is BFCL's, dots included."""
    return {
        "type": "function",
        "function": {
            "name": function["name"],
            "description": function.get("description", ""),
            "parameters": json_schema(function["parameters"]),
        },
    }


# ---------------------------------------------------------------- rows


def task_row(task: Task) -> dict[str, Any]:
    return {
        "prompt": [dict(m) for m in task.messages],
        "tools": [tool_schema(f) for f in task.functions],
        "id": task.id,
        "category": task.category,
        "ground_truth": json.dumps(list(task.ground_truth)),
        "functions": json.dumps(list(task.functions)),
    }


def rows(split: str, categories: tuple[str, ...] = CATEGORIES) -> list[dict[str, Any]]:
    """Prompt rows of `split` ("train" or "eval"), category by category in BFCL's order."""
    return [task_row(t) for t in tasks_of(split, categories)]


def reference_calls(task: Task) -> list[tuple[str, dict[str, Any]]]:
    """The ground truth as calls: per argument its first allowed value other than "", arguments whose allowed
    values include "" left out unless the doc requires them. () on an irrelevance task."""
    docs = {f["name"]: f for f in task.functions}
    calls = []
    for entry in task.ground_truth:
        ((name, allowed),) = entry.items()
        params = docs[name]["parameters"]
        required = set(params.get("required", ()))
        arguments = {}
        for arg, values in allowed.items():
            if OPTIONAL in values and arg not in required:
                continue
            schema = params["properties"].get(arg, {})
            arguments[arg] = _reference_value(_first(values), schema)
        calls.append((name, arguments))
    return calls


def _first(values: list) -> Any:
    return next((v for v in values if v != OPTIONAL), OPTIONAL)


def _reference_value(value: Any, schema: dict[str, Any]) -> Any:
    # A dict argument's allowed values are possible answers themselves ({key: [allowed]}), one level deep, and an
    # array of dicts holds a list of them: BFCL's checker reads them so (see matcher.py).
    if schema.get("type") == "dict" and isinstance(value, dict):
        return _reference_dict(value)
    items = schema.get("items", {})
    if schema.get("type") == "array" and items.get("type") == "dict" and isinstance(value, list):
        return [_reference_dict(d) if isinstance(d, dict) else d for d in value]
    return value


def _reference_dict(possible: dict[str, list]) -> dict[str, Any]:
    return {key: _first(values) for key, values in possible.items() if OPTIONAL not in values}


def sft_rows(split: str = "train", categories: tuple[str, ...] = CATEGORIES) -> list[dict[str, Any]]:
    """Supervised conversations of `split` (by default the training split; the held-out one only when asked for):
    the prompt, then the reference calls as one assistant message (TRL's form: arguments as dicts), or on an
    irrelevance task a short refusal without calls. `tools` is the JSON string of the tool schemas."""
    out = []
    for task in tasks_of(split, categories):
        if task.category == NO_CALL:
            answer: dict[str, Any] = {"role": "assistant", "content": REFUSAL}
        else:
            calls = [{"type": "function", "function": {"name": n, "arguments": a}} for n, a in reference_calls(task)]
            answer = {"role": "assistant", "content": "", "tool_calls": calls}
        out.append(
            {
                "messages": [*(dict(m) for m in task.messages), answer],
                "tools": json.dumps([tool_schema(f) for f in task.functions]),
                "id": task.id,
            }
        )
    return out
