"""The calculator task written with the OpenAI Agents SDK (`pip install openai-agents`, the `agent` extra), trained
unchanged: `env.agent=examples.openai_agent.sdk_agent:run`.

The SDK runs its own loop (tool schema from the function's signature, tool calls, tool results) through the chat
completions client it is given; the trainer only sees the calls. Tracing is off: it would upload to OpenAI.

    agentrl-ray train examples/openai_agent/config.yaml env.agent=examples.openai_agent.sdk_agent:run
"""

from __future__ import annotations

from agents import Agent, MaxTurnsExceeded, OpenAIChatCompletionsModel, Runner, function_tool, set_tracing_disabled

from agentrl_ray.envs.builtin.calculator import evaluate, format_number

set_tracing_disabled(True)


@function_tool
def calculator(expression: str) -> str:
    """Evaluate an arithmetic expression and return the result.

    Supports + - * / // % ** (exponent at most 100), parentheses, unary minus, integers and decimals.

    Args:
        expression: The expression to evaluate, e.g. "(347 * 29) - 12.5".
    """
    return format_number(evaluate(expression))


async def run(client, row):
    agent = Agent(name="calculator", tools=[calculator], model=OpenAIChatCompletionsModel("policy", client))
    try:
        await Runner.run(agent, row["prompt"], max_turns=3)
    except MaxTurnsExceeded:
        pass  # still asking for tools after 3 turns: the transcript so far is scored (no answer: reward 0)
    return None  # the config's reward functions score the transcript
