"""Anthropic's Messages API on the rollout endpoint (`rollout/endpoint/anthropic.py`) with the real `anthropic` client
and a real engine (the torch backend on the built-in model): a tool agent written against it gets the very tokens a
chat-completions agent gets for the same conversation, and its calls stitch into one training sequence."""

import asyncio
import json

import anthropic
import openai
import pytest
from test_openai_endpoint import CFG, _tool_agent, engine_and_tokenizer  # noqa: F401, F811 - the shared engine fixture

from agentrl_ray.rollout.endpoint.server import Endpoint
from agentrl_ray.rollout.endpoint.stitch import stitch
from agentrl_ray.types import TokenRole
from examples.openai_agent.agent import TOOLS, calculator

# The example's tools as Anthropic writes them.
ANTHROPIC_TOOLS = [
    {
        "name": t["function"]["name"],
        "description": t["function"]["description"],
        "input_schema": t["function"]["parameters"],
    }
    for t in TOOLS
]
QUESTION = "What is 347 * 29?"


async def _anthropic_agent(client, question: str):
    """The example's tool loop, written for the Messages API."""
    messages, replies = [{"role": "user", "content": question}], []
    for _ in range(3):
        reply = await client.messages.create(model="policy", max_tokens=48, messages=messages, tools=ANTHROPIC_TOOLS)
        replies.append(reply)
        messages.append({"role": "assistant", "content": [b.model_dump(exclude_none=True) for b in reply.content]})
        if reply.stop_reason != "tool_use":
            break
        results = [
            {"type": "tool_result", "tool_use_id": b.id, "content": calculator(json.dumps(b.input))}
            for b in reply.content
            if b.type == "tool_use"
        ]
        messages.append({"role": "user", "content": results})
    return replies


def test_an_anthropic_agent_trains_on_the_tokens_a_chat_agent_would(engine_and_tokenizer):  # noqa: F811
    engine, tokenizer = engine_and_tokenizer

    async def main():
        endpoint = Endpoint(engine, tokenizer, CFG, lambda: 3)
        base_url = await endpoint.start()
        root = base_url.removesuffix("/v1")  # the anthropic client appends /v1/messages itself
        endpoint.open("k1", temperature=1.0, seed=1)
        replies = await _anthropic_agent(anthropic.AsyncAnthropic(base_url=root, api_key="k1", max_retries=0), QUESTION)
        messages_session = endpoint.finish("k1")
        endpoint.open("k1", temperature=1.0, seed=1)  # the same key and seed: the same sampling seeds per call
        await _tool_agent(openai.AsyncOpenAI(base_url=base_url, api_key="k1", max_retries=0), QUESTION)
        chat_session = endpoint.finish("k1")
        bad = anthropic.AsyncAnthropic(base_url=root, api_key="nobody", max_retries=0)
        with pytest.raises(anthropic.AuthenticationError):
            await bad.messages.create(model="policy", max_tokens=8, messages=[{"role": "user", "content": "hi"}])
        endpoint.open("k2", temperature=1.0, seed=2)
        client = anthropic.AsyncAnthropic(base_url=root, api_key="k2", max_retries=0)
        image = {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": "AA=="}}
        with pytest.raises(anthropic.BadRequestError, match="'image' blocks are not supported"):
            await client.messages.create(model="policy", max_tokens=8, messages=[{"role": "user", "content": [image]}])
        async with client.messages.stream(
            model="policy", max_tokens=48, messages=[{"role": "user", "content": QUESTION}], tools=ANTHROPIC_TOOLS
        ) as stream:
            streamed = await stream.get_final_message()
        return replies, messages_session, chat_session, streamed, endpoint.finish("k2")

    replies, messages_session, chat_session, streamed, stream_session = asyncio.run(main())
    assert replies[0].stop_reason == "tool_use" and replies[0].content[-1].name == "calculator"
    assert len(replies) >= 2, "the warm-started model calls the calculator, then answers"
    # Token for token what the chat-completions agent got: the same prompts, samples and log-probs at every call.
    assert len(messages_session.calls) == len(chat_session.calls)
    for ours, theirs in zip(messages_session.calls, chat_session.calls):
        assert ours.prompt_ids == theirs.prompt_ids and ours.prompt_roles == theirs.prompt_roles
        assert ours.choices[0].token_ids == theirs.choices[0].token_ids
        assert ours.choices[0].logprobs == theirs.choices[0].logprobs
        assert ours.policy_version == 3
    (seq,) = stitch(messages_session.calls)  # one sequence: each call continued the ids of the one before
    result = calculator(json.dumps(replies[0].content[-1].input))
    assert result in tokenizer.decode([i for i, r in zip(seq.ids, seq.roles) if r == TokenRole.ENV])
    sampled = [i for c in messages_session.calls for i in c.choices[0].token_ids]
    assert [i for i, r in zip(seq.ids, seq.roles) if r == TokenRole.ACTION] == sampled
    # The event stream assembles, in the client's own parser, into the message that was recorded.
    [call] = stream_session.calls
    recorded = call.choices[0].message
    assert [b.type for b in streamed.content] == ["text"] * bool(recorded.get("content")) + ["tool_use"] * len(
        recorded.get("tool_calls") or []
    )
    uses = [b for b in streamed.content if b.type == "tool_use"]
    assert [(b.name, b.input) for b in uses] == [
        (c["function"]["name"], c["function"]["arguments"]) for c in recorded.get("tool_calls") or []
    ]
    assert streamed.usage.output_tokens == len(call.choices[0].token_ids)
