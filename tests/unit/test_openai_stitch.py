"""Tokens in for agent programs (`rollout/endpoint/calls.py`, `stitch.py`): a call that continues the conversation
extends the exact ids of the previous call with its tool results as environment tokens; a rewritten history starts
a new training sequence of the same trajectory, and the learner trains each with the trajectory's advantage."""

import pytest
import torch

from agentrl_ray.config import AlgorithmConfig
from agentrl_ray.learner.batching import build_batch
from agentrl_ray.rollout.endpoint.calls import Choice, Renderer
from agentrl_ray.rollout.endpoint.stitch import stitch
from agentrl_ray.types import SequencePart, TokenRole, TrajectoryGroup, role_masks
from tests.builders import trajectory

CALL = {"id": "call_0_0", "type": "function", "function": {"name": "calculator", "arguments": '{"expression": "2+2"}'}}


@pytest.fixture(scope="module")
def renderer(builtin_model_path):
    from transformers import AutoTokenizer

    return Renderer(AutoTokenizer.from_pretrained(builtin_model_path))


def _sampled(renderer, call, text, message):
    """Give `call` one choice: `text` as the engine would have sampled it (ending in the end-of-turn token)."""
    tok = renderer.tokenizer
    ids = tok.encode(text, add_special_tokens=False) + [tok.eos_token_id]
    call.choices = [Choice(ids, [-0.5] * len(ids), "stop", message, ended_turn=True)]
    return call


def test_continuation_and_rewrite(renderer):
    user = {"role": "user", "content": "What is 2+2?"}
    first = renderer.render([user], None, [])
    reply = {"role": "assistant", "content": "", "tool_calls": [CALL]}
    _sampled(
        renderer, first, '<tool_call>\n{"name": "calculator", "arguments": {"expression": "2+2"}}\n</tool_call>', reply
    )
    tool = {"role": "tool", "tool_call_id": "call_0_0", "content": "4"}
    second = renderer.render([user, reply, tool], None, [first])
    assert second.continues == (0, 0)
    assert second.prompt_ids[: len(first.prompt_ids) + len(first.choices[0].token_ids)] == (
        first.prompt_ids + first.choices[0].token_ids
    )
    env = [i for i, r in zip(second.prompt_ids, second.prompt_roles) if r == TokenRole.ENV]
    assert renderer.tokenizer.decode(env) == "4"
    answer = {"role": "assistant", "content": "The answer is 4."}
    _sampled(renderer, second, "The answer is 4.", answer)
    # The agent summarises: a new prompt that does not extend the sequence so far.
    summary = {"role": "user", "content": "Earlier you found 2+2=4. What is 4*3?"}
    third = renderer.render([summary], None, [first, second])
    assert third.continues is None
    _sampled(renderer, third, "12", {"role": "assistant", "content": "12"})

    one, two = stitch([first, second, third])
    assert one.ids == second.prompt_ids + second.choices[0].token_ids
    assert sum(r == TokenRole.ACTION for r in one.roles) == len(first.choices[0].token_ids) + len(
        second.choices[0].token_ids
    )
    assert two.prompt_len == len(third.prompt_ids)
    assert two.roles == [TokenRole.PROMPT] * len(third.prompt_ids) + [TokenRole.ACTION] * len(
        third.choices[0].token_ids
    )
    assert two.logprobs[-1] == -0.5


def test_earlier_parts_train_with_the_trajectorys_advantage():
    part = SequencePart(
        [1, 2, 3],
        **role_masks([TokenRole.PROMPT, TokenRole.ACTION, TokenRole.ACTION]),
        rollout_logprobs=[0, -1, -1],
        prompt_len=1,
    )
    a = trajectory("p0", 0, reward=1.0, earlier_parts=[part])
    b = trajectory("p0", 1, reward=0.0)
    batch = build_batch([TrajectoryGroup("p0", [a, b])], AlgorithmConfig(), pad_id=0, max_total_tokens=64)
    assert len(batch) == 3  # the earlier part, then the two trajectories
    assert batch.advantages[0] == batch.advantages[1] > 0 > batch.advantages[2]
    assert torch.equal(batch.input_ids[0, :3], torch.tensor([1, 2, 3]))


def test_the_example_agent_sees_the_builtin_loops_ids(renderer):
    """examples/openai_agent's calls become exactly the ids the built-in loop builds for CalculatorEnv: the same
    prompt (tools rendered from the same schema) and the same tool-result segments."""
    from agentrl_ray.chat_format import encode_segments, tool_response_segments
    from agentrl_ray.envs.builtin.calculator import CalculatorEnv
    from agentrl_ray.envs.tools import tool_schemas
    from examples.openai_agent.agent import TOOLS

    tok = renderer.tokenizer
    user = [{"role": "user", "content": "What is 347 * 29?"}]
    builtin = tok.apply_chat_template(
        user, tools=tool_schemas(CalculatorEnv), add_generation_prompt=True, tokenize=True, return_dict=False
    )
    first = renderer.render(user, TOOLS, [])
    assert first.prompt_ids == list(builtin)
    args = {"expression": "347 * 29"}
    reply = {
        "role": "assistant",
        "content": "",
        "tool_calls": [{"id": "c", "type": "function", "function": {"name": "calculator", "arguments": args}}],
    }
    _sampled(
        renderer,
        first,
        '<tool_call>\n{"name": "calculator", "arguments": {"expression": "347 * 29"}}\n</tool_call>',
        reply,
    )
    second = renderer.render([*user, reply, {"role": "tool", "tool_call_id": "c", "content": "10063"}], TOOLS, [first])
    k = len(first.prompt_ids) + len(first.choices[0].token_ids)
    assert (second.prompt_ids[k:], second.prompt_roles[k:]) == encode_segments(tok, tool_response_segments(["10063"]))
