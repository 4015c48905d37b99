"""OpenAI's Responses API on the rollout endpoint (`rollout/endpoint/responses.py`) with the real `openai` client and
a real engine (the torch backend on the built-in model): an agent written against `client.responses`, passing the
whole input each call or only the new items after `previous_response_id`, gets the very tokens a chat-completions
agent gets for the same conversation, and its calls stitch into one training sequence."""

import asyncio

import openai
import pytest
from test_openai_endpoint import CFG, _tool_agent, engine_and_tokenizer  # noqa: F401, F811 - the shared engine fixture

from agentrl_ray.rollout.endpoint.server import Endpoint
from agentrl_ray.rollout.endpoint.stitch import stitch
from agentrl_ray.types import TokenRole
from examples.openai_agent.agent import TOOLS, calculator

# The example's tools as the Responses API writes them.
RESPONSES_TOOLS = [{"type": "function", **t["function"]} for t in TOOLS]
QUESTION = "What is 347 * 29?"


async def _responses_agent(client, question: str, chained: bool):
    """The example's tool loop with `client.responses`: the output items appended to the input (the documented
    pattern), or, `chained`, only the new items sent after `previous_response_id`."""
    items, replies, previous = [{"role": "user", "content": question}], [], None
    for _ in range(3):
        extra = {"previous_response_id": previous} if previous else {}
        reply = await client.responses.create(
            model="policy", input=items, tools=RESPONSES_TOOLS, max_output_tokens=48, **extra
        )
        replies.append(reply)
        calls = [o for o in reply.output if o.type == "function_call"]
        outputs = [
            {"type": "function_call_output", "call_id": c.call_id, "output": calculator(c.arguments)} for c in calls
        ]
        if chained:
            items, previous = outputs, reply.id
        else:
            items = [*items, *(o.model_dump(exclude_none=True) for o in reply.output), *outputs]
        if not calls:
            break
    return replies


def test_a_responses_agent_trains_on_the_tokens_a_chat_agent_would(engine_and_tokenizer):  # noqa: F811
    engine, tokenizer = engine_and_tokenizer

    async def main():
        endpoint = Endpoint(engine, tokenizer, CFG, lambda: 5)
        base_url = await endpoint.start()
        client = openai.AsyncOpenAI(base_url=base_url, api_key="k1", max_retries=0)
        sessions, replies = {}, {}
        for name in ("chat", "input", "chained"):
            endpoint.open("k1", temperature=1.0, seed=1)  # the same key and seed: the same sampling seeds per call
            if name == "chat":
                await _tool_agent(client, QUESTION)
            else:
                replies[name] = await _responses_agent(client, QUESTION, chained=name == "chained")
            sessions[name] = endpoint.finish("k1")
        endpoint.open("k2", temperature=1.0, seed=2)
        other = openai.AsyncOpenAI(base_url=base_url, api_key="k2", max_retries=0)
        with pytest.raises(openai.BadRequestError, match="'reasoning' items are not supported"):
            await other.responses.create(model="policy", input=[{"type": "reasoning", "id": "r", "summary": []}])
        with pytest.raises(openai.BadRequestError, match="previous_response_id 'resp_x': no such response"):
            await other.responses.create(model="policy", input="hi", previous_response_id="resp_x")
        async with other.responses.stream(
            model="policy", input=QUESTION, tools=RESPONSES_TOOLS, max_output_tokens=48
        ) as stream:
            streamed = await stream.get_final_response()
        return sessions, replies, streamed, endpoint.finish("k2")

    sessions, replies, streamed, stream_session = asyncio.run(main())
    first = replies["input"][0]
    assert [o.type for o in first.output][-1] == "function_call" and first.output[-1].name == "calculator"
    assert len(replies["input"]) >= 2, "the warm-started model calls the calculator, then answers"
    chat = sessions["chat"]
    for name in ("input", "chained"):  # token for token what the chat-completions agent got, at every call
        ours = sessions[name]
        assert len(ours.calls) == len(chat.calls), name
        for a, b in zip(ours.calls, chat.calls):
            assert a.prompt_ids == b.prompt_ids and a.prompt_roles == b.prompt_roles, name
            assert a.choices[0].token_ids == b.choices[0].token_ids, name
            assert a.choices[0].logprobs == b.choices[0].logprobs, name
            assert a.policy_version == 5
        (seq,) = stitch(ours.calls)
        result = calculator(first.output[-1].arguments)
        assert result in tokenizer.decode([i for i, r in zip(seq.ids, seq.roles) if r == TokenRole.ENV])
    assert replies["input"][-1].output_text == replies["chained"][-1].output_text
    # The event stream assembles, in the client's own parser, into the answer that was recorded.
    [call] = stream_session.calls
    recorded = call.choices[0].message
    uses = [(o.name, o.arguments) for o in streamed.output if o.type == "function_call"]
    assert [name for name, _ in uses] == [c["function"]["name"] for c in recorded.get("tool_calls") or []]
    assert streamed.output_text == (recorded.get("content") or "")
    assert streamed.usage.output_tokens == len(call.choices[0].token_ids)
