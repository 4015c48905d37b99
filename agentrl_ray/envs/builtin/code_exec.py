"""CodeExecutionEnv: write Python, try it with a `run_python` tool, get rewarded by hidden tests.

Rows carry `tests` (test code the model never sees) and optionally `entry_point` (the function under test). Two
test styles work: plain statements (MBPP: `assert f(1) == 2`), and HumanEval's `def check(candidate): ...`, which
is called with the entry point. Use it with `env.name=agentrl_ray.envs.builtin.code_exec:CodeExecutionEnv`; `env.kwargs`
are `SandboxLimits` fields (keep `wall_time_s` below `env.tool_timeout_s`).

Every execution goes through `envs.isolation.sandbox` (see its threat model). The reward is 1.0 only when the
program made of the final code and the tests exits with a random status chosen for this call, which the harness
returns only after every test ran: `sys.exit(0)`, `os._exit(0)` or a crash before the tests score 0. What it does
not stop: code that reads its own source (where that status is written) or returns objects that compare equal to
anything. The tests cannot be a secret from code that runs in the same process.
"""

from __future__ import annotations

import random
import re
from dataclasses import replace
from typing import Any

from agentrl_ray.envs.isolation import sandbox

_PYTHON_BLOCK = re.compile(r"```(?:python|py)[ \t]*\n(.*?)```", re.S)


class CodeExecutionEnv:
    """Python programming tasks checked by hidden tests, with a sandboxed interpreter as the tool."""

    def __init__(self, **limits: Any) -> None:
        self.limits = replace(sandbox.SandboxLimits(wall_time_s=5.0, cpu_time_s=5), **limits)
        self.tests = ""
        self.entry_point: str | None = None

    def reset(self, **row: Any) -> None:
        self.tests = row["tests"]
        self.entry_point = row.get("entry_point")
        return None

    def run_python(self, code: str) -> str:
        """Run a Python program in a fresh sandbox and return what it printed, its errors and its exit status.

        Nothing persists between calls, and there is no network access. Print the values you want to see.

        Args:
            code: The complete program to run.
        """
        return sandbox.run_python(code, limits=self.limits).observation()

    def reward(self, completion: str) -> float:
        """1.0 when the last ```python block of `completion` passes every hidden test, else 0.0."""
        solution = final_code(completion)
        if solution is None or not self.tests:
            return 0.0
        status = random.SystemRandom().randrange(3, 250)  # not 0 (sys.exit()), 1 (a crash) or 2 (usage errors)
        call = f"\ncheck({self.entry_point})\n" if self.entry_point and "def check(" in self.tests else "\n"
        program = f"{solution}\n\n{self.tests}\n{call}\nimport sys\nsys.stdout.flush()\nsys.exit({status})\n"
        result = sandbox.run_python(program, limits=self.limits)
        return 1.0 if result.exit_code == status else 0.0


def final_code(completion: str) -> str | None:
    """The contents of the last ```python (or ```py) fenced block, or None."""
    blocks = _PYTHON_BLOCK.findall(completion)
    return blocks[-1] if blocks else None
