"""The long-tail agent workload (`data.train: builtin:longtail`, with `agentrl_ray.envs.builtin.longtail`): sessions
of 1-4 arithmetic questions asked one after another, each solved with a calculator the environment runs.

What makes it the workload the asynchronous pipeline is measured on (`benchmarks/run.py rollout --mode
pipeline_timeline`):
- heavy-tailed length: a session holds k questions with P(k) = 1/2, 1/4, 1/8, 1/8 for k = 1..4, and each question
  takes the model ~2 turns (a tool call, then its answer), so ~2-8 turns per episode, most of them short;
- heavy-tailed latency: every environment step (a tool call run, an answer checked and the next question given)
  takes a log-normal time (`LongTailEnv`'s median_s and sigma; sigma 1.0 puts p99 at 10.2x the median).

Rows: {"id", "prompt": [the first question], "questions": [all k], "answers": [k numbers as text], "answer": the
last answer}; the calculator's schema comes from the environment. Questions come from `arithmetic.sample_problems`
(train and eval never share one).
"""

from __future__ import annotations

import random
from typing import Any

from agentrl_ray.tasks.arithmetic import evaluate, question, sample_problems

SESSION_LENGTHS = (1, 2, 3, 4)
SESSION_WEIGHTS = (4, 2, 1, 1)  # P(k) = 1/2, 1/4, 1/8, 1/8


def make_longtail_rows(n: int, seed: int, split: str) -> list[dict[str, Any]]:
    rng = random.Random(f"longtail/{seed}/{split}")
    lengths = rng.choices(SESSION_LENGTHS, SESSION_WEIGHTS, k=n)
    problems = iter(sample_problems(sum(lengths), seed, split))
    rows = []
    for i, k in enumerate(lengths):
        session = [next(problems) for _ in range(k)]
        questions = [question(*p) for p in session]
        answers = [str(evaluate(*p)) for p in session]
        rows.append(
            {
                "id": f"{split}-session-{i}-{k}q",
                "prompt": [{"role": "user", "content": questions[0]}],
                "questions": questions,
                "answers": answers,
                "answer": answers[-1],
            }
        )
    return rows
