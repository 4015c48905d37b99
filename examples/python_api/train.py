"""Train the default calculator agent from Python, with a plain function as its tool, then use the model.

    CPU (this machine):  python examples/python_api/train.py                # the default run, ~2 min
                         python examples/python_api/train.py run.steps=5    # dotted overrides, as on the CLI
    one GPU:             python examples/python_api/train.py profile=gpu
    Ray cluster:         ray job submit --working-dir . -- python examples/python_api/train.py

`calculator` is defined in this script (`__main__`), which Ray workers cannot import: agentrl_ray ships it to them
by value. Its name, signature and docstring are its JSON schema, the same the CLI's CalculatorEnv shows the model,
so this run matches `agentrl-ray train examples/calculator/config.yaml` step for step.
"""

import sys
from pathlib import Path

import agentrl_ray
from agentrl_ray.envs.builtin.calculator import evaluate, format_number
from agentrl_ray.rewards import answer_match


def calculator(expression: str) -> str:
    """Evaluate an arithmetic expression and return the result.

    Supports + - * / // % ** (exponent at most 100), parentheses, unary minus, integers and decimals.

    Args:
        expression: The expression to evaluate, e.g. "(347 * 29) - 12.5".
    """
    return format_number(evaluate(expression))


result = agentrl_ray.train(
    model="builtin:tiny",  # or a local Hugging Face folder, or a Hub model id
    tools=[calculator],  # plain functions; or env=MyEnvironment (a class with tool methods)
    data="builtin:arithmetic",  # or a list of {"prompt": ..., "answer": ...} rows, or a .jsonl file
    rewards=[answer_match],  # TRL-style reward functions, or built-in names like "answer_match"
    # system_prompt="You are a careful calculator agent.",
    config=Path(__file__).parents[1] / "calculator" / "config.yaml",  # the CLI's settings underneath
    run={"name": "python_api"},
    overrides=sys.argv[1:],
)
print("held-out success:", result.metrics["eval/success"], "| model:", result.model_path)
print(result.generate(["What is 347 * 29?"])[0])  # the conversation: tool call, tool result, answer
result.close()
# result.save("my-model"); result.export("gguf", quant="q8_0")  # + an Ollama Modelfile
