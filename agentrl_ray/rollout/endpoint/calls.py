"""Tokens in: what a chat-completions request becomes in token ids, and the record of every call of a trajectory.

A trajectory's first call is rendered with the model's chat template (`apply_chat_template`, tools included), as the
built-in agent loop renders a dataset prompt. A later call whose messages start with an earlier call's messages plus
the reply this endpoint gave it (same roles, contents and tool calls; the tool-call ids the client echoes do not
matter), under the same tools, continues that call's exact ids: earlier prompt + the sampled completion, then only
the new messages (tool results, user turns) encoded and appended. The sampled text is never rendered and tokenized
again, so the ids the engine conditions on are the ids it sampled, and the learner trains on those.

The appended part comes from the template too: the conversation rendered with and without the new messages, and the
difference after the end-of-turn token that closed the sampled reply. Where that text is what
`chat_format.tool_response_segments` / `user_turn_segments` write (the hermes format of our models), those segments
give the ids and roles, exactly as the built-in loop appends tool results; otherwise each new message's content is
an environment segment and the text between contents template. Anything else (a reply cut by its budget or a stop
string, a rewritten history, other tools) is a fresh render: the start of a new training sequence (`stitch.py`).
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

from agentrl_ray.chat_format import Segment, encode_segments, tool_response_segments, user_turn_segments
from agentrl_ray.messages import from_openai
from agentrl_ray.types import TokenRole

Message = dict[str, Any]


@dataclass
class Choice:
    """One sampled completion of a call, as the engine returned it and as the endpoint answered it."""

    token_ids: list[int]
    logprobs: list[float]
    finish_reason: str  # OpenAI's: "stop", "length" or "tool_calls"
    message: Message  # the reply's message in TRL form (tool-call arguments as dicts)
    ended_turn: bool  # the last id is the end-of-turn token: a later call can continue these ids
    stop: str | None = None  # the stop string that cut the completion, if one did


@dataclass
class Call:
    """One chat-completions call of a trajectory: its prompt in ids with a role and a log-prob per id (tokens this
    call continued from earlier calls keep theirs), and its choices."""

    index: int
    messages: list[Message]  # the request's messages, TRL form
    tools_key: str  # the request's tools, canonical JSON (a continuation needs the same tools)
    prompt_ids: list[int]
    prompt_roles: list[TokenRole]
    prompt_logprobs: list[float]
    policy_version: int
    choices: list[Choice] = field(default_factory=list)
    continues: tuple[int, int] | None = None  # (call index, choice index) whose ids this prompt extends


def canonical(messages: list[Message]) -> list[tuple]:
    """What must match for a conversation to continue: roles, contents and tool calls (not their ids)."""
    out = []
    for m in messages:
        calls = [
            (c["function"]["name"], _arguments(c["function"].get("arguments", {}))) for c in m.get("tool_calls") or []
        ]
        out.append((m["role"], (m.get("content") or "").strip(), tuple(calls)))
    return out


def _arguments(args: Any) -> str:
    if isinstance(args, str):
        try:
            args = json.loads(args)
        except (ValueError, RecursionError):  # JSONDecodeError is a ValueError
            return args
    return json.dumps(args, sort_keys=True)


class Renderer:
    """A request's prompt ids for one trajectory, continuing the ids of its earlier calls where it can."""

    def __init__(self, tokenizer) -> None:
        self.tokenizer = tokenizer
        self.eos = tokenizer.eos_token

    def render(self, raw_messages: list[Message], tools: list | None, calls: list[Call]) -> Call:
        messages = from_openai(raw_messages)
        tools = tools or None
        tools_key = json.dumps(tools, sort_keys=True)
        index = len(calls)
        parent = _find_parent(messages, tools_key, calls)
        if parent is not None:
            call, choice_index = parent
            continued = self._continue(messages, tools, call, choice_index)
            if continued is not None:
                ids, roles, logprobs = continued
                return Call(index, messages, tools_key, ids, roles, logprobs, 0, continues=(call.index, choice_index))
        ids = self.tokenizer.apply_chat_template(
            messages, tools=tools, add_generation_prompt=True, tokenize=True, return_dict=False
        )
        ids = list(ids)
        return Call(index, messages, tools_key, ids, [TokenRole.PROMPT] * len(ids), [0.0] * len(ids), 0)

    def _continue(self, messages: list[Message], tools, call: Call, choice_index: int):
        choice = call.choices[choice_index]
        n = len(call.messages) + 1
        head = self._text(messages[:n], tools, generation_prompt=False)
        full = self._text(messages, tools, generation_prompt=True)
        cut = head.rfind(self.eos)
        if cut < 0 or not full.startswith(head[: cut + len(self.eos)]):
            return None
        tail = full[cut + len(self.eos) :]
        ids, roles = encode_segments(self.tokenizer, _segments(tail, messages[n:]))
        prompt_ids = call.prompt_ids + choice.token_ids + ids
        prompt_roles = call.prompt_roles + [TokenRole.ACTION] * len(choice.token_ids) + roles
        prompt_logprobs = call.prompt_logprobs + choice.logprobs + [0.0] * len(ids)
        return prompt_ids, prompt_roles, prompt_logprobs

    def _text(self, messages: list[Message], tools, generation_prompt: bool) -> str:
        return self.tokenizer.apply_chat_template(
            messages, tools=tools, add_generation_prompt=generation_prompt, tokenize=False
        )


def _find_parent(messages: list[Message], tools_key: str, calls: list[Call]) -> tuple[Call, int] | None:
    """The latest (call, choice) whose messages plus reply start `messages`, with more after them."""
    want = canonical(messages)
    for call in reversed(calls):
        n = len(call.messages)
        if call.tools_key != tools_key or len(want) <= n + 1 or want[:n] != canonical(call.messages):
            continue
        for i, choice in enumerate(call.choices):
            if choice.ended_turn and want[n] == canonical([choice.message])[0]:
                return call, i
    return None


def _segments(tail: str, new_messages: list[Message]) -> list[Segment]:
    """The roles of the text appended after a sampled reply: our chat format's segments where they spell it, else
    each new message's content as environment text and the rest as template."""
    ours: list[Segment] = []
    i = 0
    while i < len(new_messages):
        if new_messages[i]["role"] == "tool":
            j = i
            while j < len(new_messages) and new_messages[j]["role"] == "tool":
                j += 1
            ours += tool_response_segments([m.get("content") or "" for m in new_messages[i:j]])
            i = j
        elif new_messages[i]["role"] == "user":
            ours += user_turn_segments(new_messages[i].get("content") or "")
            i += 1
        else:
            break
    if i == len(new_messages) and _joined(ours) == tail:
        return ours
    segments: list[Segment] = []
    pos = 0
    for m in new_messages:
        content = m.get("content") or ""
        at = tail.find(content, pos) if isinstance(content, str) and content else -1
        if at < 0:
            continue
        segments += [(tail[pos:at], TokenRole.TEMPLATE), (content, TokenRole.ENV)]
        pos = at + len(content)
    segments.append((tail[pos:], TokenRole.TEMPLATE))
    return [s for s in segments if s[0]]


def _joined(segments: list[Segment]) -> str:
    return "".join(text for text, _ in segments)
