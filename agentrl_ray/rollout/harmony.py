"""gpt-oss's tool calls (`rollout.tool_format=openai`, OpenAI's harmony format: https://github.com/openai/harmony).

The generation prompt opens an assistant message (`<|start|>assistant`); a turn is one or more messages, each a
header, `<|message|>`, a body and the token that ends it:

    <|channel|>analysis<|message|>I should compute it.<|end|>
    <|start|>assistant<|channel|>commentary to=functions.calculator <|constrain|>json<|message|>{"x": 1}<|call|>

A message to `functions.NAME` calls NAME with its body, a JSON object, as arguments. The recipient may stand after
the channel (as openai_harmony renders a call and the model writes it) or after the role (` to=functions.NAME
<|channel|>commentary json`, as gpt-oss's chat template renders one). `<|call|>` ends a call and the turn (it is a
stop token, as `<|return|>` is after a final answer), so a call is a turn's last message, and a turn calls one
function. The `analysis` channel is reasoning (`ParsedTurn.reasoning`); `final`, and `commentary` without a
recipient (a preamble to the user), are the content: what vLLM's `openai` parser (harmony) reads too. A turn with no
`<|message|>` at all is plain content, as vLLM recovers it.

The results come back as `functions.NAME to=assistant` messages on the commentary channel, framed by the template
(`template_framing.py`). It writes a tool result as a JSON string where openai_harmony writes it as it is; the
template is what renders the prompts, so the results follow it too.
"""

from __future__ import annotations

import json
import re

from agentrl_ray.chat_format import ParsedTurn, ToolCall, _snip

START, MESSAGE, CHANNEL, CONSTRAIN = "<|start|>", "<|message|>", "<|channel|>", "<|constrain|>"
END, CALL, RETURN = "<|end|>", "<|call|>", "<|return|>"
TURN_ENDS = (CALL, RETURN)  # what stops a turn (openai_harmony's stop tokens for assistant actions)
FUNCTIONS = "functions."
_RECIPIENT = re.compile(r"(?:^|\s)to=([^\s<]+)")  # up to a space or a special token (<|constrain|>)
_WORD = re.compile(r"\s*([^\s<]*)")


def parse_harmony(text: str) -> ParsedTurn:
    """The reasoning, content and call of one sampled gpt-oss turn (see the module docstring). Linear in the text:
    it is split at each `<|start|>` once, and each message is read within its own piece."""
    turn = ParsedTurn()
    if MESSAGE not in text:
        turn.content = text.strip()
        return turn
    reasoning, content = [], []
    pieces = text.split(START)
    for i, piece in enumerate(pieces):
        if not piece.strip():
            continue
        if i > 0:
            if not piece.startswith("assistant"):
                turn.errors.append(f"a message from {_snip(piece)}: a turn writes assistant messages only")
                break
            piece = piece[len("assistant") :]
        header, found, rest = piece.partition(MESSAGE)
        if not found:
            if piece.strip():
                turn.errors.append(f"a message without {MESSAGE}: {_snip(piece)}")
            continue
        ends = [(rest.find(token), token) for token in (END, CALL, RETURN) if token in rest]
        cut, token = min(ends) if ends else (len(rest), "")
        body, after = rest[:cut], rest[cut + len(token) :]
        if after.strip():
            turn.errors.append(f"text after {token} outside a message: {_snip(after)}")
        channel, recipient = _header(header)
        if recipient is not None:
            call, error = _call(recipient, body)
            if call is not None:
                turn.calls.append(call)
            else:
                turn.errors.append(error)
            later = START.join(pieces[i + 1 :])
            if later.strip():
                turn.errors.append(f"text after a tool call (a call ends the turn with {CALL}): {_snip(later)}")
            break
        if channel == "analysis":
            reasoning.append(body)
        elif channel in ("final", "commentary"):
            content.append(body)
        else:
            turn.errors.append(f"a message on no known channel (analysis, commentary, final): {_snip(header)}")
    turn.reasoning, turn.content = "\n".join(reasoning).strip(), "\n".join(content).strip()
    return turn


def _header(header: str) -> tuple[str, str | None]:
    """The channel and the recipient (`to=...`, after the role or after the channel) of an assistant message's
    header, its role cut off: ` to=functions.f<|channel|>commentary json` or `<|channel|>commentary to=functions.f
    <|constrain|>json`. What else follows the channel is the content type, which JSON arguments need not name."""
    role_part, _, channel_part = header.partition(CHANNEL)
    found = _RECIPIENT.search(role_part) or _RECIPIENT.search(channel_part)
    return _WORD.match(channel_part).group(1), found.group(1) if found else None


def _call(recipient: str, body: str) -> tuple[ToolCall | None, str]:
    name = recipient.removeprefix(FUNCTIONS)
    if not recipient.startswith(FUNCTIONS) or not name:
        return None, f"a call to {recipient!r}, which is not a function tool (functions.NAME)"
    try:
        arguments = json.loads(body) if body.strip() else {}
    except json.JSONDecodeError as e:
        return None, f"tool call to {name!r}: arguments are not valid JSON ({e.msg} at char {e.pos}): {_snip(body)}"
    except (RecursionError, ValueError) as e:  # "[[[[.." thousands deep; an int of over 4,300 digits
        return None, f"tool call to {name!r}: arguments cannot be read ({type(e).__name__}): {_snip(body)}"
    if not isinstance(arguments, dict):
        return None, f"tool call to {name!r}: arguments must be a JSON object, got {type(arguments).__name__}"
    return ToolCall(name=name, arguments=arguments), ""
