"""The tokens that follow an assistant turn, cut from the model's own chat template (`rollout.tool_format`: every
format but hermes and mistral).

What `apply_chat_template` renders after the token that ends the assistant's turn once the environment's messages
follow it, each message's content put in by the template itself (Llama's quotes a tool result as a JSON string,
gpt-oss's too; Llama's user turns are trimmed). Those pieces are template tokens, what the template made of each
content is environment tokens, and the joined text is checked against the template's rendering of the real
messages: the trajectory holds, character for character, what the model sees under its own template.

The turn the segments follow is rendered as a call of the function the results answer, since a template may name
it in the results' header (gpt-oss's `<|start|>functions.NAME to=assistant`); templates see a message's role, name
and content.
"""

from __future__ import annotations

from agentrl_ray.chat_format import Segment
from agentrl_ray.types import TokenRole

_PLACEHOLDER = "agentrlcontent{}"  # letters and digits: a template that quotes or trims a content keeps it whole
_PROBE = ' a "quoted" <tag> & \\ {braces}\n\tüñí '  # what a template may quote, escape or trim


class TemplateFraming:
    """The segments that follow an assistant turn, cut from `tokenizer`'s chat template (see the module docstring).
    `ends`: the tokens that may end a turn (default: the eos token; gpt-oss's: <|call|> and <|return|>). Raises
    ValueError at construction when the template cannot be cut so: it never ends a turn with one of them, renders a
    turn differently once tool results follow it, or leaves a message's content out.

    Renders are cached: the turn before the segments, each message layout, each role's surroundings of a content.
    Where the template puts a content in as it is (tried on a hostile probe), a turn costs no render; else (Llama
    quotes a tool result as JSON) one render per message and one to check the whole."""

    def __init__(self, tokenizer, ends: tuple[str, ...] = ()) -> None:
        if not getattr(tokenizer, "chat_template", None):
            raise ValueError("the tokenizer has no chat template to read the tool-result framing from")
        if not tokenizer.eos_token:
            raise ValueError("the tokenizer has no eos token: an assistant turn could never end")
        self.tokenizer = tokenizer
        self.ends = ends or (tokenizer.eos_token,)
        self._before: dict[str | None, tuple[list[dict], int, str]] = {}
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
                # Qwen3's drops an earlier turn's empty reasoning block once a user message follows it; gpt-oss's
                # ends a final answer with <|return|>, and with <|end|> once a message follows it.
                self.user_turns = str(e)

    def _render(self, messages: list[dict], generation: bool) -> str:
        return self.tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=generation)

    def _after_turn(self, call: str | None, messages: list[dict]) -> str:
        """What the template renders after the turn (a call of `call`, or an answer) once `messages` follow it."""
        if call not in self._before:
            context = _context(call)
            before = self._render(context, False)
            end = max(before.rfind(e) + len(e) if e in before else -1 for e in self.ends)
            if end < 0:
                raise ValueError(f"the chat template does not end an assistant turn with {' or '.join(self.ends)}")
            self._before[call] = (context, end, before)
        context, end, before = self._before[call]
        full = self._render(context + messages, True)
        if full[:end] != before[:end]:
            at = next((i for i, (a, b) in enumerate(zip(before[:end], full)) if a != b), min(end, len(full)))
            tag = before.rfind("<", max(0, at - 20), at + 1)  # show the text from the tag that changed
            was, now = before[tag if tag >= 0 else at : end][:40], full[tag if tag >= 0 else at : end + 10][:40]
            raise ValueError(
                f"the chat template renders an assistant turn differently once messages follow it ({was!r} becomes "
                f"{now!r}): the tokens sampled for the turn would not be what the template shows (give the model a "
                "template that renders earlier turns unchanged, as TRL's *_training.jinja do for Qwen3, or set "
                "rollout.tool_format=hermes)"
            )
        return full[end:]

    def segments(self, messages: list[dict]) -> list[Segment]:
        """The segments of `messages` (tool results, then perhaps a user message) after the turn."""
        if self.user_turns and any(m["role"] == "user" for m in messages):
            raise ValueError(f"a user message after a turn: {self.user_turns}")
        messages = [{k: m[k] for k in ("role", "name", "content") if k in m} for m in messages]
        call = next((m.get("name", "f") for m in messages if m["role"] == "tool"), None)
        key = (call, *((m["role"], m.get("name")) for m in messages))
        if key not in self._layouts:
            marked = [{**m, "content": _PLACEHOLDER.format(i)} for i, m in enumerate(messages)]
            rest, pieces = self._after_turn(call, marked), []
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
            real = self._after_turn(call, messages)
            if "".join(text for text, _ in segments) != real:
                raise ValueError(f"the chat template renders these messages unlike their parts: {real!r}")
        return segments

    def _content(self, message: dict) -> str:
        """What the template makes of one message's content (its placeholder's surroundings cut off)."""
        call = message.get("name", "f") if message["role"] == "tool" else None
        key = (message["role"], message.get("name"))
        if key not in self._around:
            marked = self._after_turn(call, [{**message, "content": _PLACEHOLDER.format(0)}])
            head, found, tail = marked.partition(_PLACEHOLDER.format(0))
            if not found:
                raise ValueError(f"the chat template leaves out the content of a {message['role']} message")
            self._around[key] = (head, tail)
        head, tail = self._around[key]
        real = self._after_turn(call, [message])
        if not (real.startswith(head) and real.endswith(tail) and len(real) >= len(head) + len(tail)):
            raise ValueError(f"the chat template renders a {message['role']} message's content unlike its others")
        return real[len(head) : len(real) - len(tail)]


def _context(call: str | None) -> list[dict]:
    """The conversation up to the assistant turn the segments follow: a call of `call`, or a plain answer (None)."""
    if call is None:
        return [{"role": "user", "content": "q"}, {"role": "assistant", "content": "a"}]
    tool_call = {"type": "function", "function": {"name": call, "arguments": {}}}
    return [{"role": "user", "content": "q"}, {"role": "assistant", "content": "", "tool_calls": [tool_call]}]
