"""CodeExecutionEnv end to end through the real sandbox."""

from __future__ import annotations

import os

import pytest

from agentrl_ray.envs.builtin.code_exec import CodeExecutionEnv, final_code
from agentrl_ray.envs.loading import load_env_class
from agentrl_ray.envs.tools import tool_schemas

pytestmark = [
    pytest.mark.timeout(60),
    pytest.mark.skipif(os.geteuid() != 0, reason="the sandbox refuses to run without root (no separate uid)"),
]

MBPP_TESTS = "assert add(1, 2) == 3\nassert add(-1, 1) == 0"
HUMANEVAL_TESTS = "def check(candidate):\n    assert candidate([3, 1, 2]) == [1, 2, 3]\n    assert candidate([]) == []"


def answer(code: str) -> str:
    return f"Here is my solution:\n```python\n{code}\n```\nDone."


def make_env(tests: str, entry_point: str | None = None, **limits) -> CodeExecutionEnv:
    env = CodeExecutionEnv(**limits)
    env.reset(prompt=[{"role": "user", "content": "..."}], tests=tests, entry_point=entry_point)
    return env


def test_contract_tools_are_run_python_only():
    cls = load_env_class("agentrl_ray.envs.builtin.code_exec:CodeExecutionEnv")
    assert [s["function"]["name"] for s in tool_schemas(cls)] == ["run_python"]


def test_run_python_tool_returns_the_observation():
    env = make_env(MBPP_TESTS)
    assert env.run_python("print(6 * 7)") == "42"
    assert "ZeroDivisionError" in env.run_python("1 / 0") and "[exit code 1]" in env.run_python("1 / 0")


def test_correct_solution_scores_1():
    assert make_env(MBPP_TESTS).reward(answer("def add(a, b):\n    return a + b")) == 1.0


def test_wrong_or_missing_solution_scores_0():
    env = make_env(MBPP_TESTS)
    assert env.reward(answer("def add(a, b):\n    return a - b")) == 0.0
    assert env.reward("def add(a, b): return a + b  (no code block)") == 0.0
    assert env.reward(answer("def add(a, b)\n    return a + b")) == 0.0  # syntax error


def test_last_block_is_the_answer():
    draft, final = "def add(a, b):\n    return 0", "def add(a, b):\n    return a + b"
    completion = answer(draft) + "\nOn second thought:\n" + answer(final)
    assert final_code(completion) == final + "\n"
    assert make_env(MBPP_TESTS).reward(completion) == 1.0
    assert make_env(MBPP_TESTS).reward(answer(final) + answer(draft)) == 0.0


def test_humaneval_check_is_called_with_the_entry_point():
    env = make_env(HUMANEVAL_TESTS, entry_point="sort_list")
    assert env.reward(answer("def sort_list(xs):\n    return sorted(xs)")) == 1.0
    assert env.reward(answer("def sort_list(xs):\n    return xs")) == 0.0


def test_exiting_before_the_tests_scores_0():
    env = make_env(MBPP_TESTS)
    for escape in ("import sys\nsys.exit(0)", "import os\nos._exit(0)", "raise SystemExit"):
        assert env.reward(answer(f"def add(a, b):\n    return 0\n{escape}")) == 0.0


def test_infinite_loop_scores_0_within_the_time_limit():
    env = make_env(MBPP_TESTS, wall_time_s=1.0)
    assert env.reward(answer("def add(a, b):\n    while True:\n        pass")) == 0.0
    assert "wall-clock timeout after 1.0s" in env.run_python("while True:\n    pass")


def test_unknown_limit_is_an_error():
    with pytest.raises(TypeError):
        CodeExecutionEnv(wall_time=1.0)
