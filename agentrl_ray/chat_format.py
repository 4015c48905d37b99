"""The token-level chat format of a tool-using conversation, shared by rollouts and supervised warm-up.

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
"""

from __future__ import annotations

from typing import Literal

Role = Literal["template", "env"]

END_OF_TURN = "<|im_end|>"
TOOL_CALL_OPEN = "<tool_call>"
TOOL_CALL_CLOSE = "</tool_call>"


def tool_response_segments(results: list[str]) -> list[tuple[str, Role]]:
    """The text segments (with roles) that follow an assistant turn carrying tool calls."""
    segments: list[tuple[str, Role]] = [("\n<|im_start|>user", "template")]
    for text in results:
        segments.append(("\n<tool_response>\n", "template"))
        if text:
            segments.append((text, "env"))
        segments.append(("\n</tool_response>", "template"))
    segments.append(("<|im_end|>\n<|im_start|>assistant\n", "template"))
    return segments


def user_turn_segments(text: str) -> list[tuple[str, Role]]:
    """The text segments (with roles) of a user message that follows an assistant turn (which ended in <|im_end|>),
    up to the next assistant header: what the template renders for `{"role": "user", "content": text}` there."""
    segments: list[tuple[str, Role]] = [("\n<|im_start|>user\n", "template")]
    if text:
        segments.append((text, "env"))
    segments.append(("<|im_end|>\n<|im_start|>assistant\n", "template"))
    return segments


def encode_segments(tokenizer, segments: list[tuple[str, Role]]) -> tuple[list[int], list[Role]]:
    """Encode each segment on its own (no special tokens added) and return ids with a role per id."""
    ids: list[int] = []
    roles: list[Role] = []
    for text, role in segments:
        piece = tokenizer.encode(text, add_special_tokens=False)
        ids.extend(piece)
        roles.extend([role] * len(piece))
    return ids, roles
