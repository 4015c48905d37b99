"""The grid task's part of the built-in model recipe (`builtin:tiny-grid`, see `recipe.GRID_RECIPE`).

The tokenizer is trained on rendered warm-up dialogues of the grid task, and the model warm-started on the same
dialogues assembled token for token the way rollouts assemble them (prompt from the chat template, assistant turns
ending in <|im_end|>, tool results as encoded segments that carry no loss: predicting them is left to ECHO).
"""

from __future__ import annotations

import random
from collections.abc import Callable
from typing import Any

from agentrl_ray.chat_format import END_OF_TURN, ToolCall, encode_segments, render_tool_call, tool_response_segments
from agentrl_ray.tasks import grid
from agentrl_ray.types import TokenRole

TOKENIZER_DIALOGUES = 2000


def grid_tools() -> list[dict[str, Any]]:
    """The tool schemas rollouts render for `GridEnv`: the model is warm-started on that very system prompt."""
    from agentrl_ray.envs.builtin.grid import GridEnv
    from agentrl_ray.envs.tools import tool_schemas

    return tool_schemas(GridEnv)


def texts_and_examples(recipe, tools: list[dict[str, Any]], template: str) -> tuple[list[str], Callable]:
    """(texts to train the tokenizer on, tokenizer -> [(ids, loss mask)] of the warm-up dialogues)."""
    from transformers import Qwen2Tokenizer

    problems = grid.sample_problems(recipe.sft_dialogues, recipe.seed, "train")
    rng = random.Random(recipe.seed)
    observe = grid.check_observe(recipe.grid_observations)
    dialogues = [grid.warmup_messages(start, goal, rng, recipe.sft_toward_share, observe) for start, goal in problems]
    renderer = Qwen2Tokenizer()  # only to render the training text with our template
    renderer.chat_template = template
    texts = [renderer.apply_chat_template(m, tools=tools, tokenize=False) for m in dialogues[:TOKENIZER_DIALOGUES]]

    def make_examples(tokenizer) -> list[tuple[list[int], list[int]]]:
        return [messages_example(tokenizer, tools, m, recipe.sft_learn_observations) for m in dialogues]

    return texts, make_examples


def messages_example(
    tokenizer, tools, messages: list[dict[str, Any]], learn_observations: bool = False
) -> tuple[list[int], list[int]]:
    """(ids, loss mask) of a dialogue of one user message, then assistant turns (one tool call or a final text) and
    tool results; loss on the assistant's tokens only, or also on the tool results' own tokens (the ones ECHO scores)
    with `learn_observations`."""
    ids = list(
        tokenizer.apply_chat_template(
            messages[:1], tools=tools, add_generation_prompt=True, tokenize=True, return_dict=False
        )
    )
    mask = [0] * len(ids)
    for message in messages[1:]:
        if message["role"] == "tool":
            piece, roles = encode_segments(tokenizer, tool_response_segments([message["content"]]))
            ids.extend(piece)
            mask.extend([int(learn_observations and r == TokenRole.ENV) for r in roles])
            continue
        calls = message.get("tool_calls") or []
        fn = calls[0]["function"] if calls else None
        text = render_tool_call(ToolCall(fn["name"], fn["arguments"])) if fn else ""
        piece = tokenizer.encode((text or message["content"]) + END_OF_TURN, add_special_tokens=False)
        ids.extend(piece)
        mask.extend([1] * len(piece))
    return ids, mask
