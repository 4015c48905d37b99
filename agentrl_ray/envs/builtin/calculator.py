"""CalculatorEnv: the default environment, one `calculator` tool for arithmetic.

Expressions are parsed with `ast` and evaluated node by node over a whitelist of operators; nothing reaches
`eval`, names, calls or attributes are rejected, and the sizes that could make one call slow (expression length,
exponent, magnitude of integer results) are bounded so the tool always answers quickly.
"""

from __future__ import annotations

import ast
import math
import operator
import warnings
from typing import Any

MAX_EXPRESSION_CHARS = 500
MAX_EXPONENT = 100
MAX_INT_DIGITS = 100  # integers past a googol are an error, not a 4,000-digit observation
SIGNIFICANT_DIGITS = 12

_BINARY = {
    ast.Add: operator.add,
    ast.Sub: operator.sub,
    ast.Mult: operator.mul,
    ast.Div: operator.truediv,
    ast.FloorDiv: operator.floordiv,
    ast.Mod: operator.mod,
    ast.Pow: operator.pow,
}
_UNARY = {ast.USub: operator.neg, ast.UAdd: operator.pos}
_HINTS = {ast.BitXor: "use ** for powers, ^ is not supported"}
# Python's parser warns about some of what a model writes ("5or 2", "2in x": SyntaxWarning "invalid decimal literal")
# before it parses it; such an expression is rejected below with a reason, so the warning would only print a line on
# the console per tool call. Ignored for our own parses only (their filename).
_SOURCE = "<calculator>"
warnings.filterwarnings("ignore", category=SyntaxWarning, module=_SOURCE)


class CalculatorEnv:
    """Arithmetic with a calculator tool. Stateless: one instance per trajectory costs nothing."""

    def reset(self, **row: Any) -> None:
        return None

    def calculator(self, expression: str) -> str:
        """Evaluate an arithmetic expression and return the result.

        Supports + - * / // % ** (exponent at most 100), parentheses, unary minus, integers and decimals.

        Args:
            expression: The expression to evaluate, e.g. "(347 * 29) - 12.5".
        """
        return format_number(evaluate(expression))


def evaluate(expression: str) -> int | float:
    """The value of an arithmetic expression; ValueError with the reason if it is not one we evaluate."""
    if len(expression) > MAX_EXPRESSION_CHARS:
        raise ValueError(f"expression is {len(expression)} characters, the limit is {MAX_EXPRESSION_CHARS}")
    try:
        tree = ast.parse(expression.strip(), filename=_SOURCE, mode="eval")
    except SyntaxError as e:
        shown = expression if len(expression) <= 80 else expression[:80] + "..."
        raise ValueError(f"invalid expression {shown!r}: {e.msg}") from None
    except (RecursionError, MemoryError):
        raise ValueError("expression is nested too deeply") from None
    try:
        return _eval(tree.body)
    except RecursionError:
        raise ValueError("expression is nested too deeply") from None


def _eval(node: ast.AST) -> int | float:
    if isinstance(node, ast.Constant):
        # bool is an int subclass: `True + 1` is not arithmetic we want to teach.
        if isinstance(node.value, int | float) and not isinstance(node.value, bool):
            return node.value
        raise ValueError(f"unsupported value {node.value!r}: only numbers are allowed")
    if isinstance(node, ast.UnaryOp) and type(node.op) in _UNARY:
        return _check(_UNARY[type(node.op)](_eval(node.operand)))
    if isinstance(node, ast.BinOp) and type(node.op) in _BINARY:
        left, right = _eval(node.left), _eval(node.right)
        return _check(_apply(node.op, left, right))
    if isinstance(node, ast.BinOp):
        hint = _HINTS.get(type(node.op), "supported: + - * / // % **")
        raise ValueError(f"unsupported operator {type(node.op).__name__}: {hint}")
    if isinstance(node, ast.Name):
        raise ValueError(f"unknown name {node.id!r}: only numbers and operators are allowed")
    raise ValueError(f"unsupported syntax ({type(node).__name__}): only numbers, + - * / // % ** and parentheses")


def _apply(op: ast.operator, left: int | float, right: int | float) -> int | float:
    if isinstance(op, ast.Pow) and abs(right) > MAX_EXPONENT:
        raise ValueError(f"exponent {format_number(right)} is too large (at most {MAX_EXPONENT})")
    try:
        result = _BINARY[type(op)](left, right)
    except ZeroDivisionError:
        raise ValueError("division by zero") from None
    except OverflowError:
        raise ValueError("result is too large") from None
    if isinstance(result, complex):
        raise ValueError("result is not a real number (fractional power of a negative number)")
    return result


def _check(value: int | float) -> int | float:
    if isinstance(value, float) and not math.isfinite(value):
        raise ValueError("result is too large")
    if isinstance(value, int) and abs(value) >= 10**MAX_INT_DIGITS:
        raise ValueError(f"result has more than {MAX_INT_DIGITS} digits")
    return value


def format_number(value: int | float) -> str:
    """Integers as integers (also 6/3 = 2.0 -> "2"); other floats to 12 significant digits."""
    if isinstance(value, float) and value.is_integer() and abs(value) < 1e15:
        return str(int(value))
    if isinstance(value, float):
        return f"{value:.{SIGNIFICANT_DIGITS}g}"
    return str(value)
