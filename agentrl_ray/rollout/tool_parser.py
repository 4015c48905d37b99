"""Parse hermes-format tool calls out of an assistant turn.

The hermes format is what Qwen2.5 chat templates render, what vLLM's `hermes` tool parser reads and what TRL's
tool loop expects:

    Let me compute that.
    <tool_call>
    {"name": "calculator", "arguments": {"expression": "2 + 2"}}
    </tool_call>

A malformed call never raises: it becomes an entry in `ParsedTurn.errors`, which the env host turns into an error
observation, so the policy sees what it got wrong and the failure shows up in the tool-error metric.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from typing import Any

from agentrl_ray.chat_format import TOOL_CALL_CLOSE, TOOL_CALL_OPEN


@dataclass
class ToolCall:
    name: str
    arguments: dict[str, Any]


@dataclass
class ParsedTurn:
    calls: list[ToolCall] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)
    content: str = ""  # the text outside the tool-call blocks


_BLOCK = re.compile(re.escape(TOOL_CALL_OPEN) + r"(.*?)" + re.escape(TOOL_CALL_CLOSE), re.DOTALL)
_SNIPPET = 80  # characters of a bad block quoted back in its error message


def parse_tool_calls(text: str) -> ParsedTurn:
    """All tool calls of one assistant turn, in order, with one error per malformed block."""
    turn = ParsedTurn()
    outside: list[str] = []
    pos = 0
    for match in _BLOCK.finditer(text):
        outside.append(text[pos : match.start()])
        pos = match.end()
        call, error = _parse_block(match.group(1))
        if call is not None:
            turn.calls.append(call)
        else:
            turn.errors.append(error)
    tail = text[pos:]
    if TOOL_CALL_OPEN in tail:
        # Usually the turn ran out of tokens mid-call; the partial call cannot be run.
        start = tail.index(TOOL_CALL_OPEN)
        snippet = _snip(tail[start + len(TOOL_CALL_OPEN) :])
        turn.errors.append(f"unclosed {TOOL_CALL_OPEN} tag (no {TOOL_CALL_CLOSE} after: {snippet})")
        tail = tail[:start]
    if TOOL_CALL_CLOSE in "".join(outside) + tail:
        turn.errors.append(f"{TOOL_CALL_CLOSE} without a matching {TOOL_CALL_OPEN}")
    outside.append(tail)
    turn.content = "".join(outside).replace(TOOL_CALL_CLOSE, "").strip()
    return turn


def _parse_block(body: str) -> tuple[ToolCall | None, str]:
    try:
        obj = json.loads(body)
    except json.JSONDecodeError as e:
        return None, f"tool call is not valid JSON ({e.msg} at char {e.pos}): {_snip(body)}"
    if not isinstance(obj, dict):
        return None, f'tool call must be a JSON object {{"name": ..., "arguments": {{...}}}}, got: {_snip(body)}'
    name = obj.get("name")
    if not isinstance(name, str) or not name.strip():
        return None, f'tool call has no "name" string: {_snip(body)}'
    arguments = obj.get("arguments", {})
    if isinstance(arguments, str):
        # OpenAI-style calls carry the arguments as a JSON-encoded string; accept that spelling too.
        try:
            arguments = json.loads(arguments) if arguments.strip() else {}
        except json.JSONDecodeError:
            return None, f'tool call to {name!r}: "arguments" is a string that is not a JSON object'
    if not isinstance(arguments, dict):
        return None, f'tool call to {name!r}: "arguments" must be a JSON object, got {type(arguments).__name__}'
    return ToolCall(name=name.strip(), arguments=arguments), ""


def _snip(s: str) -> str:
    s = s.strip()
    return s if len(s) <= _SNIPPET else s[:_SNIPPET] + "..."


# A number, optionally signed; a sign right after a word character or digit is an operator ("10-3"), not a sign.
# Thousands separators are accepted only in well-formed groups so that "3,4" stays two numbers.
_NUMBER = re.compile(r"(?<![\w.])-?(?:\d{1,3}(?:,\d{3})+|\d+)(?:\.\d+)?(?:[eE][-+]?\d+)?|(?<![\w.])-?\.\d+")


def extract_final_answer(text: str) -> str | None:
    """The last number in a final answer ("The answer is -12.5." -> "-12.5"), commas removed; None if none."""
    matches = _NUMBER.findall(text)
    return matches[-1].replace(",", "") if matches else None
