"""The calculator task as a plain OpenAI-client tool loop: a program written against OpenAI's API, trained unchanged.

`run(client, row)` is all the trainer needs (`env.agent: examples.openai_agent.agent:run`): `client` is an
`openai.AsyncOpenAI` pointed at the rollout engines, `row` the dataset row. It returns nothing, so the reward
functions of the config (`answer_match`) score the transcript, as they score the built-in calculator environment's.
The tool schema and the tool's answers (results, and "Error: ..." for an expression it cannot evaluate) are those of
`agentrl_ray.envs.builtin.calculator:CalculatorEnv`, so the two runs see the same prompts and observations.

Run it against any OpenAI-compatible server, outside training:
    python examples/openai_agent/agent.py http://localhost:8000/v1 "What is 347 * 29?"
"""

from __future__ import annotations

import asyncio
import json
import sys

from agentrl_ray.envs.builtin.calculator import evaluate, format_number

TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "calculator",
            "description": "Evaluate an arithmetic expression and return the result.\n\nSupports + - * / // % ** "
            "(exponent at most 100), parentheses, unary minus, integers and decimals.",
            "parameters": {
                "type": "object",
                "properties": {
                    "expression": {
                        "type": "string",
                        "description": 'The expression to evaluate, e.g. "(347 * 29) - 12.5".',
                    }
                },
                "required": ["expression"],
            },
        },
    }
]
MAX_TURNS = 3


def calculator(arguments: str) -> str:
    try:
        return format_number(evaluate(json.loads(arguments)["expression"]))
    except (ValueError, KeyError, TypeError, ArithmeticError) as e:
        return f"Error: calculator: {e}"


async def run(client, row):
    prompt = row["prompt"]
    messages = [{"role": "user", "content": prompt}] if isinstance(prompt, str) else list(prompt)
    for _ in range(MAX_TURNS):
        reply = await client.chat.completions.create(model="policy", messages=messages, tools=TOOLS)
        message = reply.choices[0].message
        messages.append(message.model_dump(exclude_none=True))
        if not message.tool_calls:
            return None  # the final answer: the config's reward functions score the transcript
        for call in message.tool_calls:
            messages.append({"role": "tool", "tool_call_id": call.id, "content": calculator(call.function.arguments)})
    return None


if __name__ == "__main__":
    import openai

    async def main(base_url: str, question: str) -> None:
        client = openai.AsyncOpenAI(base_url=base_url, api_key="none")
        print(await run(client, {"prompt": question}))

    asyncio.run(main(*sys.argv[1:3]))
