"""Anthropic's Messages API (`POST /v1/messages`) on the rollout endpoint: a harness written against the `anthropic`
client trains unchanged.

A request is translated to the chat-completions request it means and served by the same `Endpoint.chat`, so the
token-in/token-out guarantees are the same: the first call is rendered by the chat template, a later one that
repeats the conversation so far continues the exact ids sampled, and each call is recorded for `stitch.py`.

- `system` (a string or text blocks) is the system message; a user turn's `tool_result` blocks are tool messages
  (in order, before the turn's text), its text blocks the user message; an assistant turn's `tool_use` blocks are
  its tool calls (`input` as the arguments), its text blocks its content.
- `tools` (`name`, `description`, `input_schema`) are OpenAI function tools; `tool_choice: {type: none}` drops them.
- `max_tokens`, `temperature`, `top_p` and `stop_sequences` mean what they mean there; `stream: true` answers with
  the Messages event stream (message_start, a content block each, message_delta, message_stop).
- The answer: text and `tool_use` blocks, `stop_reason` end_turn / tool_use / max_tokens / stop_sequence, usage.
- The key: `x-api-key` (what the `anthropic` client sends) or a Bearer token, as for chat completions.
Images, documents, thinking blocks and server tools are refused with an invalid_request_error naming them.
"""

from __future__ import annotations

import json
import uuid
from typing import Any

STOP_REASONS = {"stop": "end_turn", "tool_calls": "tool_use", "length": "max_tokens"}


class DialectError(ValueError):
    """A request this dialect cannot express as chat completions: a 400 invalid_request_error."""


def chat_request(body: dict[str, Any]) -> dict[str, Any]:
    """The chat-completions body an Anthropic Messages body means."""
    if not isinstance(body.get("messages"), list) or not body["messages"]:
        raise DialectError("messages: expected a non-empty list")
    if not isinstance(body.get("max_tokens"), int) or body["max_tokens"] < 1:
        raise DialectError("max_tokens: required, a positive integer")
    messages: list[dict[str, Any]] = []
    system = body.get("system")
    if system:
        messages.append({"role": "system", "content": _text(system, "system")})
    for i, m in enumerate(body["messages"]):
        if not isinstance(m, dict) or m.get("role") not in ("user", "assistant"):
            raise DialectError(f"messages[{i}]: role must be user or assistant")
        messages += _user(m["content"], i) if m["role"] == "user" else [_assistant(m["content"], i)]
    out: dict[str, Any] = {"model": body.get("model"), "messages": messages, "max_tokens": body["max_tokens"]}
    choice = body.get("tool_choice") or {}
    if body.get("tools") and choice.get("type") != "none":
        out["tools"] = [_tool(t, i) for i, t in enumerate(body["tools"])]
    for key in ("temperature", "top_p"):
        if body.get(key) is not None:
            out[key] = body[key]
    if body.get("stop_sequences"):
        out["stop"] = list(body["stop_sequences"])
    return out


def _blocks(content: Any, where: str) -> list[dict[str, Any]]:
    if isinstance(content, str):
        return [{"type": "text", "text": content}]
    if not isinstance(content, list):
        raise DialectError(f"{where}: content must be a string or a list of blocks")
    for j, b in enumerate(content):
        if not isinstance(b, dict) or b.get("type") not in ("text", "tool_use", "tool_result"):
            kind = b.get("type") if isinstance(b, dict) else type(b).__name__
            raise DialectError(f"{where}.content[{j}]: {kind!r} blocks are not supported (text, tool_use, tool_result)")
    return content


def _text(content: Any, where: str) -> str:
    parts = []
    for b in _blocks(content, where):
        if b["type"] != "text":
            raise DialectError(f"{where}: only text here, got a {b['type']} block")
        parts.append(b.get("text") or "")
    return "".join(parts)


def _user(content: Any, i: int) -> list[dict[str, Any]]:
    blocks = _blocks(content, f"messages[{i}]")
    out = []
    for b in blocks:
        if b["type"] == "tool_result":
            result = b.get("content", "")
            text = result if isinstance(result, str) else _text(result, f"messages[{i}] tool_result")
            out.append({"role": "tool", "tool_call_id": b.get("tool_use_id", ""), "content": text})
        elif b["type"] == "tool_use":
            raise DialectError(f"messages[{i}]: tool_use blocks belong to assistant turns")
    texts = [b.get("text") or "" for b in blocks if b["type"] == "text"]
    if texts:
        out.append({"role": "user", "content": "".join(texts)})
    return out


def _assistant(content: Any, i: int) -> dict[str, Any]:
    blocks = _blocks(content, f"messages[{i}]")
    message: dict[str, Any] = {
        "role": "assistant",
        "content": "".join(b.get("text") or "" for b in blocks if b["type"] == "text"),
    }
    calls = [
        {
            "id": b.get("id") or f"toolu_{k}",
            "type": "function",
            "function": {"name": b["name"], "arguments": json.dumps(b.get("input") or {})},
        }
        for k, b in enumerate(blocks)
        if b["type"] == "tool_use"
    ]
    if any(b["type"] == "tool_result" for b in blocks):
        raise DialectError(f"messages[{i}]: tool_result blocks belong to user turns")
    if calls:
        message["tool_calls"] = calls
    return message


def _tool(tool: Any, i: int) -> dict[str, Any]:
    if not isinstance(tool, dict) or not tool.get("name") or "input_schema" not in tool:
        raise DialectError(f"tools[{i}]: a client tool is {{name, description, input_schema}}")
    function = {"name": tool["name"], "description": tool.get("description", ""), "parameters": tool["input_schema"]}
    return {"type": "function", "function": function}


def messages_answer(answer: dict[str, Any], stop_sequence: str | None) -> dict[str, Any]:
    """The Anthropic Messages answer for a chat-completions answer of one choice (`stop_sequence`: the stop string
    that cut it, if one did)."""
    choice = answer["choices"][0]
    message = choice["message"]
    content: list[dict[str, Any]] = []
    if message.get("content"):
        content.append({"type": "text", "text": message["content"]})
    for call in message.get("tool_calls") or []:
        arguments = call["function"].get("arguments") or "{}"
        try:
            parsed = json.loads(arguments) if isinstance(arguments, str) else arguments
        except ValueError:
            parsed = {}
        content.append({"type": "tool_use", "id": call["id"], "name": call["function"]["name"], "input": parsed})
    reason = "stop_sequence" if stop_sequence else STOP_REASONS.get(choice["finish_reason"], "end_turn")
    usage = answer["usage"]
    return {
        "id": f"msg_{uuid.uuid4().hex[:24]}",
        "type": "message",
        "role": "assistant",
        "model": answer["model"],
        "content": content,
        "stop_reason": reason,
        "stop_sequence": stop_sequence,
        "usage": {"input_tokens": usage["prompt_tokens"], "output_tokens": usage["completion_tokens"]},
    }


def error_body(kind: str, message: str) -> dict[str, Any]:
    return {"type": "error", "error": {"type": kind, "message": message}}


async def event_stream(message: dict[str, Any]):
    """The answer as the Messages event stream: each block whole in one delta."""

    def event(name: str, data: dict[str, Any]) -> str:
        return f"event: {name}\ndata: {json.dumps({'type': name, **data})}\n\n"

    head = {**message, "content": [], "stop_reason": None, "stop_sequence": None}
    head["usage"] = {"input_tokens": message["usage"]["input_tokens"], "output_tokens": 0}
    yield event("message_start", {"message": head})
    for i, block in enumerate(message["content"]):
        if block["type"] == "text":
            yield event("content_block_start", {"index": i, "content_block": {"type": "text", "text": ""}})
            yield event("content_block_delta", {"index": i, "delta": {"type": "text_delta", "text": block["text"]}})
        else:
            start = {**block, "input": {}}
            yield event("content_block_start", {"index": i, "content_block": start})
            partial = json.dumps(block["input"])
            yield event(
                "content_block_delta", {"index": i, "delta": {"type": "input_json_delta", "partial_json": partial}}
            )
        yield event("content_block_stop", {"index": i})
    delta = {"stop_reason": message["stop_reason"], "stop_sequence": message["stop_sequence"]}
    yield event("message_delta", {"delta": delta, "usage": {"output_tokens": message["usage"]["output_tokens"]}})
    yield event("message_stop", {})
