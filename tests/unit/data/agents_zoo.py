"""An agent program for the containment tests of `rollout/endpoint/agents.py` that misbehaves as its row says."""

import asyncio
import os

from examples.openai_agent.agent import run as calculator


async def run(client, row):
    behaviour = row["behaviour"]
    if behaviour == "calculator":  # the well-behaved example
        return await calculator(client, row)
    if behaviour == "crashes":
        os._exit(3)
    if behaviour == "raises":
        raise RuntimeError("the agent's own bug")
    messages = [{"role": "user", "content": row["prompt"]}]
    reply = await client.chat.completions.create(model="policy", messages=messages, max_tokens=4)
    if behaviour == "rewarded":
        return 0.75
    if behaviour == "hangs":
        await asyncio.sleep(3600)
    # "greedy": calls until it is refused (past rollout.max_turns the endpoint answers with an error, raised here).
    while True:
        messages += [reply.choices[0].message.model_dump(exclude_none=True), {"role": "user", "content": "again"}]
        reply = await client.chat.completions.create(model="policy", messages=messages, max_tokens=4)
