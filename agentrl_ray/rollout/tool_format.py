"""The tool-call format of the model being trained: how its turns write calls, and the tokens that follow a turn.

`rollout.tool_format` names it (as vLLM names its tool parsers); `auto` (the default) reads it off the chat template:

    hermes       Qwen2.5, SmolLM2, our built-in models: <tool_call>{"name": .., "arguments": {..}}</tool_call>
                 blocks, results in <tool_response> blocks of a user turn (`chat_format`, segments written by hand)
    llama3_json  Llama 3.1 / 3.2 / 3.3: a call is a JSON object {"name": .., "parameters": {..}}, after
                 `<|python_tag|>` or alone, several joined by ";" (what vLLM's `llama3_json` parser reads);
                 results come back as `ipython` messages
    qwen3_xml    Qwen3-Coder, Qwen3.5 and later: <tool_call><function=NAME><parameter=KEY>VALUE</parameter>..
                 </function></tool_call> (vLLM's `qwen3_coder` / `qwen3_xml`)
    openai       gpt-oss (harmony): a message to `functions.NAME` on the commentary channel, ended by <|call|>,
                 which stops the turn; results come back as `functions.NAME to=assistant` messages (`harmony.py`)
    mistral      Mistral before its v11 tokenizers: [TOOL_CALLS] and a JSON array of calls, each with its id;
                 results in [TOOL_RESULTS] blocks that name it (`mistral.py`, segments written by hand after
                 mistral_common, Mistral's reference renderer)

For llama3_json, qwen3_xml and openai the segments after a turn are cut from the template's own rendering, never
written by hand (`template_framing.py`): the trajectory holds, character for character, what the model sees under
its own template. A malformed call never raises: it becomes an entry of `ParsedTurn.errors`, as in `chat_format`.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Protocol

from agentrl_ray.chat_format import (
    TOOL_CALL_OPEN,
    ParsedTurn,
    Segment,
    ToolCall,
    _snip,
    call_from_json,
    observation_segments,
    parse_tool_calls,
    tool_response_segments,
    user_turn_segments,
)
from agentrl_ray.rollout import harmony, mistral
from agentrl_ray.rollout.template_framing import TemplateFraming

FORMATS = ("hermes", "llama3_json", "qwen3_xml", "openai", "mistral")
PYTHON_TAG = "<|python_tag|>"


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
        call, error = call_from_json(obj, ("parameters", "arguments"))
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


# ---------------------------------------------------------------- the format


class Framing(Protocol):
    """What follows a turn: cut from the template (`TemplateFraming`), or written after mistral_common's encoder
    (`mistral.MistralFraming`)."""

    user_turns: str  # why a user message cannot follow a turn; "" where it can

    def segments(self, messages: list[dict[str, Any]]) -> list[Segment]: ...


@dataclass(frozen=True)
class ToolFormat:
    """One family's tool calls: `parse` reads a sampled turn; the segments methods give what follows it."""

    name: str
    parse: Callable[[str], ParsedTurn]
    framing: Framing | None = None  # None: hermes, segments written by hand (chat_format)
    ends: tuple[str, ...] = ()  # the tokens besides eos that end a turn (gpt-oss's <|call|> and <|return|>)

    def stop_token_ids(self, tokenizer) -> list[int]:
        """The ids the engine stops a turn at: the eos token's, and each of `ends`'s."""
        ids = [tokenizer.eos_token_id]
        for token in self.ends:
            piece = tokenizer.encode(token, add_special_tokens=False)
            if len(piece) != 1:
                raise ValueError(f"rollout.tool_format={self.name}: {token} is not one token of this tokenizer")
            ids += piece
        return list(dict.fromkeys(ids))

    def tool_response_segments(self, results: list[str], calls: list[dict[str, Any]] | None = None) -> list[Segment]:
        """The results of a turn's calls (`calls`: its assistant message's `tool_calls`, in order; a result past
        them answers a malformed call)."""
        if self.framing is None:
            return tool_response_segments(results)
        calls = calls or []
        messages = []
        for i, text in enumerate(results):
            message = {"role": "tool", "name": "error", "content": text}
            if i < len(calls):
                message.update(name=calls[i]["function"]["name"], tool_call_id=calls[i]["id"])
            messages.append(message)
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
_PARSERS = {
    "hermes": parse_tool_calls,
    "llama3_json": parse_llama3_json,
    "qwen3_xml": parse_qwen3_xml,
    "openai": harmony.parse_harmony,
    "mistral": mistral.parse_mistral,
}


def detect(chat_template: str | None) -> str:
    """The format a chat template renders calls in; hermes when it names none of the others'."""
    template = chat_template or ""
    if "<function=" in template and "<parameter=" in template:
        return "qwen3_xml"
    if TOOL_CALL_OPEN in template:
        return "hermes"
    if '"parameters": ' in template and "<|eot_id|>" in template:
        return "llama3_json"
    if harmony.CHANNEL in template and harmony.FUNCTIONS in template:
        return "openai"
    if mistral.TOOL_CALLS in template:
        return "mistral"
    return "hermes"


def tool_format(tokenizer, name: str = "auto") -> ToolFormat:
    """The format `rollout.tool_format` names for this model (`auto`: read off its chat template)."""
    if name == "auto":
        name = detect(getattr(tokenizer, "chat_template", None))
    if name not in _PARSERS:
        raise ValueError(f"rollout.tool_format={name!r}: expected auto or one of {', '.join(FORMATS)}")
    if name == "hermes":
        return HERMES
    if name == "mistral":
        return ToolFormat(name, mistral.parse_mistral, mistral.MistralFraming(tokenizer))
    ends = harmony.TURN_ENDS if name == "openai" else ()
    fmt = ToolFormat(name, _PARSERS[name], TemplateFraming(tokenizer, ends), ends)
    fmt.stop_token_ids(tokenizer)  # each end one token, or the reason now
    return fmt
