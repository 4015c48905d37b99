"""The hermes chat format of a tool-using conversation, both directions, shared by rollouts, env hosts, rewards and
the supervised warm-up: rendering (the token segments appended after a turn, a tool call's text) and parsing (the
tool calls of an assistant turn, the final answer of the last one).

Tokens in, tokens out: the rollout never re-renders a conversation. After the policy emits a turn ending in
`<|im_end|>`, the tool results are appended as separately encoded segments, each tagged with its role:

    \\n<|im_start|>user                      template
    \\n<tool_response>\\n                     template
    {result text}                           env        (the ECHO loss predicts these tokens)
    \\n</tool_response>                      template   (one block per tool call)
    <|im_end|>\\n<|im_start|>assistant\\n      template

which is exactly what the Qwen2.5 / hermes chat template renders for `role: tool` messages, so a model trained
here behaves the same under `tokenizer.apply_chat_template` and under vLLM's hermes tool parser.

A turn-based environment's observation becomes a plain user message, appended the same way:

    \\n<|im_start|>user\\n                    template
    {observation}                           env
    <|im_end|>\\n<|im_start|>assistant\\n     template

Parsing reads the format that Qwen2.5 chat templates render, vLLM's `hermes` tool parser reads and TRL's tool loop
expects (`render_tool_call` writes it):

    Let me compute that.
    <tool_call>
    {"name": "calculator", "arguments": {"expression": "2 + 2"}}
    </tool_call>

A malformed call never raises: it becomes an entry in `ParsedTurn.errors`, which the env host turns into an error
observation, so the policy sees what it got wrong and the failure shows up in the tool-error metric.
"""

from __future__ import annotations

import json
import math
import re
from dataclasses import dataclass, field
from typing import Any

from agentrl_ray.types import TokenRole

Segment = tuple[str, TokenRole]  # a text and the role of every token it encodes to

END_OF_TURN = "<|im_end|>"
TOOL_CALL_OPEN = "<tool_call>"
TOOL_CALL_CLOSE = "</tool_call>"


def tool_response_segments(results: list[str]) -> list[Segment]:
    """The text segments (with roles) that follow an assistant turn carrying tool calls."""
    segments: list[Segment] = [("\n<|im_start|>user", TokenRole.TEMPLATE)]
    for text in results:
        segments.append(("\n<tool_response>\n", TokenRole.TEMPLATE))
        if text:
            segments.append((text, TokenRole.ENV))
        segments.append(("\n</tool_response>", TokenRole.TEMPLATE))
    segments.append(("<|im_end|>\n<|im_start|>assistant\n", TokenRole.TEMPLATE))
    return segments


def user_turn_segments(text: str) -> list[Segment]:
    """The text segments (with roles) of a user message that follows an assistant turn (which ended in <|im_end|>),
    up to the next assistant header: what the template renders for `{"role": "user", "content": text}` there."""
    segments: list[Segment] = [("\n<|im_start|>user\n", TokenRole.TEMPLATE)]
    if text:
        segments.append((text, TokenRole.ENV))
    segments.append(("<|im_end|>\n<|im_start|>assistant\n", TokenRole.TEMPLATE))
    return segments


def observation_segments(messages: list[dict[str, str]]) -> list[Segment]:
    """The segments of a turn-based environment's observation given as messages (`envs.base`): the tool results of
    the assistant's calls as one user turn of `<tool_response>` blocks, then a user message (at most one, last), up
    to the next assistant header: what the template renders for those messages after the assistant's turn."""
    results = [m["content"] for m in messages if m["role"] == "tool"]
    user = [m["content"] for m in messages if m["role"] == "user"]
    if not user:
        return tool_response_segments(results)
    segments = tool_response_segments(results)[:-1] + [(END_OF_TURN, TokenRole.TEMPLATE)] if results else []
    return segments + user_turn_segments(user[-1])


def encode_segments(tokenizer, segments: list[Segment]) -> tuple[list[int], list[TokenRole]]:
    """Encode each segment on its own (no special tokens added) and return ids with a role per id."""
    ids: list[int] = []
    roles: list[TokenRole] = []
    for text, role in segments:
        piece = tokenizer.encode(text, add_special_tokens=False)
        ids.extend(piece)
        roles.extend([role] * len(piece))
    return ids, roles


# ---------------------------------------------------------------- tool calls: render and parse


@dataclass
class ToolCall:
    name: str
    arguments: dict[str, Any]
    id: str = ""  # the id the model wrote for the call, where its format has one (Mistral's)


@dataclass
class ParsedTurn:
    calls: list[ToolCall] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)
    content: str = ""  # the text outside the tool-call blocks
    reasoning: str = ""  # text its format marks as reasoning, apart from the content (gpt-oss's analysis channel)


_SNIPPET = 80  # characters of a bad block quoted back in its error message


def parse_tool_calls(text: str, parse_block=None) -> ParsedTurn:
    """All tool calls of one assistant turn, in order, with one error per malformed block.

    A block runs from a `<tool_call>` to the first `</tool_call>` after it; `parse_block` reads its body (default:
    hermes JSON; Qwen3's XML in `rollout/tool_format.py`). The scan is linear: each search starts
    where the last one ended, and once an opening tag has no closing tag after it, none later can have one either
    (a lazy regex retried that search from every later opening tag, quadratic in a turn that repeats the tag).
    """
    turn = ParsedTurn()
    outside: list[str] = []
    pos = 0
    while (start := text.find(TOOL_CALL_OPEN, pos)) >= 0:
        outside.append(text[pos:start])
        body_start = start + len(TOOL_CALL_OPEN)
        end = text.find(TOOL_CALL_CLOSE, body_start)
        if end < 0:
            # Usually the turn ran out of tokens mid-call; the partial call cannot be run.
            snippet = _snip(text[body_start:])
            turn.errors.append(f"unclosed {TOOL_CALL_OPEN} tag (no {TOOL_CALL_CLOSE} after: {snippet})")
            pos = len(text)
            break
        call, error = (parse_block or _parse_block)(text[body_start:end])
        if call is not None:
            turn.calls.append(call)
        else:
            turn.errors.append(error)
        pos = end + len(TOOL_CALL_CLOSE)
    outside.append(text[pos:])
    content = "".join(outside)
    if TOOL_CALL_CLOSE in content:
        turn.errors.append(f"{TOOL_CALL_CLOSE} without a matching {TOOL_CALL_OPEN}")
    turn.content = content.replace(TOOL_CALL_CLOSE, "").strip()
    return turn


def render_tool_call(call: ToolCall) -> str:
    """The text of one tool call as an assistant turn writes it (what `parse_tool_calls` reads back)."""
    return f"{TOOL_CALL_OPEN}\n{json.dumps({'name': call.name, 'arguments': call.arguments})}\n{TOOL_CALL_CLOSE}"


def _parse_block(body: str) -> tuple[ToolCall | None, str]:
    try:
        obj = json.loads(body)
    except json.JSONDecodeError as e:
        return None, f"tool call is not valid JSON ({e.msg} at char {e.pos}): {_snip(body)}"
    except RecursionError:  # json's decoder recurses once per level: "[[[[..." thousands deep
        return None, f"tool call JSON is nested too deeply: {_snip(body)}"
    except ValueError as e:  # e.g. an integer of over 4,300 digits (Python's int-from-string limit)
        return None, f"tool call JSON cannot be read ({e}): {_snip(body)}"
    if not isinstance(obj, dict):
        return None, f'tool call must be a JSON object {{"name": ..., "arguments": {{...}}}}, got: {_snip(body)}'
    return call_from_json(obj)


def call_from_json(obj: Any, keys: tuple[str, ...] = ("arguments",)) -> tuple[ToolCall | None, str]:
    """A decoded JSON call as a ToolCall, or None and the error: a "name" string, and the arguments under the first of
    `keys` the object has (none: no arguments), a JSON object or the JSON-encoded string of one (OpenAI's
    spelling)."""
    name = obj.get("name") if isinstance(obj, dict) else None
    if not isinstance(name, str) or not name.strip():
        return None, f'tool call has no "name" string: {_snip(json.dumps(obj))}'
    key = next((k for k in keys if k in obj), keys[0])
    arguments = obj.get(key, {})
    if isinstance(arguments, str):
        try:
            arguments = json.loads(arguments) if arguments.strip() else {}
        except (ValueError, RecursionError):  # JSONDecodeError is a ValueError
            return None, f'tool call to {name!r}: "{key}" is a string that is not a JSON object'
    if not isinstance(arguments, dict):
        return None, f'tool call to {name!r}: "{key}" must be a JSON object, got {type(arguments).__name__}'
    return ToolCall(name=name.strip(), arguments=arguments), ""


def _snip(s: str) -> str:
    s = s.strip()
    return s if len(s) <= _SNIPPET else s[:_SNIPPET] + "..."


# A number, optionally signed; a sign right after a word character or digit is an operator ("10-3"), not a sign.
# Thousands separators are accepted only in well-formed groups so that "3,4" stays two numbers. The lookahead comes
# first so that a character that cannot start a number is turned away before the lookbehind and the branches run:
# prose scans 2.5x faster, with the same matches (tests/unit/test_parser_linear_time.py holds the earlier form).
_NUMBER = re.compile(r"(?=[-.\d])(?<![\w.])-?(?:(?:\d{1,3}(?:,\d{3})+|\d+)(?:\.\d+)?(?:[eE][-+]?\d+)?|\.\d+)")


def numbers_match(predicted: str | None, expected: Any, rel_tol: float = 1e-6) -> bool:
    """Numeric equality within `rel_tol` relative tolerance; unparsable values never match."""
    if predicted is None or expected is None:
        return False
    try:
        a, b = float(predicted), float(str(expected).replace(",", ""))
    except ValueError:
        return False
    return math.isfinite(a) and math.isfinite(b) and math.isclose(a, b, rel_tol=rel_tol, abs_tol=1e-12)


def extract_final_answer(text: str) -> str | None:
    """The last number in a final answer ("The answer is -12.5." -> "-12.5"), commas removed; None if none."""
    matches = _NUMBER.findall(text)
    return matches[-1].replace(",", "") if matches else None


def prompt_messages(prompt: str | list[dict[str, str]], system_prompt: str = "") -> list[dict[str, str]]:
    """A dataset row's prompt as chat messages, led by `system_prompt` (`rollout.system_prompt`) unless it brings
    its own system message."""
    messages = [{"role": "user", "content": prompt}] if isinstance(prompt, str) else [dict(m) for m in prompt]
    if system_prompt and messages[0]["role"] != "system":
        messages.insert(0, {"role": "system", "content": system_prompt})
    return messages
