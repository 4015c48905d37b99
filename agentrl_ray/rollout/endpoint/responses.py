"""OpenAI's Responses API (`POST /v1/responses`) on the rollout endpoint: a harness written against
`client.responses` trains unchanged.

Like the Messages dialect (`anthropic.py`), a request is translated to the chat-completions request it means and
served by `Endpoint.chat`, so a later call that repeats the conversation continues the exact ids sampled.

- `instructions` is the system message; `input` is a string (one user message) or items: messages (`role` user,
  system, developer or assistant; `content` a string or `input_text` / `output_text` parts), `function_call`
  (`call_id`, `name`, `arguments`) and `function_call_output` (`call_id`, `output`) items.
- `previous_response_id` continues a response of the same trajectory: its conversation (request and answer) comes
  first, then `input`. Responses are kept per trajectory while it runs, as `store` would keep them.
- `tools` are function tools (`name`, `description`, `parameters`), `tool_choice: none` drops them;
  `max_output_tokens`, `temperature`, `top_p` mean what they mean there; `stream: true` answers with the event
  stream (response.created ... response.completed, each item whole in one delta).
- The answer: an assistant `message` item with its `output_text` and a `function_call` item per call; `status`
  incomplete (`max_output_tokens`) when the budget cut it.
Other item and tool types (reasoning, images, files, built-in tools) are refused with an error naming them.
"""

from __future__ import annotations

import json
import time
import uuid
from typing import Any

from agentrl_ray.rollout.endpoint.anthropic import DialectError

ROLES = {"user": "user", "system": "system", "developer": "system", "assistant": "assistant"}


def chat_request(body: dict[str, Any], history: dict[str, list[dict[str, Any]]]) -> dict[str, Any]:
    """The chat-completions body a Responses body means; `history`: this trajectory's earlier responses, by id, as
    their whole conversations in chat form."""
    messages: list[dict[str, Any]] = []
    previous = body.get("previous_response_id")
    if previous:
        if previous not in history:
            raise DialectError(f"previous_response_id {previous!r}: no such response in this trajectory")
        messages += history[previous]
    elif body.get("instructions"):
        messages.append({"role": "system", "content": str(body["instructions"])})
    items = body.get("input")
    if isinstance(items, str):
        items = [{"role": "user", "content": items}]
    if not isinstance(items, list) or not items:
        raise DialectError("input: expected a string or a non-empty list of items")
    for i, item in enumerate(items):
        message = _item(item, i, messages)
        if message is not None:
            messages.append(message)
    out: dict[str, Any] = {"model": body.get("model"), "messages": messages}
    if body.get("tools") and body.get("tool_choice") != "none":
        out["tools"] = [_tool(t, i) for i, t in enumerate(body["tools"])]
    if body.get("max_output_tokens") is not None:
        out["max_tokens"] = body["max_output_tokens"]
    for key in ("temperature", "top_p"):
        if body.get(key) is not None:
            out[key] = body[key]
    return out


def _item(item: Any, i: int, messages: list[dict[str, Any]]) -> dict[str, Any] | None:
    where = f"input[{i}]"
    if not isinstance(item, dict):
        raise DialectError(f"{where}: expected an item (a mapping)")
    kind = item.get("type", "message")
    if kind == "message":
        role = ROLES.get(item.get("role"))
        if role is None:
            raise DialectError(f"{where}: role must be user, system, developer or assistant")
        return {"role": role, "content": _content(item.get("content"), where)}
    if kind == "function_call":
        call = {"id": item.get("call_id", ""), "type": "function"}
        call["function"] = {"name": item["name"], "arguments": item.get("arguments") or "{}"}
        if messages and messages[-1]["role"] == "assistant":
            messages[-1].setdefault("tool_calls", []).append(call)  # the calls of one turn join its message
            return None
        return {"role": "assistant", "content": "", "tool_calls": [call]}
    if kind == "function_call_output":
        output = item.get("output", "")
        text = output if isinstance(output, str) else _content(output, where)
        return {"role": "tool", "tool_call_id": item.get("call_id", ""), "content": text}
    raise DialectError(f"{where}: {kind!r} items are not supported (message, function_call, function_call_output)")


def _content(content: Any, where: str) -> str:
    if isinstance(content, str):
        return content
    if not isinstance(content, list):
        raise DialectError(f"{where}: content must be a string or a list of text parts")
    parts = []
    for j, part in enumerate(content):
        kind = part.get("type") if isinstance(part, dict) else type(part).__name__
        if kind not in ("input_text", "output_text", "text"):
            raise DialectError(f"{where}.content[{j}]: {kind!r} parts are not supported (input_text, output_text)")
        parts.append(part.get("text") or "")
    return "".join(parts)


def _tool(tool: Any, i: int) -> dict[str, Any]:
    if not isinstance(tool, dict) or tool.get("type", "function") != "function" or not tool.get("name"):
        kind = tool.get("type") if isinstance(tool, dict) else type(tool).__name__
        raise DialectError(f"tools[{i}]: only function tools ({{type: function, name, parameters}}), got {kind!r}")
    function = {"name": tool["name"], "description": tool.get("description") or ""}
    function["parameters"] = tool.get("parameters") or {"type": "object", "properties": {}}
    return {"type": "function", "function": function}


def response(answer: dict[str, Any], body: dict[str, Any]) -> dict[str, Any]:
    """The Responses answer for a chat-completions answer of one choice."""
    choice = answer["choices"][0]
    message = choice["message"]
    output: list[dict[str, Any]] = []
    if message.get("content") or not message.get("tool_calls"):
        text = {"type": "output_text", "text": message.get("content") or "", "annotations": [], "logprobs": []}
        output.append(
            {"type": "message", "id": _id("msg"), "role": "assistant", "status": "completed", "content": [text]}
        )
    for call in message.get("tool_calls") or []:
        arguments = call["function"].get("arguments")
        output.append(
            {
                "type": "function_call",
                "id": _id("fc"),
                "call_id": call["id"],
                "name": call["function"]["name"],
                "arguments": arguments if isinstance(arguments, str) else json.dumps(arguments),
                "status": "completed",
            }
        )
    cut = choice["finish_reason"] == "length"
    usage = answer["usage"]
    return {
        "id": _id("resp"),
        "object": "response",
        "created_at": time.time(),
        "model": answer["model"],
        "status": "incomplete" if cut else "completed",
        "incomplete_details": {"reason": "max_output_tokens"} if cut else None,
        "output": output,
        "parallel_tool_calls": True,
        "tool_choice": body.get("tool_choice") or "auto",
        "tools": body.get("tools") or [],
        "previous_response_id": body.get("previous_response_id"),
        "usage": {
            "input_tokens": usage["prompt_tokens"],
            "input_tokens_details": {"cached_tokens": 0},
            "output_tokens": usage["completion_tokens"],
            "output_tokens_details": {"reasoning_tokens": 0},
            "total_tokens": usage["total_tokens"],
        },
    }


def _id(prefix: str) -> str:
    return f"{prefix}_{uuid.uuid4().hex[:24]}"


def error_body(message: str, code: str, kind: str = "invalid_request_error") -> dict[str, Any]:
    return {"error": {"message": message, "type": kind, "param": None, "code": code}}


async def event_stream(resp: dict[str, Any]):
    """The answer as the Responses event stream: created, each output item added / its delta / done, completed."""
    seq = iter(range(1 << 30))

    def event(name: str, **data: Any) -> str:
        return f"event: {name}\ndata: {json.dumps({'type': name, 'sequence_number': next(seq), **data})}\n\n"

    head = {**resp, "status": "in_progress", "output": [], "usage": None}
    yield event("response.created", response=head)
    yield event("response.in_progress", response=head)
    for i, item in enumerate(resp["output"]):
        if item["type"] == "message":
            text = item["content"][0]
            yield event(
                "response.output_item.added", output_index=i, item={**item, "status": "in_progress", "content": []}
            )
            empty = {**text, "text": ""}
            yield event("response.content_part.added", output_index=i, item_id=item["id"], content_index=0, part=empty)
            ids = {"output_index": i, "item_id": item["id"], "content_index": 0}
            yield event("response.output_text.delta", **ids, delta=text["text"], logprobs=[])
            yield event("response.output_text.done", **ids, text=text["text"], logprobs=[])
            yield event("response.content_part.done", **ids, part=text)
        else:
            yield event(
                "response.output_item.added", output_index=i, item={**item, "status": "in_progress", "arguments": ""}
            )
            ids = {"output_index": i, "item_id": item["id"]}
            yield event("response.function_call_arguments.delta", **ids, delta=item["arguments"])
            yield event("response.function_call_arguments.done", **ids, arguments=item["arguments"], name=item["name"])
        yield event("response.output_item.done", output_index=i, item=item)
    yield event("response.incomplete" if resp["status"] == "incomplete" else "response.completed", response=resp)
