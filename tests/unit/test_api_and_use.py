"""The Python API's config building, plain functions as tools, by-value shipping, the system prompt, and the pure
parts of eval/chat/export (pass@k, transcripts, the Ollama template). No Ray here."""

import asyncio
import base64
import math
import re
from pathlib import Path

import pytest
from builders import trajectory

from agentrl_ray.api import build_config
from agentrl_ray.chat_format import ToolCall, parse_tool_calls, prompt_messages
from agentrl_ray.config import ConfigError
from agentrl_ray.envs.builtin.calculator import CalculatorEnv
from agentrl_ray.envs.host import EnvHost
from agentrl_ray.envs.loading import BY_VALUE, env_class, import_object, object_spec
from agentrl_ray.envs.tools import tool_schemas
from agentrl_ray.infra.profiles import load_config
from agentrl_ray.messages import assistant_message, to_openai, tool_messages
from agentrl_ray.rewards.eval_stats import bootstrap_interval, pass_at_k
from agentrl_ray.trained.evaluate import summarize
from agentrl_ray.trained.inference import transcript
from agentrl_ray.types import TrajectoryGroup

ROOT = Path(__file__).resolve().parents[2]


def add(a: int, b: int = 1) -> int:
    """Add two integers.

    Args:
        a: The first one.
        b: The second one.
    """
    return a + b


def test_object_spec_prefers_import_paths_and_ships_the_rest_by_value():
    assert object_spec(add, "tool") == f"{__name__}:add"
    assert object_spec(CalculatorEnv, "environment") == "agentrl_ray.envs.builtin.calculator:CalculatorEnv"

    def local(x: str) -> str:
        """Echo."""
        return x * 2

    spec = object_spec(local, "tool")
    assert spec.startswith(BY_VALUE)
    assert import_object(spec, "tool")("ab") == "abab"
    with pytest.raises(ValueError, match="tool given by value cannot be unpickled"):
        import_object(BY_VALUE + base64.b64encode(b"junk").decode(), "tool")


def test_functions_become_tools_alone_or_beside_an_environment():
    only = env_class("", (f"{__name__}:add",))
    (schema,) = tool_schemas(only)
    assert schema["function"]["name"] == "add"
    assert schema["function"]["parameters"]["required"] == ["a"]
    both = env_class("agentrl_ray.envs.builtin.calculator:CalculatorEnv", (f"{__name__}:add",))
    assert [t["function"]["name"] for t in tool_schemas(both)] == ["add", "calculator"]

    async def call():
        host = EnvHost()
        await host.create("k", "", {}, {}, (f"{__name__}:add",))
        return await host.call_tools("k", [ToolCall("add", {"a": "2", "b": 5})], [])

    assert asyncio.run(call())[0].text == "7"
    with pytest.raises(ValueError, match="the name is taken"):
        env_class("agentrl_ray.envs.builtin.calculator:CalculatorEnv", (f"{__name__}:calculator_clash",))


def calculator_clash():
    """Same name as the env's tool once renamed."""


calculator_clash.__name__ = "calculator"


def test_api_builds_the_cli_config_with_a_function_in_place_of_the_env(tmp_path):
    def calculator(expression: str) -> str:
        """Evaluate an arithmetic expression and return the result.

        Supports + - * / // % ** (exponent at most 100), parentheses, unary minus, integers and decimals.

        Args:
            expression: The expression to evaluate, e.g. "(347 * 29) - 12.5".
        """
        return expression

    yaml_path = ROOT / "examples" / "calculator" / "config.yaml"
    common = [f"run.output_dir={tmp_path}", "run.steps=3"]
    api = build_config("builtin:tiny", tools=[calculator], rewards=["answer_match"], config=yaml_path, overrides=common)
    cli = load_config(yaml_path, common)
    api_dict, cli_dict = api.to_dict(), cli.to_dict()
    assert api_dict.pop("env")["tools"][0].startswith(BY_VALUE)
    cli_dict.pop("env")
    assert api_dict == cli_dict
    # Same schema as the environment's method: the model sees the same prompt.
    assert tool_schemas(env_class(api.env.name, tuple(api.env.tools))) == tool_schemas(CalculatorEnv)


def test_api_rows_system_prompt_sections_and_errors(tmp_path):
    rows = [{"prompt": "What is 2 + 2?", "answer": "4"}]
    cfg = build_config(
        data=rows, system_prompt="Be brief.", run={"output_dir": str(tmp_path), "name": "r"}, learner={"lr": 1e-5}
    )
    assert cfg.rollout.system_prompt == "Be brief." and cfg.learner.lr == 1e-5
    assert Path(cfg.data.train).read_text().strip() == '{"prompt": "What is 2 + 2?", "answer": "4"}'
    assert cfg.data.eval == cfg.data.train.replace("train.jsonl", "eval.jsonl")
    with pytest.raises(ConfigError, match="unknown config key"):
        build_config(run={"stepz": 3})
    with pytest.raises(ConfigError, match="env.name"):
        load_config(None, ["env.name="])


def test_api_takes_an_agent_program_by_path_or_by_value():
    from examples.openai_agent.agent import run as importable

    async def local(client, row):  # a closure: no import path, shipped by value
        return 1.0

    assert build_config(agent=importable).env.agent == "examples.openai_agent.agent:run"
    spec = build_config(agent=local).env.agent
    assert spec.startswith("pickled:") and import_object(spec, "env.agent").__name__ == "local"


def test_system_prompt_leads_unless_the_row_has_one():
    assert prompt_messages("hi", "S") == [{"role": "system", "content": "S"}, {"role": "user", "content": "hi"}]
    own = [{"role": "system", "content": "mine"}, {"role": "user", "content": "hi"}]
    assert prompt_messages(own, "S") == own
    assert prompt_messages("hi") == [{"role": "user", "content": "hi"}]


def test_pass_at_k_matches_the_definition():
    assert pass_at_k(4, 0, 1) == 0.0 and pass_at_k(4, 4, 2) == 1.0
    assert pass_at_k(4, 1, 1) == pytest.approx(0.25)
    assert pass_at_k(4, 1, 2) == pytest.approx(1 - math.comb(3, 2) / math.comb(4, 2))  # 0.5
    lo, hi = bootstrap_interval([0.0, 1.0] * 10)
    assert lo < 0.5 < hi and 0.0 <= lo and hi <= 1.0
    assert bootstrap_interval([1.0] * 5) == (1.0, 1.0)


def _traj(pid, i, reward, messages, calls=0, errors=0):
    return trajectory(pid, i, reward, num_tool_calls=calls, num_tool_errors=errors, completion_messages=messages)


def test_summarize_and_openai_transcripts():
    call = '<tool_call>\n{"name": "calculator", "arguments": {"expression": "2+2"}}\n</tool_call>'
    first = assistant_message(call, parse_tool_calls(call), 0)
    talk = [first, *tool_messages(first, ["4"]), {"role": "assistant", "content": "The answer is 4."}]
    groups = [
        TrajectoryGroup("a", [_traj("a", 0, 1.0, talk, 1), _traj("a", 1, 0.0, talk[-1:])]),
        TrajectoryGroup("b", [_traj("b", 0, 0.0, talk, 2, 1), _traj("b", 1, 0.0, talk[-1:])]),
    ]
    report = summarize(groups, 1.0)
    assert report["success"] == report["pass@1"] == 0.25
    assert report["pass@2"] == 0.5
    assert report["tool_error_rate"] == pytest.approx(1 / 3)
    assert report["turns_per_sample"] == 1.5
    msgs = to_openai(talk)
    assert msgs[0]["content"] == "" and msgs[0]["tool_calls"][0]["function"] == {
        "name": "calculator",
        "arguments": '{"expression": "2+2"}',
    }
    assert msgs[1] == {
        "role": "tool",
        "content": "4",
        "name": "calculator",
        "tool_call_id": msgs[0]["tool_calls"][0]["id"],
    }
    assert msgs[2] == {"role": "assistant", "content": "The answer is 4."}
    cfg = load_config(None, ["rollout.system_prompt=Be brief."])
    record = transcript({"id": "a", "prompt": "What is 2+2?", "answer": "4"}, groups[0].trajectories[0], cfg)
    assert record["answer"] == "4" and record["success"] and record["tool_calls"] == 1
    assert [m["role"] for m in record["messages"]] == ["system", "user", "assistant", "tool", "assistant"]


def test_ollama_template_lists_the_trained_tools_and_the_call_format():
    from transformers import AutoTokenizer

    from agentrl_ray.builtin.model import ensure_builtin_model
    from agentrl_ray.trained.gguf_convert import modelfile, ollama_template, tools_block

    tokenizer = AutoTokenizer.from_pretrained(ensure_builtin_model())
    block = tools_block(tokenizer, tool_schemas(CalculatorEnv))
    assert block.startswith("# Tools\ncalculator(expression: string): Evaluate an arithmetic expression")
    template = ollama_template(block)
    assert block in template and "range $j, $c := $m.ToolCalls" in template
    # Every action opened is closed (a cheap well-formedness check; no Go toolchain here to render it).
    opened = len(re.findall(r"{{-? ?(if|range)\b", template))
    assert opened == len(re.findall(r"{{-? ?end ?}}", template))
    text = modelfile("m.gguf", template, system="Be brief.", temperature=1.0, num_ctx=320, num_predict=48)
    assert text.startswith("FROM ./m.gguf\n") and 'SYSTEM "Be brief."' in text and "PARAMETER num_ctx 320" in text


def test_python_api_page_shows_the_example_verbatim():
    """docs/python_api.md shows examples/python_api/train.py whole (the README an excerpt of it: test_readme.py)."""
    example = (ROOT / "examples" / "python_api" / "train.py").read_text()
    code = example.split('"""', 2)[2].strip()  # the script without its docstring
    assert code in (ROOT / "docs" / "python_api.md").read_text()
