"""Our BFCL AST matcher (agentrl_ray/tasks/bfcl/matcher.py) against the ground truths, hand-made mistakes, and BFCL's
own checker on thousands of deterministic perturbations of every task's ground truth; and the task split.

Needs the bfcl-eval package (`pip install --no-deps bfcl-eval==2026.3.23`); skipped without it.
"""

from __future__ import annotations

import copy
import json
import random
import sys
import types

import pytest

pytest.importorskip("bfcl_eval")

from agentrl_ray.chat_format import ToolCall, render_tool_call  # noqa: E402
from agentrl_ray.tasks.bfcl import data  # noqa: E402
from agentrl_ray.tasks.bfcl.matcher import check  # noqa: E402
from examples.bfcl.reward import judge_text  # noqa: E402

MODEL = "agentrl"  # the model name BFCL's checker is told (it only looks it up to rename dotted functions)
PER_TASK = 6  # perturbations per task: 2,400 simple, 1,200 in each other category with calls, 1,440 irrelevance
COUNTS = {  # (train, eval) per category: the split is fixed by id (data.py's docstring)
    "simple_python": (299, 101),
    "multiple": (149, 51),
    "parallel": (149, 51),
    "parallel_multiple": (151, 49),
    "irrelevance": (180, 60),
}


def _text(calls) -> str:
    return "\n".join(render_tool_call(ToolCall(name, arguments)) for name, arguments in calls)


def _judge(task, calls):
    return check(calls, list(task.functions), list(task.ground_truth), task.category)


@pytest.fixture(scope="module")
def bfcl():
    """BFCL's checker and its irrelevance rule, imported without its model registry (which imports every handler)."""
    stub = types.ModuleType("bfcl_eval.constants.model_config")
    stub.MODEL_CONFIG_MAPPING = {MODEL: types.SimpleNamespace(underscore_to_dot=False)}
    saved = sys.modules.get(stub.__name__)
    sys.modules[stub.__name__] = stub
    try:
        from bfcl_eval.constants.enums import Language
        from bfcl_eval.eval_checker.ast_eval.ast_checker import ast_checker
        from bfcl_eval.utils import is_empty_output
    finally:
        if saved is None:
            del sys.modules[stub.__name__]
        else:
            sys.modules[stub.__name__] = saved

    def verdict(task, calls) -> bool:
        output = [{name: copy.deepcopy(arguments)} for name, arguments in calls]
        if task.category == data.NO_CALL:  # the runner's rule: no decoded call is right
            return is_empty_output(output)
        functions, answer = copy.deepcopy(list(task.functions)), copy.deepcopy(list(task.ground_truth))
        return ast_checker(functions, output, answer, Language.PYTHON, task.category, MODEL)["valid"]

    return verdict


# ---------------------------------------------------------------- (a) every ground truth is valid


@pytest.mark.parametrize("category", data.CATEGORIES)
def test_every_ground_truth_rendered_as_a_completion_is_valid(category):
    tasks = data.load_tasks(category)
    invalid = []
    for task in tasks:
        verdict = judge_text(_text(data.reference_calls(task)), task_functions(task), task_answer(task), category)
        if not verdict.valid:
            invalid.append((task.id, verdict.error))
    assert not invalid, invalid[:5]
    assert len(tasks) == sum(COUNTS[category])


def task_functions(task) -> str:
    return json.dumps(list(task.functions))


def task_answer(task) -> str:
    return json.dumps(list(task.ground_truth))


# ---------------------------------------------------------------- (b) mistakes are invalid


def _task(task_id):
    category = task_id.rsplit("_", 1)[0]
    return next(t for t in data.load_tasks(category) if t.id == task_id)


def test_mistakes_are_invalid():
    simple = _task("simple_python_0")  # calculate_triangle_area(base=10, height=5, unit="units" or omitted)
    ((name, args),) = data.reference_calls(simple)
    assert _judge(simple, [(name, args)]).valid
    assert _judge(simple, [(name, {**args, "unit": "UNITS"})]).valid  # strings compare normalised
    assert _judge(simple, [(name, {**args, "base": 10.0})]).valid is False  # an integer parameter
    cases = {
        "wrong name": [("calculate_area", args)],
        "missing required": [(name, {"height": 5})],
        "wrong value": [(name, {**args, "base": 11})],
        "unknown argument": [(name, {**args, "color": "red"})],
        "a string for an int": [(name, {**args, "base": "10"})],
        "two calls": [(name, args), (name, args)],
        "no call": [],
    }
    for what, calls in cases.items():
        assert not _judge(simple, calls).valid, what

    dotted = _task("simple_python_1")  # math.factorial(number=5)
    assert _judge(dotted, [("math.factorial", {"number": 5})]).valid
    assert not _judge(dotted, [("math_factorial", {"number": 5})]).valid

    irrelevant = _task("irrelevance_0")
    assert _judge(irrelevant, []).valid
    doc = irrelevant.functions[0]
    assert not _judge(irrelevant, [(doc["name"], {"weight": 70.0, "height": 1.8})]).valid

    parallel = _task("parallel_0")
    calls = data.reference_calls(parallel)
    assert _judge(parallel, calls).valid and _judge(parallel, calls[::-1]).valid  # order-free
    assert not _judge(parallel, calls[:-1]).valid  # one call too few
    assert not _judge(parallel, [calls[0]] * len(calls)).valid  # each expected call needs a call of its own


def test_malformed_calls_are_invalid_even_on_irrelevance():
    task = _task("irrelevance_0")
    for text in ["<tool_call>\nnot json\n</tool_call>", '<tool_call>\n{"name": "x"', "I cannot help."]:
        verdict = judge_text(text, task_functions(task), "[]", task.category)
        assert verdict.valid is (text == "I cannot help."), text


# ---------------------------------------------------------------- (c) agreement with BFCL's checker


def _other_value(value, rng: random.Random):
    """A deterministic variant of an argument value: some still allowed (case, punctuation), most not."""
    if isinstance(value, bool):
        return rng.choice([not value, str(value).lower(), int(value), None])
    if isinstance(value, int):
        return rng.choice([value + 1, float(value), str(value), -value, True, [value]])
    if isinstance(value, float):
        whole = [int(value)] if value.is_integer() else []
        return rng.choice([value + 0.5, str(value), round(value, 1), value * 10, *whole, None])
    if isinstance(value, str):
        return rng.choice([value.upper(), f" {value}.", value.replace(" ", "_"), value + "x", value[:-1], "", 7])
    if isinstance(value, list):
        variants = [value[::-1], [], value[:-1], value + value[:1], [str(v) for v in value], [value], "list"]
        variants.append([float(v) if type(v) is int else v for v in value])
        variants.append([int(v) if type(v) is float and v.is_integer() else v for v in value])
        variants.append([_other_value(v, rng) if isinstance(v, dict | list) else v for v in value])
        return rng.choice(variants)
    if isinstance(value, dict):
        keys = list(value)
        variants = [{**value, "extra": 1}, {}, json.dumps(value)]
        if keys:
            key = rng.choice(keys)
            variants += [{k: v for k, v in value.items() if k != key}, {**value, key: _other_value(value[key], rng)}]
            if isinstance(value[key], str):  # compared normalised inside a dict too
                variants.append({**value, key: value[key].upper()})
        return rng.choice(variants)
    return rng.choice([0, "none", []])


def _perturb_call(task, call, rng: random.Random):
    name, arguments = call[0], copy.deepcopy(call[1])
    docs = {f["name"]: f for f in task.functions}
    allowed = next((a for g in task.ground_truth for n, a in g.items() if n == name), {})
    params = docs[name]["parameters"]["properties"] if name in docs else {}
    kind = rng.randrange(9)
    if kind == 0:  # another name: a sibling function, BFCL's dot renaming, a typo
        others = [n for n in docs if n != name]
        name = rng.choice([*others, name.replace(".", "_"), name + "s"])
    elif kind == 1 and arguments:  # drop an argument (required or not)
        arguments.pop(rng.choice(sorted(arguments)))
    elif kind == 2:  # an argument the doc lacks, or one the doc has and the answer does not
        spare = [p for p in params if p not in allowed]
        arguments[rng.choice(spare) if spare and rng.random() < 0.5 else "extra_arg"] = rng.choice([1, "x", True])
    elif kind == 3 and allowed:  # another allowed value (often still valid), "" leaving the argument out
        arg = rng.choice(sorted(allowed))
        value = rng.choice(allowed[arg])
        if value == "":
            arguments.pop(arg, None)
        else:
            arguments[arg] = value
    elif kind == 4 and allowed:  # an optional argument given its first allowed value, or its "" spelled out
        arg = rng.choice(sorted(allowed))
        values = [v for v in allowed[arg] if v != ""] or [""]
        arguments[arg] = rng.choice([values[0], ""])
    elif arguments:  # a changed value (most kinds), a dict or list one when there is one half the time
        containers = sorted(a for a, v in arguments.items() if isinstance(v, dict | list))
        arg = rng.choice(containers if containers and rng.random() < 0.5 else sorted(arguments))
        arguments[arg] = _other_value(arguments[arg], rng)
    return name, arguments


def perturbations(task, n: int):
    """`n` deterministic variants of the task's reference calls: one to three mistakes each, or call-list edits."""
    reference = data.reference_calls(task)
    rng = random.Random(f"bfcl-perturb/{task.id}")
    out = []
    for _ in range(n):
        calls = copy.deepcopy(reference)
        if not calls:  # irrelevance: a call of one of the functions, with or without arguments
            doc = rng.choice(task.functions)
            required = doc["parameters"].get("required", [])
            out.append(rng.choice([[], [(doc["name"], {})], [(doc["name"], {p: 1 for p in required})]]))
            continue
        edit = rng.randrange(6)
        if edit == 0 and len(calls) > 1:
            calls = rng.choice([calls[::-1], calls[1:], calls[:-1] + calls[:1], calls + calls[:1]])
        elif edit == 1:
            calls = calls + [_perturb_call(task, rng.choice(calls), rng)]
        else:
            for _ in range(rng.randint(1, 3)):
                i = rng.randrange(len(calls))
                calls[i] = _perturb_call(task, calls[i], rng)
        out.append(calls)
    return out


@pytest.mark.parametrize("category", data.CATEGORIES)
def test_verdicts_agree_with_bfcls_checker(category, bfcl):
    checked = valid = 0
    disagree = []
    for task in data.load_tasks(category):
        for calls in [data.reference_calls(task), *perturbations(task, PER_TASK)]:
            ours = _judge(task, calls).valid
            if ours != bfcl(task, calls):
                disagree.append((task.id, calls, ours))
            checked += 1
            valid += ours
    assert not disagree, f"{len(disagree)} of {checked} disagree, e.g. {disagree[:3]}"
    # The perturbations are mostly mistakes, but not all: both verdicts are exercised.
    assert 0.15 * checked < valid < 0.7 * checked, (valid, checked)


def _container_arguments(task):
    """(call index, argument) of each dict or list argument of the task's reference calls."""
    calls = data.reference_calls(task)
    return [(i, a) for i, (_, args) in enumerate(calls) for a, v in args.items() if isinstance(v, dict | list)]


def test_dict_and_list_arguments_agree_with_bfcls_checker(bfcl):
    """The rarer rules (dicts, lists of dicts, element types), 20 variants of every dict or list argument."""
    checked = 0
    disagree = []
    for category in data.CATEGORIES[:-1]:
        for task in data.load_tasks(category):
            rng = random.Random(f"bfcl-containers/{task.id}")
            for i, arg in _container_arguments(task):
                for _ in range(20):
                    calls = copy.deepcopy(data.reference_calls(task))
                    calls[i][1][arg] = _other_value(calls[i][1][arg], rng)
                    if _judge(task, calls).valid != bfcl(task, calls):
                        disagree.append((task.id, calls))
                    checked += 1
    assert checked > 5000 and not disagree, f"{len(disagree)} of {checked} disagree, e.g. {disagree[:3]}"


# ---------------------------------------------------------------- (d) the split and the rows


def test_split_is_fixed_disjoint_and_sft_draws_from_train_only():
    for category, (train, held) in COUNTS.items():
        tasks = data.load_tasks(category)
        assert sum(t.split == "train" for t in tasks) == train
        assert sum(t.split == "eval" for t in tasks) == held
    train_ids = [r["id"] for r in data.rows("train")]
    eval_ids = [r["id"] for r in data.rows("eval")]
    assert len(train_ids) == 928 and len(eval_ids) == 312
    assert not set(train_ids) & set(eval_ids) and len(set(train_ids)) == len(train_ids)
    assert data.split_of("simple_python_0") == "eval" and data.split_of("simple_python_1") == "train"
    sft = data.sft_rows()
    assert [r["id"] for r in sft] == train_ids
    refusals = [r for r in sft if r["id"].startswith("irrelevance")]
    assert len(refusals) == 180 and all("tool_calls" not in r["messages"][-1] for r in refusals)
    assert all(r["messages"][-1]["tool_calls"] for r in sft if not r["id"].startswith("irrelevance"))


def test_rows_are_json_and_tools_are_openai_schemas():
    rows = {r["id"]: r for r in data.rows("train") + data.rows("eval")}
    assert json.loads(json.dumps(list(rows.values()))) == list(rows.values())
    row = rows["simple_python_1"]
    assert row["prompt"] == [{"role": "user", "content": "Calculate the factorial of 5 using math functions."}]
    assert row["category"] == "simple_python"
    assert json.loads(row["ground_truth"]) == [{"math.factorial": {"number": [5]}}]
    (tool,) = row["tools"]
    assert tool["type"] == "function" and tool["function"]["name"] == "math.factorial"
    assert tool["function"]["parameters"]["type"] == "object"
    schemas = json.dumps([r["tools"] for r in rows.values()])
    for bfcl_only in ('"dict"', '"float"', '"tuple"', '"any"', '"optional"'):
        assert f'"type": {bfcl_only}' not in schemas and f"{bfcl_only}:" not in schemas
    assert data.json_schema({"type": "any", "description": "x"}) == {"description": "x"}
    nested = {"type": "dict", "properties": {"p": {"type": "tuple", "items": {"type": "float"}}}}
    assert data.json_schema(nested) == {
        "type": "object",
        "properties": {"p": {"type": "array", "items": {"type": "number"}}},
    }


def test_a_missing_package_names_the_install_command(monkeypatch):
    monkeypatch.setitem(sys.modules, "bfcl_eval", None)
    with pytest.raises(ModuleNotFoundError, match=r"pip install --no-deps bfcl-eval==2026\.3\.23"):
        data.data_dir()


@pytest.mark.parametrize("category", data.CATEGORIES)
def test_partial_credit_is_one_exactly_when_valid_and_ranks_near_misses(category):
    """`credit` (ours, a shaping reward for RL) is 1.0 on exactly the answers BFCL's rules accept, below 0.5 on every
    other, and above 0 on a wrong answer exactly when one of its calls names an expected function."""
    from agentrl_ray.tasks.bfcl.matcher import credit

    partial = 0
    for task in data.load_tasks(category):
        expected = {next(iter(e)) for e in task.ground_truth}
        for calls in [data.reference_calls(task), *perturbations(task, PER_TASK)]:
            value = credit(calls, list(task.functions), list(task.ground_truth), task.category)
            if _judge(task, calls).valid:
                assert value == 1.0, (task.id, calls)
                continue
            assert 0.0 <= value < 0.5, (task.id, calls, value)
            assert (value > 0) == any(name in expected for name, _ in calls), (task.id, calls, value)
            partial += value > 0
    # irrelevance has no expected function: a call where none is right earns nothing
    assert (partial == 0) == (category == "irrelevance")


def test_partial_credit_orders_answers_by_how_much_is_right():
    from agentrl_ray.tasks.bfcl.matcher import credit

    task = next(
        t for t in data.load_tasks("parallel") if len(t.ground_truth) == 2 and len(data.reference_calls(t)[0][1]) >= 2
    )
    functions, truth = list(task.functions), list(task.ground_truth)
    reference = data.reference_calls(task)
    name, arguments = reference[0]
    one_wrong = {**arguments, next(iter(arguments)): "surely not an allowed value"}
    scores = [
        credit(reference, functions, truth, task.category),  # right: 1.0
        credit(reference[:1], functions, truth, task.category),  # one of two calls
        credit([(name, one_wrong), reference[1]], functions, truth, task.category),  # one argument wrong
        credit([("not_a_function", {})] * 2, functions, truth, task.category),  # another function
        credit([], functions, truth, task.category),  # no call
    ]
    assert scores[0] == 1.0 and scores[3] == scores[4] == 0.0
    assert 0 < scores[1] < 0.5 and scores[1] < scores[2] < 0.5, scores


def test_the_environment_pays_partial_credit_only_when_asked():
    from examples.bfcl.env import BFCLEnv

    task = data.load_tasks("simple_python")[0]
    row = data.task_row(task)
    name, arguments = data.reference_calls(task)[0]
    wrong = _text([(name, {k: "surely not an allowed value" for k in arguments})])
    rewards = {}
    for mode in ("verdict", "partial"):
        env = BFCLEnv(reward=mode)
        env.reset(**row)
        rewards[mode] = (env.step(_text(data.reference_calls(task)))[1], env.step(wrong)[1])
    assert rewards["verdict"] == (1.0, 0.0)
    assert rewards["partial"][0] == 1.0 and 0.0 < rewards["partial"][1] < 0.5
    with pytest.raises(ValueError, match="reward must be one of"):
        BFCLEnv(reward="shaped")
