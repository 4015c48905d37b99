"""The OpenAI-compatible endpoint (`rollout/endpoint/`) with the real `openai` client and a real engine (the torch
backend on the built-in model; no mock server): a multi-turn tool agent gets exactly the token ids and log-probs the
engine produced, and its calls stitch into one training sequence whose tool results are environment tokens."""

import asyncio
import json

import openai
import pytest

from agentrl_ray.config import RolloutConfig
from agentrl_ray.rollout.endpoint.server import Endpoint
from agentrl_ray.rollout.endpoint.stitch import stitch
from agentrl_ray.rollout.torch_engine import TorchEngine
from agentrl_ray.types import TokenRole
from examples.openai_agent.agent import TOOLS, calculator

CFG = RolloutConfig(backend="torch", max_turns=3, max_tokens_per_turn=48, max_total_tokens=320)


@pytest.fixture(scope="module")
def engine_and_tokenizer(builtin_model_path):
    from transformers import AutoTokenizer

    engine = TorchEngine(builtin_model_path, dtype="float32", seed=0, max_model_len=512, max_num_seqs=8)
    return engine, AutoTokenizer.from_pretrained(builtin_model_path)


async def _tool_agent(client, question: str):
    """The example's tool loop, keeping each raw answer (with vLLM's return_token_ids)."""
    messages, answers = [{"role": "user", "content": question}], []
    for _ in range(3):
        reply = await client.chat.completions.create(
            model="policy", messages=messages, tools=TOOLS, logprobs=True, extra_body={"return_token_ids": True}
        )
        answers.append(reply)
        message = reply.choices[0].message
        messages.append(message.model_dump(exclude_none=True))
        if not message.tool_calls:
            break
        for call in message.tool_calls:
            messages.append({"role": "tool", "tool_call_id": call.id, "content": calculator(call.function.arguments)})
    return answers


def test_tool_agent_gets_the_engines_tokens(engine_and_tokenizer):
    engine, tokenizer = engine_and_tokenizer

    async def main():
        endpoint = Endpoint(engine, tokenizer, CFG, lambda: 7)
        base_url = await endpoint.start()
        endpoint.open("k1", temperature=1.0, seed=1)
        client = openai.AsyncOpenAI(base_url=base_url, api_key="k1", max_retries=0)
        answers = await _tool_agent(client, "What is 347 * 29?")
        session = endpoint.finish("k1")
        bad = openai.AsyncOpenAI(base_url=base_url, api_key="nobody", max_retries=0)
        with pytest.raises(openai.AuthenticationError):
            await bad.chat.completions.create(model="policy", messages=[{"role": "user", "content": "hi"}])
        return answers, session

    answers, session = asyncio.run(main())
    assert len(answers) >= 2, "the warm-started model calls the calculator, then answers"
    assert answers[0].choices[0].message.tool_calls[0].function.name == "calculator"
    assert json.loads(answers[0].choices[0].message.tool_calls[0].function.arguments)["expression"]
    for answer, call in zip(answers, session.calls):
        choice = answer.choices[0]
        ids = choice.model_extra["token_ids"]
        # What the client saw is what was recorded, which is what the engine gives for the same prompt and seed.
        assert answer.model_extra["prompt_token_ids"] == call.prompt_ids
        assert ids == call.choices[0].token_ids
        assert [t.logprob for t in choice.logprobs.content] == call.choices[0].logprobs
        direct = engine.generate(
            [call.prompt_ids],
            [48],
            temperature=1.0,
            top_p=1.0,
            stop_token_ids=[tokenizer.eos_token_id],
            seeds=[_seed(session, call.index)],
        )[0]
        assert direct.token_ids == ids
        assert direct.logprobs == call.choices[0].logprobs
        assert call.policy_version == 7

    # Each call's prompt extends the previous prompt + completion: one sequence, tool results as env tokens.
    (seq,) = stitch(session.calls)
    last = session.calls[-1]
    assert seq.ids == last.prompt_ids + last.choices[0].token_ids
    assert seq.prompt_len == len(session.calls[0].prompt_ids)
    result = calculator(answers[0].choices[0].message.tool_calls[0].function.arguments)
    env_text = tokenizer.decode([i for i, r in zip(seq.ids, seq.roles) if r == TokenRole.ENV])
    assert result in env_text
    sampled = [i for c in session.calls for i in c.choices[0].token_ids]
    assert [i for i, r in zip(seq.ids, seq.roles) if r == TokenRole.ACTION] == sampled


def _seed(session, index):
    import zlib

    return zlib.crc32(f"{session.seed}/{session.key}/{index}/0".encode())


def test_n_stream_stop_and_budget(engine_and_tokenizer):
    """`n` choices are each trained (two sequences of one call), a streamed answer carries the same message, a stop
    string cuts the completion (and what is trained), and a call past rollout.max_turns is refused."""
    engine, tokenizer = engine_and_tokenizer
    user = [{"role": "user", "content": "What is 12 * 7?"}]

    async def main():
        endpoint = Endpoint(engine, tokenizer, CFG, lambda: 0)
        client = openai.AsyncOpenAI(base_url=await endpoint.start(), api_key="k2", max_retries=0)
        endpoint.open("k2", temperature=1.0, seed=2)
        two = await client.chat.completions.create(model="policy", messages=user, tools=TOOLS, n=2)
        stream = await client.chat.completions.create(model="policy", messages=user, tools=TOOLS, stream=True)
        chunks = [c async for c in stream]
        cut = await client.chat.completions.create(model="policy", messages=user, stop=["answer"])
        with pytest.raises(openai.BadRequestError, match="rollout.max_turns"):
            await client.chat.completions.create(model="policy", messages=user)
        return two, chunks, cut, endpoint.finish("k2")

    two, chunks, cut, session = asyncio.run(main())
    assert [c.index for c in two.choices] == [0, 1] and len(session.calls[0].choices) == 2
    assert len(stitch(session.calls[:1])) == 2  # each choice a sequence of its own
    streamed = session.calls[1].choices[0]
    assert chunks[-1].usage.completion_tokens == len(streamed.token_ids)
    delta = chunks[0].choices[0].delta
    assert (delta.content or "") == (streamed.message.get("content") or "")
    assert [c.function.name for c in delta.tool_calls or []] == [
        c["function"]["name"] for c in streamed.message.get("tool_calls", [])
    ]
    # The stop string: what was trained is the start of what the engine sampled, cut where the text reaches it.
    full = engine.generate(
        [session.calls[2].prompt_ids],
        [48],
        temperature=1.0,
        top_p=1.0,
        stop_token_ids=[tokenizer.eos_token_id],
        seeds=[_seed(session, 2)],
    )[0].token_ids
    kept = session.calls[2].choices[0].token_ids
    assert full[: len(kept)] == kept and "answer" not in (cut.choices[0].message.content or "")
    assert ("answer" in tokenizer.decode(full)) == (len(kept) < len(full))
    assert session.refused == "turn_budget_exceeded"
