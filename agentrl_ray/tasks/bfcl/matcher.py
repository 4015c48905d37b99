"""BFCL's AST check of single-turn function calls, written from the rules of its checker
(`bfcl_eval/eval_checker/ast_eval/ast_checker.py`, Python language), so that our verdicts equal BFCL's:
tests/unit/test_bfcl_matcher.py runs both on the ground truths and thousands of perturbations of them.

The model's calls, `[(name, arguments)]`, are judged against the task's function docs and `ground_truth` (a list of
`{name: {argument: [allowed values]}}`; "" among the allowed values: the argument may be left out):

- simple and multiple: exactly as many calls as the ground truth has (one), and that call matches it;
- parallel, parallel_multiple: as many calls as the ground truth has, matched without regard to order. Like BFCL,
  greedily: each expected call in turn takes the first call not taken yet that matches it. (A bipartite matching
  could accept a few more answers, where an early expected call takes a model call a later one needed; BFCL
  does not, and neither do we, so that scores agree.)
- irrelevance: valid when there is no call.

One call matches an expected one when: its name is the expected function's (exactly: `math.factorial` is not
`math_factorial`); every parameter the doc requires is there; every argument is a parameter of the doc and of the
expected call; each value passes the type rule and is allowed; every expected parameter left out has "" among its
allowed values. Types (BFCL's Python mapping: any is checked as a string, tuple as an array):

- an int is accepted for a float (then compared as a float), a bool is not an int;
- a value of the type of the allowed values is accepted where they differ from the doc's type (BFCL's "variable"
  case) and then compared as is;
- arrays are typed element by element against an allowed list (no int-for-float here, as in BFCL).

Values: strings compare normalised (lowercased, without spaces and `,./-_*^`, ' read as "); arrays compare as
lists with their string elements normalised; a dict compares key by key against each allowed dict ({key: [allowed
values]}, keys with "" may be missing) and an array of dicts element by element; everything else by Python
equality. Like BFCL, nesting is read one level deep: inside a dict or a list, nested values compare by plain
equality.

Linear in the calls and arguments but for the parallel matching (calls x expected calls, at most 8 x 8 in BFCL).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

OPTIONAL = ""  # an allowed value meaning "may be left out"
NO_CALL = "irrelevance"

# BFCL's types as Python types (its PYTHON_TYPE_MAPPING): "any" is checked as a string, a tuple as a list.
_PY_TYPES: dict[str, type] = {
    "string": str,
    "integer": int,
    "float": float,
    "boolean": bool,
    "array": list,
    "tuple": list,
    "dict": dict,
    "any": str,
}
_LISTS = ("array", "tuple")
_DROPPED = str.maketrans("", "", " ,./-_*^")

Call = tuple[str, dict[str, Any]]


@dataclass(frozen=True)
class Verdict:
    valid: bool
    error: str = ""  # the first reason it is not valid


VALID = Verdict(True)


def check(calls: list[Call], functions: list[dict], ground_truth: list[dict], category: str) -> Verdict:
    """The verdict on the calls of one answer to a task of `category` (BFCL's category names)."""
    if category == NO_CALL:
        if calls:
            return Verdict(False, f"called {calls[0][0]!r} on an irrelevance task: the right answer is no call")
        return VALID
    if len(calls) != len(ground_truth):
        return Verdict(False, f"{len(calls)} call(s), expected {len(ground_truth)}")
    docs = {f["name"]: f for f in functions}
    if "parallel" in category:
        return _check_unordered(calls, docs, ground_truth)
    return check_call(calls[0], docs, ground_truth[0])


def _check_unordered(calls: list[Call], docs: dict[str, dict], ground_truth: list[dict]) -> Verdict:
    taken: set[int] = set()
    for n, expected in enumerate(ground_truth):
        first_error = ""
        for i, call in enumerate(calls):
            if i in taken:
                continue
            verdict = check_call(call, docs, expected)
            if verdict.valid:
                taken.add(i)
                break
            first_error = first_error or f"call {i}: {verdict.error}"
        else:
            name = next(iter(expected))
            return Verdict(False, f"no call left matches expected call {n} ({name}); {first_error}")
    return VALID


def check_call(call: Call, docs: dict[str, dict], expected: dict[str, dict[str, list]]) -> Verdict:
    """One call against one expected call (`{name: {argument: [allowed values]}}`) of the function docs `docs`."""
    ((want, allowed),) = expected.items()
    name, arguments = call
    if name != want:
        return Verdict(False, f"called {name!r}, expected {want!r}")
    params = docs[want]["parameters"]
    properties = params["properties"]
    for param in params.get("required", ()):
        if param not in arguments:
            return Verdict(False, f"{name}: missing required argument {param!r}")
    for param, value in arguments.items():
        if param not in properties or param not in allowed:
            return Verdict(False, f"{name}: unexpected argument {param!r}")
        error = _check_value(value, properties[param], allowed[param])
        if error:
            return Verdict(False, f"{name}: argument {param!r}: {error}")
    for param, values in allowed.items():
        if param not in arguments and OPTIONAL not in values:
            return Verdict(False, f"{name}: missing argument {param!r} (the answer needs it)")
    return VALID


# ---------------------------------------------------------------- partial credit (ours, not BFCL's)


def credit(calls: list[Call], functions: list[dict], ground_truth: list[dict], category: str) -> float:
    """A shaping signal for RL, not a BFCL score: 1.0 exactly when `check` accepts the calls, else below 0.5, more
    the closer the calls come. On an irrelevance task it is the verdict (a call earns nothing).

    Each expected call takes, greedily in order, the not yet taken call that earns it the most: nothing for another
    function, else (1 + its arguments that pass) / (1 + the parameters in play: required, expected or given). The
    sum is divided by the larger of the expected and the given number of calls (an extra call costs as a missing
    one does), then halved, so that every wrong answer stays below any right one."""
    if check(calls, functions, ground_truth, category).valid:
        return 1.0
    if category == NO_CALL or not calls or not ground_truth:
        return 0.0
    docs = {f["name"]: f for f in functions}
    taken: set[int] = set()
    earned = 0.0
    for expected in ground_truth:
        scores = [(call_credit(c, docs, expected), i) for i, c in enumerate(calls) if i not in taken]
        best, index = max(scores, default=(0.0, -1))
        if best > 0:
            taken.add(index)
            earned += best
    return 0.5 * earned / max(len(calls), len(ground_truth))


def call_credit(call: Call, docs: dict[str, dict], expected: dict[str, dict[str, list]]) -> float:
    """How much of one expected call a call gets right, in [0, 1] (`credit`): 0 for another function."""
    ((want, allowed),) = expected.items()
    name, arguments = call
    if name != want or want not in docs:
        return 0.0
    params = docs[want]["parameters"]
    properties = params["properties"]
    in_play = set(params.get("required", ())) | set(allowed) | set(arguments)
    right = 0
    for param in in_play:
        if param not in arguments:
            right += param in allowed and OPTIONAL in allowed[param] and param not in params.get("required", ())
        elif param in properties and param in allowed:
            right += not _check_value(arguments[param], properties[param], allowed[param])
    return (1 + right) / (1 + len(in_play))


def normalize(text: str) -> str:
    """BFCL's string comparison form: without spaces and ,./-_*^, lowercased, ' read as "."""
    return text.translate(_DROPPED).lower().replace("'", '"')


def _check_value(value: Any, schema: dict[str, Any], allowed: list) -> str:
    """ "" when `value` passes the type rule and is allowed; else why not."""
    kind = schema["type"]
    expected = _PY_TYPES[kind]
    item_type = _PY_TYPES[schema["items"]["type"]] if kind in _LISTS else None
    if kind == "float" and type(value) is int:
        value = float(value)
    answer_type = next((type(a) for a in allowed if a != OPTIONAL), None)
    # BFCL's "variable": the allowed values are of another type than the doc's; a value of their type is compared
    # as is.
    variable = answer_type is not None and answer_type is not expected
    if type(value) is expected:
        if item_type is not None and not any(_items_typed(value, item_type, a) for a in allowed):
            return f"elements of {_show(value)} are not all {item_type.__name__}"
    elif answer_type is not None and type(value) is answer_type:
        variable = True
    else:
        return f"expected {kind}, got {type(value).__name__} {_show(value)}"
    if not variable:
        if expected is dict:
            return _check_dict(value, allowed)
        if expected is list and item_type is dict:
            return _check_dict_list(value, allowed)
        if expected is str:
            ok = normalize(value) in [normalize(a) for a in allowed if type(a) is str]
            return "" if ok else f"{_show(value)} is not one of {_show(allowed)} (compared normalised)"
        if expected is list:
            ok = _normalized(value) in [_normalized(a) for a in allowed if isinstance(a, list | str)]
            return "" if ok else f"{_show(value)} is not one of {_show(allowed)}"
    return "" if value in allowed else f"{_show(value)} is not one of {_show(allowed)}"


def _items_typed(value: list, item_type: type, allowed_value: Any) -> bool:
    # An allowed value that is not a list (the "" of an optional argument) types any array, as in BFCL.
    if type(allowed_value) is not list:
        return True
    answer_type = next((type(a) for a in allowed_value if a != OPTIONAL), None)
    return all(type(v) is item_type or (answer_type is not None and type(v) is answer_type) for v in value)


def _normalized(values: list | str) -> list:
    # An allowed "" is the empty list here; BFCL reads any string element by element.
    return [normalize(v) if type(v) is str else v for v in values]


def _check_dict(value: dict, allowed: list) -> str:
    error = "no allowed dict"
    for possible in allowed:
        if possible == OPTIONAL:
            continue
        error = _dict_mismatch(value, possible)
        if not error:
            return ""
    return error


def _dict_mismatch(value: Any, possible: Any) -> str:
    if not isinstance(value, dict):
        return f"expected a dict, got {_show(value)}"
    if not isinstance(possible, dict):
        return f"the allowed value {_show(possible)} is not a dict"
    for key, item in value.items():
        if key not in possible:
            return f"unexpected key {key!r}"
        options = possible[key]
        if not isinstance(options, list):
            return f"the allowed values of key {key!r} are not a list"
        if (normalize(item) if type(item) is str else item) not in _normalized(options):
            return f"key {key!r}: {_show(item)} is not one of {_show(options)}"
    for key, options in possible.items():
        if key not in value and OPTIONAL not in options:
            return f"missing key {key!r}"
    return ""


def _check_dict_list(value: list, allowed: list) -> str:
    error = "no allowed list of dicts"
    for possible in allowed:
        if not isinstance(possible, list | str) or (isinstance(possible, str) and possible != OPTIONAL):
            continue
        if len(value) != len(possible):
            error = f"{len(value)} dicts, expected {len(possible)}"
            continue
        for i, (item, want) in enumerate(zip(value, possible)):
            error = _check_dict(item, [want])
            if error:
                error = f"dict {i}: {error}"
                break
        else:
            return ""
    return error


def _show(value: Any, limit: int = 80) -> str:
    text = repr(value)
    return text if len(text) <= limit else text[:limit] + "..."
