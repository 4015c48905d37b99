"""Agent programs for the containment tests of `rollout/endpoint/agents.py`: each misbehaves one way."""

import asyncio
import os

from examples.openai_agent.agent import run as calculator  # noqa: F401 - the well-behaved one


async def rewarded(client, row):
    await client.chat.completions.create(model="policy", messages=[{"role": "user", "content": row["prompt"]}])
    return 0.75


async def hangs(client, row):
    await client.chat.completions.create(model="policy", messages=[{"role": "user", "content": row["prompt"]}])
    await asyncio.sleep(3600)


async def crashes(client, row):
    os._exit(3)


async def raises(client, row):
    raise RuntimeError("the agent's own bug")


async def greedy(client, row):
    """Calls until it is refused: past rollout.max_turns the endpoint answers with an error, which this raises."""
    messages = [{"role": "user", "content": row["prompt"]}]
    while True:
        reply = await client.chat.completions.create(model="policy", messages=messages, max_tokens=4)
        messages += [reply.choices[0].message.model_dump(exclude_none=True), {"role": "user", "content": "again"}]
