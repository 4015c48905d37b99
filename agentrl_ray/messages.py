"""Chat messages of an episode, in the structured form TRL's tool loop and OpenAI's API use.

Inside a run (what reward functions receive), an assistant turn that calls tools is

    {"role": "assistant", "content": "text outside the calls",
     "tool_calls": [{"id": "call_0_0", "type": "function", "function": {"name": "calculator",
                                                                        "arguments": {"expression": "2 + 2"}}}]}

followed by one `{"role": "tool", "name": "calculator", "tool_call_id": "call_0_0", "content": "4"}` per call:
exactly what TRL 1.16's `GRPOTrainer` builds (`parse_response` on the sampled ids, then one tool message per call),
with an `id`/`tool_call_id` pair added so the same messages are valid OpenAI chat messages (the model's own id where
its format has one: Mistral's). Arguments are a dict, as TRL passes them; `to_openai` writes them as the JSON string
OpenAI's API uses, `from_openai` reads either. A turn's reasoning, where its format keeps it apart (gpt-oss's
analysis channel), is the message's `thinking`, the key gpt-oss's chat template renders.

A turn whose tool-call markup does not parse keeps its raw text as content (TRL falls back to plain text there too),
so a measure can still see what was malformed; its well-formed calls, which ran, are listed in `tool_calls`, and the
error observation of each malformed call is a tool message without `tool_call_id`.
"""

from __future__ import annotations

import copy
import json
from typing import Any

from agentrl_ray.chat_format import ParsedTurn

Message = dict[str, Any]


def assistant_message(text: str, parsed: ParsedTurn, turn: int) -> Message:
    """The structured message of one sampled assistant turn (`parsed` is `parse_tool_calls(text)`)."""
    message: Message = {"role": "assistant", "content": text if parsed.errors else parsed.content}
    if parsed.reasoning and not parsed.errors:
        message["thinking"] = parsed.reasoning  # the key gpt-oss's chat template renders as its analysis channel
    if parsed.calls:
        message["tool_calls"] = [
            {
                "id": c.id or f"call_{turn}_{i}",  # the model's own, where it wrote one: its results name it
                "type": "function",
                "function": {"name": c.name, "arguments": c.arguments},
            }
            for i, c in enumerate(parsed.calls)
        ]
    return message


def tool_messages(assistant: Message, results: list[str]) -> list[Message]:
    """One tool message per result, answering the assistant turn's calls in order (then its parse errors)."""
    calls = assistant.get("tool_calls") or []
    out = []
    for i, text in enumerate(results):
        message: Message = {"role": "tool", "content": text}
        if i < len(calls):
            message["name"] = calls[i]["function"]["name"]
            message["tool_call_id"] = calls[i]["id"]
        out.append(message)
    return out


def to_openai(messages: list[Message]) -> list[Message]:
    """A copy whose tool-call arguments are JSON strings (OpenAI's wire form)."""
    out = copy.deepcopy(messages)
    for m in out:
        for call in m.get("tool_calls") or []:
            args = call["function"].get("arguments", {})
            if not isinstance(args, str):
                call["function"]["arguments"] = json.dumps(args)
    return out


def from_openai(messages: list[Message], where: str = "messages") -> list[Message]:
    """A copy whose tool-call arguments are dicts (TRL's form, what chat templates render); errors name `where`."""
    if not isinstance(messages, list):
        raise ValueError(f"{where}: expected a list of chat messages, got {type(messages).__name__}")
    out = copy.deepcopy(messages)
    for i, m in enumerate(out):
        if not isinstance(m, dict) or not isinstance(m.get("role"), str):
            raise ValueError(f"{where}[{i}]: a message needs a string 'role', got {m!r}")
        if m.get("content") is None:
            m["content"] = ""  # OpenAI writes null content next to tool_calls; templates want a string
        for call in m.get("tool_calls") or []:
            function = call.get("function") if isinstance(call, dict) else None
            if not isinstance(function, dict) or not isinstance(function.get("name"), str):
                raise ValueError(f"{where}[{i}].tool_calls: expected {{'function': {{'name': ..}}}}, got {call!r}")
            args = function.get("arguments", {})
            if isinstance(args, str):
                try:
                    args = json.loads(args) if args.strip() else {}
                except json.JSONDecodeError as exc:
                    raise ValueError(f"{where}[{i}]: tool call arguments are not JSON ({exc.msg})") from exc
                except (RecursionError, ValueError) as exc:  # too deep; an integer of over 4,300 digits
                    raise ValueError(f"{where}[{i}]: tool call arguments cannot be read as JSON ({exc})") from exc
            function["arguments"] = args
            call.setdefault("type", "function")
    return out
