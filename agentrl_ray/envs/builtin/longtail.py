"""LongTailEnv: the long-tail agent workload's environment (rows from `builtin:longtail`, `tasks/longtail.py`).

A turn-based environment (`step`, `agentrl_ray.envs.base`) with the calculator's tool (its schema in the prompt)
that runs the model's calls itself, as a multi-turn benchmark's environment does: an assistant turn with
`<tool_call>` blocks gets their results as tool messages; a turn without one answers the current question, scored
1/k when its last number is right, and brings the next question as a user message, until the session's k questions
are done. Every step first waits a log-normal time, median `median_s`, log-sd `sigma` (1.0: p99 = 10.2x the median),
drawn from a generator seeded by the row's id, so that a run's latencies repeat. The wait is an asyncio sleep:
thousands of episodes wait at once on one env host without holding a thread each.
"""

from __future__ import annotations

import asyncio
import math
import random
import zlib
from typing import Any

from agentrl_ray.chat_format import extract_final_answer, numbers_match, parse_tool_calls
from agentrl_ray.envs.builtin.calculator import CalculatorEnv


def p99_over_median(sigma: float) -> float:
    """A log-normal latency's p99 as a multiple of its median: exp(2.326 sigma)."""
    return math.exp(2.3263478740408408 * sigma)


class LongTailEnv(CalculatorEnv):
    """The calculator's tool (its schema in the prompt, inherited) with `step`: a turn-based environment."""

    def __init__(self, median_s: float = 0.05, sigma: float = 1.0, seed: int = 0) -> None:
        if median_s < 0 or sigma < 0:
            raise ValueError(f"LongTailEnv: median_s and sigma must be >= 0, got {median_s}, {sigma}")
        self.median_s, self.sigma, self.seed = median_s, sigma, seed
        self.questions: list[str] = []
        self.answers: list[str] = []
        self.current = 0
        self.waited_s = 0.0  # the latency this episode has waited so far
        self.rng = random.Random(0)

    def reset(self, **row: Any) -> None:
        if not row.get("questions") or len(row["questions"]) != len(row.get("answers", ())):
            raise ValueError(
                "LongTailEnv: the row needs `questions` and `answers` of the same length (builtin:longtail)"
            )
        self.questions, self.answers, self.current = list(row["questions"]), list(row["answers"]), 0
        self.rng = random.Random(zlib.crc32(f"{self.seed}/{row.get('id', '')}".encode()))
        self.waited_s = 0.0
        return None

    async def step(self, text: str) -> tuple[list[dict[str, str]] | None, float, bool]:
        delay = self.median_s * math.exp(self.sigma * self.rng.gauss(0.0, 1.0))
        self.waited_s += delay
        await asyncio.sleep(delay)
        parsed = parse_tool_calls(text)
        if parsed.calls or parsed.errors:
            results = [self._calculate(c.name, c.arguments) for c in parsed.calls]
            results += [f"Error: could not parse tool call: {e}" for e in parsed.errors]
            return [{"role": "tool", "content": r} for r in results], 0.0, False
        k = len(self.questions)
        reward = float(numbers_match(extract_final_answer(text), self.answers[self.current])) / k
        self.current += 1
        if self.current == k:
            return None, reward, True
        return [{"role": "user", "content": self.questions[self.current]}], reward, False

    def _calculate(self, name: str, arguments: dict[str, Any]) -> str:
        if name != "calculator":
            return f"Error: unknown tool {name!r} (the only tool is calculator)"
        try:
            return self.calculator(**arguments)
        except (TypeError, ValueError, ArithmeticError) as e:
            return f"Error: {e}"
