"""A turn-based environment's observation, appended as separately encoded user-turn segments, is what the built-in
chat template (Qwen2.5 layout) renders for a user message after an assistant message: same text, same ids."""

import pytest

from agentrl_ray.chat_format import encode_segments, user_turn_segments
from agentrl_ray.types import TokenRole

QUESTION = [{"role": "user", "content": "Say hello."}]
REPLY = {"role": "assistant", "content": "Hello there!"}
OBSERVATIONS = [
    "Capital of France?",
    "",
    "two\nlines",
    "  leading spaces",
    "trailing spaces  ",
    "ends with a newline\n",
    "\n\nstarts with two",
    "done: open_door\nunknown action 'fly'",
    "ünïcode ✓ 🙂 and 1,234",
]


@pytest.fixture(scope="module")
def tok(builtin_model_path):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(builtin_model_path)


def _render(tok, messages, **kwargs):
    return tok.apply_chat_template(messages, return_dict=False, **kwargs)


@pytest.mark.parametrize("observation", OBSERVATIONS)
def test_user_turn_segments_match_the_template(tok, observation):
    segments = user_turn_segments(observation)
    # The sampled assistant turn ends with <|im_end|>; the template's "\n" after it is the first segment's.
    before = _render(tok, [*QUESTION, REPLY], tokenize=False).removesuffix("\n")
    after = _render(tok, [*QUESTION, REPLY, {"role": "user", "content": observation}], tokenize=False)
    full = _render(tok, [*QUESTION, REPLY, {"role": "user", "content": observation}], add_generation_prompt=True)
    assert before + "".join(text for text, _ in segments) == after + "<|im_start|>assistant\n"
    assert [text for text, role in segments if role == TokenRole.ENV] == ([observation] if observation else [])

    # Tokens in, tokens out: prompt + sampled + separately encoded segments are the ids of the whole rendering.
    prompt = _render(tok, QUESTION, add_generation_prompt=True)
    sampled = tok.encode("Hello there!<|im_end|>", add_special_tokens=False)
    ids, roles = encode_segments(tok, segments)
    assert list(prompt) + sampled + ids == list(full)
    assert tok.decode([i for i, r in zip(ids, roles) if r == TokenRole.ENV]) == observation
