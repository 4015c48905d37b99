"""Environments written against verifiers' classic API (verifiers 0.3.1: `vf.ToolEnv`, `vf.SingleTurnEnv`,
`vf.Rubric`), as their authors would; tests/unit/test_verifiers.py trains against them unchanged. The task is the
built-in model's: arithmetic with a calculator tool (described as the built-in model saw it in its warm start)."""

from __future__ import annotations

import verifiers as vf
from datasets import Dataset

QUESTIONS = [(347, "*", 29), (812, "-", 95), (64, "+", 918), (125, "*", 8)]


def calculator(expression: str) -> str:
    """Evaluate an arithmetic expression and return the result.

    Args:
        expression: The expression to evaluate, e.g. "12 * 7".
    """
    a, op, b = expression.split()
    return str({"+": int(a) + int(b), "-": int(a) - int(b), "*": int(a) * int(b)}[op])


def _rows() -> Dataset:
    return Dataset.from_list(
        [{"question": f"What is {a} {op} {b}?", "answer": calculator(f"{a} {op} {b}")} for a, op, b in QUESTIONS]
    )


async def correct_answer(completion, answer) -> float:
    """1.0 when the last message holds the answer."""
    return float(answer in str(completion[-1].content or "")) if completion else 0.0


async def called_the_tool(completion) -> float:
    return float(any(getattr(m, "role", "") == "tool" for m in completion))


def load_environment(max_turns: int = 3) -> vf.Environment:
    """A ToolEnv: the calculator as its tool, the answer and the tool's use as its rubric (weights 1 and 0)."""
    rubric = vf.Rubric(funcs=[correct_answer, called_the_tool], weights=[1.0, 0.0])
    return vf.ToolEnv(dataset=_rows(), tools=[calculator], rubric=rubric, max_turns=max_turns)


def load_single_turn() -> vf.Environment:
    return vf.SingleTurnEnv(dataset=_rows(), rubric=vf.Rubric(funcs=[correct_answer]))
