"""The default task: arithmetic a small model cannot do in its head, solvable with a `calculator` tool.

Questions read "What is 347 * 29?" with one of + - * and operands drawn uniformly from 10..999 (so mostly 3
digits, 2 digits in ~1 case in 11); subtraction keeps the larger operand first so every answer is a non-negative
integer. Rows follow TRL's conversational format (`prompt` is a list of
chat messages; `answer` is the number as a string, read by the `answer_match` reward).

Train and eval questions never overlap: a question belongs to the eval split when a hash of its text falls in the
eval bucket (1 in 8), whatever the seed or the number of rows asked for, so the built-in model's supervised warm-up
(which draws from the train split) never sees a held-out question.
"""

from __future__ import annotations

import random
import zlib
from typing import Any

OPERATORS = ("+", "-", "*")
_OP_NAMES = {"+": "add", "-": "sub", "*": "mul"}
MIN_OPERAND, MAX_OPERAND = 10, 999
EVAL_BUCKETS = 8  # one question in EVAL_BUCKETS belongs to the eval split
SPLITS = ("train", "eval")


def question(a: int, op: str, b: int) -> str:
    return f"What is {a} {op} {b}?"


def evaluate(a: int, op: str, b: int) -> int:
    return a + b if op == "+" else a - b if op == "-" else a * b


def split_of(text: str) -> str:
    return "eval" if zlib.crc32(text.encode()) % EVAL_BUCKETS == 0 else "train"


def sample_problems(n: int, seed: int, split: str) -> list[tuple[int, str, int]]:
    """`n` distinct (a, op, b) problems of `split`, deterministic in (seed, split)."""
    if split not in SPLITS:
        raise ValueError(f"split must be one of {SPLITS}, got {split!r}")
    rng = random.Random(f"arithmetic/{seed}/{split}")
    seen: set[tuple[int, str, int]] = set()
    problems = []
    while len(problems) < n:
        a, b = rng.randint(MIN_OPERAND, MAX_OPERAND), rng.randint(MIN_OPERAND, MAX_OPERAND)
        op = rng.choice(OPERATORS)
        if op == "-" and b > a:
            a, b = b, a
        if (a, op, b) in seen or split_of(question(a, op, b)) != split:
            continue
        seen.add((a, op, b))
        problems.append((a, op, b))
    return problems


def make_arithmetic_rows(n: int, seed: int, split: str) -> list[dict[str, Any]]:
    """`n` rows {"prompt": [user message], "answer": "10063", "id": ...} of the given split ("train" or "eval")."""
    rows = []
    for a, op, b in sample_problems(n, seed, split):
        text = question(a, op, b)
        rows.append(
            {
                "prompt": [{"role": "user", "content": text}],
                "answer": str(evaluate(a, op, b)),
                "id": f"{split}-{a}-{_OP_NAMES[op]}-{b}",
            }
        )
    return rows
