"""The tool-call format of the model being trained: how its turns write calls, and the tokens that follow a turn.

`rollout.tool_format` names it; `auto` (the default) reads it off the model's chat template:

    hermes       Qwen2.5, SmolLM2, our built-in models: <tool_call>{"name": .., "arguments": {..}}</tool_call>
                 blocks, results in <tool_response> blocks of a user turn (`chat_format`, segments written by hand)
    llama3_json  Llama 3.1 / 3.2 / 3.3: a call is a JSON object {"name": .., "parameters": {..}}, after
                 `<|python_tag|>` or alone, several joined by ";" (what vLLM's `llama3_json` parser reads);
                 results come back as `ipython` messages
    qwen3_xml    Qwen3-Coder, Qwen3.5 and later: <tool_call><function=NAME><parameter=KEY>VALUE</parameter>..
                 </function></tool_call> (vLLM's `qwen3_coder` / `qwen3_xml`)

For every format but hermes, the segments after a turn are cut from the template's own rendering, never written
by hand (`TemplateFraming`): what `apply_chat_template` renders after the assistant's end-of-turn token once the
environment's messages follow it, each message's content put in by the template itself (Llama's quotes a tool
result as a JSON string; its user turns are trimmed). Those pieces are template tokens, what the template made of
each content is environment tokens, and the joined text is checked against the template's rendering of the real
messages: the trajectory holds, character for character, what the model sees under its own template.

A malformed call never raises: it becomes an entry of `ParsedTurn.errors`, as in `chat_format`.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from agentrl_ray.chat_format import (
    TOOL_CALL_OPEN,
    ParsedTurn,
    Segment,
    ToolCall,
    observation_segments,
    parse_tool_calls,
    tool_response_segments,
    user_turn_segments,
)
from agentrl_ray.types import TokenRole

FORMATS = ("hermes", "llama3_json", "qwen3_xml")
PYTHON_TAG = "<|python_tag|>"
_SNIPPET = 80


def _snip(s: str) -> str:
    s = s.strip()
    return s if len(s) <= _SNIPPET else s[:_SNIPPET] + "..."


# ---------------------------------------------------------------- parsers


_LLAMA_CALL = re.compile(r'\{\s*"name"\s*:')


def parse_llama3_json(text: str) -> ParsedTurn:
    """Llama 3.x calls: JSON objects that open with a "name" key, "parameters" (or "arguments") beside it, one after
    another separated by ";" or white space; any text before the first is the turn's content. A turn without such
    an object is a final answer."""
    turn = ParsedTurn()
    body = text.replace(PYTHON_TAG, "")
    first = _LLAMA_CALL.search(body)
    if first is None:
        turn.content = body.strip()
        return turn
    turn.content = body[: first.start()].strip()
    decoder, pos = json.JSONDecoder(), first.start()
    while pos < len(body):
        try:
            obj, pos = decoder.raw_decode(body, pos)
        except json.JSONDecodeError as e:
            turn.errors.append(f"tool call is not valid JSON ({e.msg} at char {e.pos - pos}): {_snip(body[pos:])}")
            break
        except (RecursionError, ValueError) as e:  # "[[[[.." thousands deep; an int of over 4,300 digits
            turn.errors.append(f"tool call JSON cannot be read ({type(e).__name__}): {_snip(body[pos:])}")
            break
        call, error = _llama_call(obj)
        if call is not None:
            turn.calls.append(call)
        else:
            turn.errors.append(error)
        while pos < len(body) and (body[pos].isspace() or body[pos] == ";"):
            pos += 1
        if pos < len(body) and not _LLAMA_CALL.match(body, pos):
            turn.errors.append(f"text after a tool call (a call must end the turn): {_snip(body[pos:])}")
            break
    return turn


def _llama_call(obj: Any) -> tuple[ToolCall | None, str]:
    name = obj.get("name") if isinstance(obj, dict) else None
    if not isinstance(name, str) or not name.strip():
        return None, f'tool call has no "name" string: {_snip(json.dumps(obj))}'
    arguments = obj.get("parameters", obj.get("arguments", {}))
    if isinstance(arguments, str):  # OpenAI's spelling: a JSON-encoded object
        try:
            arguments = json.loads(arguments) if arguments.strip() else {}
        except (ValueError, RecursionError):
            return None, f'tool call to {name!r}: "parameters" is a string that is not a JSON object'
    if not isinstance(arguments, dict):
        return None, f'tool call to {name!r}: "parameters" must be a JSON object, got {type(arguments).__name__}'
    return ToolCall(name=name.strip(), arguments=arguments), ""


_FUNCTION_OPEN, _FUNCTION_CLOSE = "<function=", "</function>"
_PARAMETER_OPEN, _PARAMETER_CLOSE = "<parameter=", "</parameter>"


def parse_qwen3_xml(text: str) -> ParsedTurn:
    """Qwen3-Coder calls: `<tool_call>` blocks (found by `chat_format.parse_tool_calls`), each holding one
    `<function=NAME>` of `<parameter=KEY>` values. A value is the template's raw text: a JSON object or array is
    read as one, anything else stays a string, which the env host types by the tool's signature ("3" -> 3)."""
    return parse_tool_calls(text, _xml_call)


def _xml_call(body: str) -> tuple[ToolCall | None, str]:
    body = body.strip()
    name_end = body.find(">")
    name = body[len(_FUNCTION_OPEN) : name_end].strip() if name_end >= 0 else ""
    if not (body.startswith(_FUNCTION_OPEN) and body.endswith(_FUNCTION_CLOSE)) or not name or "\n" in name:
        return None, f"tool call must be one <function=NAME>...</function> block: {_snip(body)}"
    arguments, outside = _xml_parameters(body[name_end + 1 : -len(_FUNCTION_CLOSE)])
    if outside:
        return None, f"tool call to {name!r}: text outside its <parameter=...> blocks: {_snip(outside)}"
    return ToolCall(name=name, arguments=arguments), ""


def _xml_parameters(inner: str) -> tuple[dict[str, Any], str]:
    """The `<parameter=KEY>VALUE</parameter>` blocks of a function (one newline each side of a value is the
    template's), and the text outside them. Each search starts where the last ended: linear in the text."""
    arguments: dict[str, Any] = {}
    outside, pos = [], 0
    while (start := inner.find(_PARAMETER_OPEN, pos)) >= 0:
        outside.append(inner[pos:start])
        key_end = inner.find(">", start)
        close = inner.find(_PARAMETER_CLOSE, key_end) if key_end >= 0 else -1
        key = inner[start + len(_PARAMETER_OPEN) : key_end].strip()
        if close < 0 or not key or "\n" in key:
            outside.append(inner[start:])
            pos = len(inner)
            break
        value = inner[key_end + 1 : close].removeprefix("\n").removesuffix("\n")
        arguments[key] = _xml_value(value)
        pos = close + len(_PARAMETER_CLOSE)
    outside.append(inner[pos:])
    return arguments, "".join(outside).strip()


def _xml_value(value: str) -> Any:
    if value[:1] in "[{":
        try:
            parsed = json.loads(value)
        except (ValueError, RecursionError):
            return value
        return parsed if isinstance(parsed, list | dict) else value
    return value


# ---------------------------------------------------------------- segments cut from the template

_PLACEHOLDER = "agentrlcontent{}"  # letters and digits: a template that quotes or trims a content keeps it whole


class TemplateFraming:
    """The segments that follow an assistant turn, cut from `tokenizer`'s chat template (see the module docstring).
    Raises ValueError at construction when the template cannot be cut so: it never ends a turn with the eos token,
    renders a turn differently once tool results follow it, or leaves a message's content out.

    Renders are cached: the turn before the segments, each message layout, each role's surroundings of a content.
    Where the template puts a content in as it is (tried on a hostile probe), a turn costs no render; else (Llama
    quotes a tool result as JSON) one render per message and one to check the whole."""

    def __init__(self, tokenizer) -> None:
        if not getattr(tokenizer, "chat_template", None):
            raise ValueError("the tokenizer has no chat template to read the tool-result framing from")
        if not tokenizer.eos_token:
            raise ValueError("the tokenizer has no eos token: an assistant turn could never end")
        self.tokenizer = tokenizer
        self.eos = tokenizer.eos_token
        self._before: dict[bool, tuple[list[dict], int, str]] = {}
        self._layouts: dict[tuple, list[str]] = {}
        self._around: dict[tuple, tuple[str, str]] = {}
        self.verbatim: dict[str, bool] = {}
        self.user_turns = ""  # why user messages cannot follow a turn, if they cannot
        for role in ("tool", "user"):
            message = {"role": role, "name": "f", "content": _PROBE} if role == "tool" else {"role": role}
            try:
                self.verbatim[role] = self._content({**message, "content": _PROBE}) == _PROBE
                self.segments([{**message, "content": _PROBE}])
            except ValueError as e:
                if role == "tool":
                    raise
                # Qwen3's drops an earlier turn's empty reasoning block once a user message follows it.
                self.user_turns = str(e)

    def _render(self, messages: list[dict], generation: bool) -> str:
        return self.tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=generation)

    def _after_turn(self, calls: bool, messages: list[dict]) -> str:
        if calls not in self._before:
            context = _context(calls)
            before = self._render(context, False)
            end = before.rfind(self.eos)
            if end < 0:
                raise ValueError(f"the chat template does not end an assistant turn with the eos token {self.eos!r}")
            self._before[calls] = (context, end + len(self.eos), before)
        context, end, before = self._before[calls]
        full = self._render(context + messages, True)
        if full[:end] != before[:end]:
            raise ValueError(
                "the chat template renders an assistant turn differently once messages follow it: the tokens "
                "sampled for the turn would not be what the template shows (give the model a template that "
                "renders earlier turns unchanged, as TRL's *_training.jinja do, or set rollout.tool_format=hermes)"
            )
        return full[end:]

    def segments(self, messages: list[dict]) -> list[Segment]:
        """The segments of `messages` (tool results, then perhaps a user message) after the turn."""
        if self.user_turns and any(m["role"] == "user" for m in messages):
            raise ValueError(f"a user message after a turn: {self.user_turns}")
        calls = any(m["role"] == "tool" for m in messages)
        key = (calls, *((m["role"], m.get("name")) for m in messages))
        if key not in self._layouts:
            marked = [{**m, "content": _PLACEHOLDER.format(i)} for i, m in enumerate(messages)]
            rest, pieces = self._after_turn(calls, marked), []
            for i, m in enumerate(messages):
                piece, found, rest = rest.partition(_PLACEHOLDER.format(i))
                if not found:
                    raise ValueError(f"the chat template leaves out the content of a {m['role']} message")
                pieces.append(piece)
            self._layouts[key] = [*pieces, rest]
        pieces = self._layouts[key]
        segments: list[Segment] = []
        for piece, message in zip(pieces, messages):
            if piece:
                segments.append((piece, TokenRole.TEMPLATE))
            text = message["content"] if self.verbatim.get(message["role"]) else self._content(message)
            if text:
                segments.append((text, TokenRole.ENV))
        if pieces[-1]:
            segments.append((pieces[-1], TokenRole.TEMPLATE))
        if not all(self.verbatim.get(m["role"]) for m in messages):
            real = self._after_turn(calls, messages)
            if "".join(text for text, _ in segments) != real:
                raise ValueError(f"the chat template renders these messages unlike their parts: {real!r}")
        return segments

    def _content(self, message: dict) -> str:
        """What the template makes of one message's content (its placeholder's surroundings cut off)."""
        calls, key = message["role"] == "tool", (message["role"], message.get("name"))
        if key not in self._around:
            marked = self._after_turn(calls, [{**message, "content": _PLACEHOLDER.format(0)}])
            head, found, tail = marked.partition(_PLACEHOLDER.format(0))
            if not found:
                raise ValueError(f"the chat template leaves out the content of a {message['role']} message")
            self._around[key] = (head, tail)
        head, tail = self._around[key]
        real = self._after_turn(calls, [message])
        if not (real.startswith(head) and real.endswith(tail) and len(real) >= len(head) + len(tail)):
            raise ValueError(f"the chat template renders a {message['role']} message's content unlike its others")
        return real[len(head) : len(real) - len(tail)]


_PROBE = ' a "quoted" <tag> & \\ {braces}\n\tüñí '  # what a template may quote, escape or trim


def _context(calls: bool) -> list[dict]:
    """The conversation up to the assistant turn the segments follow: one call (`calls`), or a plain answer."""
    if not calls:
        return [{"role": "user", "content": "q"}, {"role": "assistant", "content": "a"}]
    call = {"type": "function", "function": {"name": "f", "arguments": {}}}
    return [{"role": "user", "content": "q"}, {"role": "assistant", "content": "", "tool_calls": [call]}]


# ---------------------------------------------------------------- the format


@dataclass(frozen=True)
class ToolFormat:
    """One family's tool calls: `parse` reads a sampled turn; the segments methods give what follows it."""

    name: str
    parse: Callable[[str], ParsedTurn]
    framing: TemplateFraming | None = None  # None: hermes, segments written by hand (chat_format)

    def tool_response_segments(self, results: list[str], names: list[str] | None = None) -> list[Segment]:
        """The results of a turn's calls (`names`: the calls', in order; a result past them answers a malformed
        call)."""
        if self.framing is None:
            return tool_response_segments(results)
        names = names or []
        messages = [
            {"role": "tool", "name": names[i] if i < len(names) else "error", "content": text}
            for i, text in enumerate(results)
        ]
        return self.framing.segments(messages)

    def user_turn_segments(self, text: str) -> list[Segment]:
        if self.framing is None:
            return user_turn_segments(text)
        return self.framing.segments([{"role": "user", "content": text}])

    def observation_segments(self, messages: list[dict[str, str]]) -> list[Segment]:
        if self.framing is None:
            return observation_segments(messages)
        tools = [m for m in messages if m["role"] == "tool"]
        users = [m for m in messages if m["role"] == "user"][-1:]
        return self.framing.segments(tools + users)


HERMES = ToolFormat("hermes", parse_tool_calls)
_PARSERS = {"hermes": parse_tool_calls, "llama3_json": parse_llama3_json, "qwen3_xml": parse_qwen3_xml}


def detect(chat_template: str | None) -> str:
    """The format a chat template renders calls in; hermes when it names none of the others'."""
    template = chat_template or ""
    if "<function=" in template and "<parameter=" in template:
        return "qwen3_xml"
    if TOOL_CALL_OPEN in template:
        return "hermes"
    if '"parameters": ' in template and "<|eot_id|>" in template:
        return "llama3_json"
    return "hermes"


def tool_format(tokenizer, name: str = "auto") -> ToolFormat:
    """The format `rollout.tool_format` names for this model (`auto`: read off its chat template)."""
    if name == "auto":
        name = detect(getattr(tokenizer, "chat_template", None))
    if name not in _PARSERS:
        raise ValueError(f"rollout.tool_format={name!r}: expected auto or one of {', '.join(FORMATS)}")
    if name == "hermes":
        return HERMES
    return ToolFormat(name, _PARSERS[name], TemplateFraming(tokenizer))
