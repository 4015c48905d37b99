"""BFCL v4 multi-turn tasks: a user who asks again after each answer, and tools that keep state between turns.

The data is the installed `bfcl-eval` package's `BFCL_v4_multi_turn_base.json` (one task a line: `question` = the
user's turns, `initial_config` = the starting state of each tool class, `involved_classes`, `excluded_function` =
functions kept out of the docs), its ground truth in `possible_answer/` (per turn, the calls that answer it, in
Python syntax: `mean(numbers=[3,16,60])`), and the tool classes themselves
(`bfcl_eval/eval_checker/multi_turn_eval/func_source_code/`: a file system, MathAPI, messaging, posting, tickets,
trading, travel, vehicle control). The classes are plain Python and run offline; they are the environment's tools,
not re-implemented here. What decides a task is our own code, from BFCL's documented rules for multi-turn
(`Judge`):

- each turn's calls run on the model's instances, which keep their state across turns; the turn's ground truth
  runs on a second set of instances, in step with the first;
- a turn whose ground truth calls something fails when the model made no call in it;
- after such a turn, every public attribute (a name not starting with `_`) of every ground-truth instance must
  equal the model's instance's (the state check);
- and every result the ground truth's calls returned in that turn must be among the results of the model's calls so
  far, as a multiset, in any order (the response check);
- a task is right when every turn passes; a turn with no ground-truth call checks nothing.

Results are text as BFCL makes them: a string as it is, a dict as JSON, anything else `str()`, and a call that
raises `Error during execution: <message>`. tests/unit/test_bfcl_multi_turn.py replays every task's ground truth
(every turn passes) and compares this judge's verdicts with BFCL's own `multi_turn_checker` on wrong answers.

Split, fixed by id like the single-turn tasks (`data.split_of`): 200 tasks, 150 train and 50 held out with
bfcl-eval 2026.3.23. Rows are JSON-friendly: the nested columns the environment reads are JSON strings.
"""

from __future__ import annotations

import ast
import copy
import functools
import importlib
import inspect
import json
from dataclasses import dataclass
from typing import Any

from agentrl_ray.tasks.bfcl.data import SPLITS, _json_lines, data_dir, split_of, tool_schema

CATEGORY = "multi_turn_base"
# BFCL's tool classes, where they live in bfcl-eval and which function docs describe them.
CLASSES = {
    "GorillaFileSystem": ("gorilla_file_system", "gorilla_file_system.json"),
    "MathAPI": ("math_api", "math_api.json"),
    "MessageAPI": ("message_api", "message_api.json"),
    "TwitterAPI": ("posting_api", "posting_api.json"),
    "TicketAPI": ("ticket_api", "ticket_api.json"),
    "TradingBot": ("trading_bot", "trading_bot.json"),
    "TravelAPI": ("travel_booking", "travel_booking.json"),
    "VehicleControlAPI": ("vehicle_control", "vehicle_control.json"),
}
_SOURCE = "bfcl_eval.eval_checker.multi_turn_eval.func_source_code"
STATELESS = ("MathAPI",)  # a class without a scenario to load (BFCL never calls its _load_scenario)


@dataclass(frozen=True)
class MultiTurnTask:
    id: str
    turns: tuple[str, ...]  # the user's message of each turn
    initial_config: dict[str, Any]
    classes: tuple[str, ...]
    excluded: tuple[str, ...]  # functions left out of the docs
    ground_truth: tuple[tuple[str, ...], ...]  # per turn, BFCL's calls in Python syntax

    @property
    def split(self) -> str:
        return split_of(self.id)


@functools.cache
def load_tasks() -> tuple[MultiTurnTask, ...]:
    """Every multi_turn_base task, in BFCL's order."""
    root = data_dir()
    answers = {a["id"]: a["ground_truth"] for a in _json_lines(root / "possible_answer" / f"BFCL_v4_{CATEGORY}.json")}
    tasks = []
    for entry in _json_lines(root / f"BFCL_v4_{CATEGORY}.json"):
        unknown = [c for c in entry["involved_classes"] if c not in CLASSES]
        if unknown:
            raise ValueError(f"BFCL task {entry['id']} uses tool classes {unknown}, not among {sorted(CLASSES)}")
        if entry["id"] not in answers:
            raise ValueError(f"BFCL task {entry['id']} has no possible answer")
        truth = answers[entry["id"]]
        if len(truth) != len(entry["question"]):
            raise ValueError(f"BFCL task {entry['id']}: {len(entry['question'])} turns, {len(truth)} answers")
        tasks.append(
            MultiTurnTask(
                id=entry["id"],
                turns=tuple("\n".join(m["content"] for m in turn if m["role"] == "user") for turn in entry["question"]),
                initial_config=entry["initial_config"],
                classes=tuple(entry["involved_classes"]),
                excluded=tuple(entry.get("excluded_function") or ()),
                ground_truth=tuple(tuple(turn) for turn in truth),
            )
        )
    return tuple(tasks)


def tasks_of(split: str, classes: tuple[str, ...] = ()) -> list[MultiTurnTask]:
    """The tasks of `split`; with `classes`, only those that involve one of them (e.g. ("MathAPI",))."""
    if split not in SPLITS:
        raise ValueError(f"split must be one of {SPLITS}, got {split!r}")
    return [t for t in load_tasks() if t.split == split and (not classes or set(classes) & set(t.classes))]


@functools.cache
def function_docs(class_name: str) -> tuple[dict[str, Any], ...]:
    return tuple(_json_lines(data_dir() / "multi_turn_func_doc" / CLASSES[class_name][1]))


def task_functions(task: MultiTurnTask) -> list[dict[str, Any]]:
    """BFCL's docs of the functions the model is shown: its classes' functions, less the excluded ones."""
    return [f for c in task.classes for f in function_docs(c) if f["name"] not in task.excluded]


# ---------------------------------------------------------------- the tool classes


class World:
    """The instances of a task's tool classes, from its `initial_config`, and the calls made on them.

    A method name maps to the last listed class that has it (BFCL's order of `involved_classes`). `allowed`, when
    given, limits the callable names (the functions the model was shown)."""

    def __init__(self, task: MultiTurnTask, allowed: set[str] | None = None) -> None:
        self.instances: dict[str, Any] = {}
        self.methods: dict[str, Any] = {}
        for name in task.classes:
            cls = getattr(importlib.import_module(f"{_SOURCE}.{CLASSES[name][0]}"), name)
            instance = cls()
            if name not in STATELESS:
                instance._load_scenario(copy.deepcopy(task.initial_config.get(name, {})), long_context=False)
            self.instances[name] = instance
            for method, fn in inspect.getmembers(instance, predicate=inspect.ismethod):
                if not method.startswith("_") and (allowed is None or method in allowed):
                    self.methods[method] = fn

    def call(self, name: str, arguments: dict[str, Any]) -> str:
        """Run one call; its result as BFCL's text (an error is a result too: the model sees it)."""
        fn = self.methods.get(name)
        if fn is None:
            return f"Error during execution: no function named {name!r} (available: {', '.join(sorted(self.methods))})"
        try:
            value = fn(**arguments)
        except Exception as e:  # noqa: BLE001 - the tool's failure is the model's observation, as in BFCL
            return f"Error during execution: {e}"
        if isinstance(value, str):
            return value
        if isinstance(value, dict):
            try:
                return json.dumps(value)
            except (TypeError, ValueError):
                return str(value)
        return str(value)

    def call_python(self, call: str) -> str:
        """Run a ground-truth call written in Python syntax."""
        return self.call(*self.resolve(call))

    def resolve(self, call: str) -> tuple[str, dict[str, Any]]:
        """A call in Python syntax as (name, keyword arguments): positional ones take the method's order."""
        name, args, kwargs = parse_call(call)
        if args:
            fn = self.methods.get(name)
            if fn is None:
                raise ValueError(f"call {call!r}: positional arguments of an unknown function")
            kwargs = {**dict(zip(inspect.signature(fn).parameters, args)), **kwargs}
        return name, kwargs

    def state(self, class_name: str) -> dict[str, Any]:
        """The public attributes of one instance: what the state check compares."""
        return {k: v for k, v in vars(self.instances[class_name]).items() if not k.startswith("_")}


def parse_call(call: str) -> tuple[str, list[Any], dict[str, Any]]:
    """`name(a, b=...)` -> (name, positional values, keyword values); every value a Python literal."""
    try:
        node = ast.parse(call.strip(), mode="eval").body
    except SyntaxError as e:
        raise ValueError(f"not a Python call: {call!r} ({e.msg})") from None
    if not isinstance(node, ast.Call) or not isinstance(node.func, ast.Name):
        raise ValueError(f"not a call of a named function: {call!r}")
    try:
        args = [ast.literal_eval(a) for a in node.args]
        kwargs = {k.arg: ast.literal_eval(k.value) for k in node.keywords if k.arg is not None}
    except ValueError:
        raise ValueError(f"an argument of {call!r} is not a literal") from None
    return node.func.id, args, kwargs


# ---------------------------------------------------------------- the judge


@dataclass
class TurnVerdict:
    valid: bool
    reason: str = ""


class Judge:
    """BFCL's multi-turn rules over one task, turn by turn, as the model works (module docstring).

    Call `model_call(name, arguments)` for each of the model's calls (it returns the result the model sees), then
    `end_turn()` when the model answers the turn without calling; `end_turn` replays the turn's ground truth and
    checks the two worlds. `passed` counts the turns that passed."""

    def __init__(self, task: MultiTurnTask) -> None:
        self.task = task
        shown = {f["name"] for f in task_functions(task)}
        self.model = World(task, allowed=shown)
        self.truth = World(task)
        self.turn = 0
        self.passed = 0
        self._results: list[str] = []  # every result of the model's calls, all turns so far
        self._calls_this_turn = 0

    @property
    def done(self) -> bool:
        return self.turn >= len(self.task.turns)

    def model_call(self, name: str, arguments: dict[str, Any]) -> str:
        result = self.model.call(name, arguments)
        self._results.append(result)
        self._calls_this_turn += 1
        return result

    def end_turn(self) -> TurnVerdict:
        truth = self.task.ground_truth[self.turn]
        expected = [self.truth.call_python(c) for c in truth]
        calls, self._calls_this_turn = self._calls_this_turn, 0
        self.turn += 1
        verdict = self._check(truth, expected, calls)
        self.passed += verdict.valid
        return verdict

    def _check(self, truth: tuple[str, ...], expected: list[str], calls: int) -> TurnVerdict:
        if not truth:
            return TurnVerdict(True)
        if not calls:
            return TurnVerdict(False, f"turn {self.turn - 1}: no call where {len(truth)} were expected")
        for name in self.task.classes:
            want, got = self.truth.state(name), self.model.state(name)
            wrong = sorted(k for k in want if got.get(k, _MISSING) != want[k])
            if wrong:
                return TurnVerdict(False, f"turn {self.turn - 1}: {name} state differs in {wrong}")
        remaining = list(self._results)
        for result in expected:
            if result not in remaining:
                return TurnVerdict(False, f"turn {self.turn - 1}: no call returned {result[:120]!r}")
            remaining.remove(result)
        return TurnVerdict(True)


_MISSING = object()


# ---------------------------------------------------------------- rows


def task_row(task: MultiTurnTask) -> dict[str, Any]:
    return {
        "prompt": [{"role": "user", "content": task.turns[0]}],
        "tools": [tool_schema(f) for f in task_functions(task)],
        "id": task.id,
        "category": CATEGORY,
        "classes": list(task.classes),
    }


def rows(split: str, classes: tuple[str, ...] = ()) -> list[dict[str, Any]]:
    """Prompt rows of `split`: the first turn and the tools; the environment finds the rest by `id`."""
    return [task_row(t) for t in tasks_of(split, classes)]


@functools.cache
def task_by_id(task_id: str) -> MultiTurnTask:
    for task in load_tasks():
        if task.id == task_id:
            return task
    raise KeyError(f"no BFCL {CATEGORY} task {task_id!r} in the installed bfcl-eval")


def sft_rows(split: str = "train", classes: tuple[str, ...] = ()) -> list[dict[str, Any]]:
    """Supervised conversations of `split`: each turn's ground-truth calls as one assistant message, their results
    (run on the task's instances) as tool messages, then a short answer that ends the turn (`reference_answer`)."""
    out = []
    for task in tasks_of(split, classes):
        world = World(task)
        messages: list[dict[str, Any]] = []
        for question, truth in zip(task.turns, task.ground_truth):
            messages.append({"role": "user", "content": question})
            if truth:
                calls = []
                for call in truth:
                    name, arguments = world.resolve(call)
                    calls.append({"type": "function", "function": {"name": name, "arguments": arguments}})
                messages.append({"role": "assistant", "content": "", "tool_calls": calls})
                messages.extend({"role": "tool", "content": world.call_python(c)} for c in truth)
            messages.append({"role": "assistant", "content": REFERENCE_ANSWER})
        out.append({"messages": messages, "tools": json.dumps(task_row(task)["tools"]), "id": task.id})
    return out


REFERENCE_ANSWER = "Done."  # the SFT turn's closing answer: the turn ends when the model answers without a call
