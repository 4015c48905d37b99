"""bfcl_ast: BFCL's AST verdict on a completion as a reward, 1.0 valid, 0.0 not (TRL's signature).

    reward:
      functions: [examples.bfcl.reward:bfcl_ast]
      weights: [1.0]

It reads the rows' `functions`, `ground_truth` and `category` columns (`agentrl_ray.tasks.bfcl.data`) and judges
the calls of the completion's first assistant turn, the answer to the task's question, with
`agentrl_ray.tasks.bfcl.matcher`. `BFCLEnv` (env.py) gives the same verdict as its step reward, so with that
environment `env_reward` is the same number; this function serves any other setup (e.g. scoring saved traces).

One rule on top of BFCL's checker: a malformed `<tool_call>` block (not JSON, no name, unclosed) makes the answer
invalid in every category, irrelevance included. BFCL's own reader of this format (its Qwen FC handler) drops such
blocks silently, so on an irrelevance task it would score broken calls as "no call"; a reward that paid for them
would teach the policy to emit them.
"""

from __future__ import annotations

import json
from typing import Any

from agentrl_ray.chat_format import parse_tool_calls
from agentrl_ray.tasks.bfcl.matcher import Verdict, check, credit

Completion = list[dict[str, Any]] | str


def judge_text(text: str, functions: Any, ground_truth: Any, category: str) -> Verdict:
    """The verdict on one assistant turn's text (hermes `<tool_call>` blocks)."""
    parsed = parse_tool_calls(text)
    if parsed.errors:
        return Verdict(False, f"malformed tool call: {parsed.errors[0]}")
    calls = [(c.name, c.arguments) for c in parsed.calls]
    return check(calls, _loaded(functions), _loaded(ground_truth), category)


def credit_text(text: str, functions: Any, ground_truth: Any, category: str) -> float:
    """`matcher.credit` of one assistant turn's text: 1.0 when BFCL's check accepts it, a malformed block 0.0."""
    parsed = parse_tool_calls(text)
    if parsed.errors:
        return 0.0
    calls = [(c.name, c.arguments) for c in parsed.calls]
    return credit(calls, _loaded(functions), _loaded(ground_truth), category)


def judge(completion: Completion, functions: Any, ground_truth: Any, category: str) -> Verdict:
    """The verdict on a completion: a string, or messages (structured `tool_calls` or raw blocks in the content)."""
    if isinstance(completion, str):
        return judge_text(completion, functions, ground_truth, category)
    first = next((m for m in completion if m.get("role") == "assistant"), None)
    if first is None:
        return judge_text("", functions, ground_truth, category)
    structured = first.get("tool_calls") or []
    if not structured:
        return judge_text(first.get("content") or "", functions, ground_truth, category)
    # Structured calls were taken out of the content, unless the turn also held a malformed block (then the raw
    # text stays, well-formed blocks included): the calls come from `tool_calls`, the errors from the content.
    parsed = parse_tool_calls(first.get("content") or "")
    if parsed.errors:
        return Verdict(False, f"malformed tool call: {parsed.errors[0]}")
    calls = []
    for call in structured:
        function = call.get("function", call)
        arguments = function.get("arguments", {})
        if isinstance(arguments, str):  # OpenAI's wire form
            try:
                arguments = json.loads(arguments) if arguments.strip() else {}
            except ValueError:
                return Verdict(False, f"malformed tool call: arguments of {function.get('name')!r} are not JSON")
        if not isinstance(arguments, dict):
            return Verdict(False, f"malformed tool call: arguments of {function.get('name')!r} are not an object")
        calls.append((function.get("name", ""), arguments))
    return check(calls, _loaded(functions), _loaded(ground_truth), category)


def bfcl_ast(
    completions: list[Completion], functions: list, ground_truth: list, category: list, **kwargs: Any
) -> list[float]:
    """1.0 where BFCL's AST check accepts the sample's calls, else 0.0 (a malformed call included)."""
    return [
        float(judge(c, f, g, k).valid)
        for c, f, g, k in zip(completions, functions, ground_truth, category, strict=True)
    ]


def _loaded(column: Any) -> list:
    return json.loads(column) if isinstance(column, str) else list(column)
