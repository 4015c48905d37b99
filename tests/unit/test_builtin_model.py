"""The built-in model and task: built once into a temporary cache (the slow part, ~2 min on 2 cores), then checked
the way the rest of the system uses it — loadable by transformers, prompt ids from the chat template, tool results
encoded as separate segments giving the same ids as the whole rendered conversation, and a warm start that calls
the calculator sometimes (not never, not always) and copies correctly when it does.

vLLM loading and the sampled success under vLLM are measured by benchmarks/builtin_model_quality.py and exercised
by the tests in tests/ray, which roll out this model.
"""

from __future__ import annotations

import json
import re
import threading
import time
from pathlib import Path

import pytest
import torch

from agentrl_ray.builtin import model as builtin_model
from agentrl_ray.builtin import recipe as recipes
from agentrl_ray.builtin.model import calculator_tools, ensure_builtin_model
from agentrl_ray.chat_format import encode_segments, extract_final_answer, parse_tool_calls, tool_response_segments
from agentrl_ray.envs.builtin.calculator import CalculatorEnv
from agentrl_ray.tasks.arithmetic import make_arithmetic_rows
from agentrl_ray.types import TokenRole

TOOLS = calculator_tools()
QUESTION = [{"role": "user", "content": "What is 347 * 29?"}]


def _call(expression: str) -> dict:
    return {"type": "function", "function": {"name": "calculator", "arguments": {"expression": expression}}}


@pytest.fixture(scope="module")
def built(builtin_model_path):
    """The session's model (built from scratch on a clean checkout, as in CI): one build per test run."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    start = time.perf_counter()
    path = ensure_builtin_model(Path(builtin_model_path).parent.parent)
    build_s = time.perf_counter() - start
    tokenizer = AutoTokenizer.from_pretrained(path)
    model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()
    return path, tokenizer, model, build_s


# ---------------------------------------------------------------------------------------------------- task


def test_arithmetic_rows_are_deterministic_correct_and_splits_disjoint():
    train = make_arithmetic_rows(2000, 0, "train")
    evals = make_arithmetic_rows(300, 0, "eval")
    assert make_arithmetic_rows(300, 0, "eval") == evals
    assert make_arithmetic_rows(300, 1, "eval") != evals
    questions = lambda rows: {r["prompt"][0]["content"] for r in rows}  # noqa: E731
    assert not questions(train) & questions(evals) & questions(make_arithmetic_rows(300, 1, "eval"))
    assert not questions(train) & questions(make_arithmetic_rows(300, 1, "eval"))
    assert len({r["id"] for r in train}) == len(train)
    for row in train[:200] + evals[:200]:
        a, op, b = re.fullmatch(r"What is (\d+) ([-+*]) (\d+)\?", row["prompt"][0]["content"]).groups()
        assert 10 <= int(a) <= 999 and 10 <= int(b) <= 999
        assert row["answer"] == CalculatorEnv().calculator(f"{a} {op} {b}")
        assert int(row["answer"]) >= 0
    with pytest.raises(ValueError, match="split"):
        make_arithmetic_rows(3, 0, "test")


# ---------------------------------------------------------------------------------------------------- cache


def test_build_is_cached_and_loadable(built):
    path, tokenizer, model, build_s = built
    print(f"built-in model built in {build_s:.0f} s")
    for name in ("config.json", "model.safetensors", "tokenizer.json", "generation_config.json"):
        assert (path / name).is_file(), name
    start = time.perf_counter()
    assert ensure_builtin_model(path.parent.parent) == path
    assert time.perf_counter() - start < 5  # no rebuild
    config = json.loads((path / "config.json").read_text())
    assert config["model_type"] == "qwen2" and config["tie_word_embeddings"]
    assert model.get_output_embeddings().weight.shape[0] == len(tokenizer)
    assert tokenizer.eos_token == "<|im_end|>" and tokenizer.pad_token == "<|endoftext|>"
    assert model.generation_config.eos_token_id == tokenizer.eos_token_id
    for special in recipes.SPECIAL_TOKENS:
        assert tokenizer.encode(special, add_special_tokens=False) == [tokenizer.convert_tokens_to_ids(special)]


def test_concurrent_callers_build_once(tmp_path, monkeypatch):
    calls = []

    def fake_build(out_dir, recipe, tools):
        calls.append(out_dir)
        time.sleep(0.5)
        (out_dir / "config.json").write_text("{}")

    monkeypatch.setattr(builtin_model, "build", fake_build)
    results = []
    threads = [threading.Thread(target=lambda: results.append(ensure_builtin_model(tmp_path))) for _ in range(3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(calls) == 1 and len(set(results)) == 1
    assert (results[0] / "config.json").is_file()
    assert [p.name for p in (tmp_path / "models").iterdir() if not p.name.endswith(".lock")] == [results[0].name]
    ensure_builtin_model(tmp_path, force=True)
    assert len(calls) == 2


# ---------------------------------------------------------------------------------------------------- chat format


def test_template_renders_the_hermes_layout(built):
    _, tokenizer, _, _ = built
    messages = [
        {"role": "system", "content": "Be brief."},
        *QUESTION,
        {"role": "assistant", "content": "Let me compute.", "tool_calls": [_call("347 * 29"), _call("1 + 1")]},
        {"role": "tool", "content": "10063"},
        {"role": "tool", "content": "2"},
        {"role": "assistant", "content": "The answer is 10063."},
    ]
    text = tokenizer.apply_chat_template(messages, tools=TOOLS, tokenize=False)
    assert text == (
        "<|im_start|>system\nBe brief.\n# Tools\n"
        "calculator(expression: string): Evaluate an arithmetic expression and return the result.\n"
        'Call one as <tool_call>\n{"name": ..., "arguments": {...}}\n</tool_call><|im_end|>\n'
        "<|im_start|>user\nWhat is 347 * 29?<|im_end|>\n"
        "<|im_start|>assistant\nLet me compute.\n"
        '<tool_call>\n{"name": "calculator", "arguments": {"expression": "347 * 29"}}\n</tool_call>\n'
        '<tool_call>\n{"name": "calculator", "arguments": {"expression": "1 + 1"}}\n</tool_call><|im_end|>\n'
        "<|im_start|>user\n<tool_response>\n10063\n</tool_response>\n<tool_response>\n2\n</tool_response><|im_end|>\n"
        "<|im_start|>assistant\nThe answer is 10063.<|im_end|>\n"
    )
    # No tools and no system message: no system turn at all.
    plain = tokenizer.apply_chat_template(QUESTION, tokenize=False, add_generation_prompt=True)
    assert plain == "<|im_start|>user\nWhat is 347 * 29?<|im_end|>\n<|im_start|>assistant\n"
    # The tool-call block parses back with the rollout parser.
    call_turn = text.split("<|im_start|>assistant\n")[1].split("<|im_end|>")[0]
    assert [c.arguments for c in parse_tool_calls(call_turn).calls] == [
        {"expression": "347 * 29"},
        {"expression": "1 + 1"},
    ]
    # Assistant masks cover exactly what the model generates, <|im_end|> included.
    out = tokenizer.apply_chat_template(messages, tools=TOOLS, return_dict=True, return_assistant_tokens_mask=True)
    generated = [t for t, m in zip(out["input_ids"], out["assistant_masks"]) if m]
    assert tokenizer.decode(generated).count("<|im_end|>") == 2


def test_trl_accepts_the_template(built):
    from trl.chat_template_utils import supports_tool_calling

    assert supports_tool_calling(built[1])


def test_prompt_ids_are_the_rendered_text_and_short(built):
    _, tokenizer, _, _ = built
    for row in make_arithmetic_rows(20, 0, "eval"):
        ids = tokenizer.apply_chat_template(row["prompt"], tools=TOOLS, add_generation_prompt=True, return_dict=False)
        text = tokenizer.apply_chat_template(row["prompt"], tools=TOOLS, add_generation_prompt=True, tokenize=False)
        assert list(ids) == tokenizer.encode(text, add_special_tokens=False)
        assert len(ids) <= 80


@pytest.mark.parametrize(
    "results",
    [
        ["10063"],
        ["-318"],
        ["12.5", "7"],
        ["Error: invalid expression '3 +': invalid syntax"],
        ["Error: unsupported operator BitXor: use ** for powers, ^ is not supported."],
        ["two\nlines", "  leading spaces", "trailing spaces  ", "ends with a newline\n", "\n\nstarts with two"],
        ["", "1,234,567", "ünïcode ✓ 🙂", "tabs\tand\r\nCRLF", '}}\n"quoted"'],
    ],
)
def test_tool_result_segments_encode_like_the_whole_conversation(built, results):
    """Rollouts never re-tokenize: prompt ids + sampled ids + separately encoded segments must equal the ids of the
    whole conversation rendered by the template, whatever text the tools return."""
    _, tokenizer, _, _ = built
    calls = [_call(f"{i} + {i}") for i in range(len(results))]
    messages = [
        *QUESTION,
        {"role": "assistant", "content": "", "tool_calls": calls},
        *({"role": "tool", "content": r} for r in results),
        {"role": "assistant", "content": "The answer is 10063."},
    ]
    prompt = tokenizer.apply_chat_template(QUESTION, tools=TOOLS, add_generation_prompt=True, return_dict=False)
    call_text = "\n".join(builtin_model.tool_call_text(c["function"]["arguments"]["expression"]) for c in calls)
    sampled = tokenizer.encode(call_text + "<|im_end|>", add_special_tokens=False)
    segments, roles = encode_segments(tokenizer, tool_response_segments(results))
    final = tokenizer.encode("The answer is 10063.<|im_end|>", add_special_tokens=False)
    pieces = list(prompt) + sampled + segments + final
    whole = tokenizer.apply_chat_template(messages, tools=TOOLS, return_dict=False)
    assert pieces + tokenizer.encode("\n", add_special_tokens=False) == list(whole)
    env_text = tokenizer.decode([t for t, r in zip(segments, roles) if r == TokenRole.ENV])
    assert env_text == "".join(results)


# ---------------------------------------------------------------------------------------------------- warm start


def _generate(model, tokenizer, seqs: list[list[int]], *, sample: bool, seed: int) -> list[list[int]]:
    """One turn per sequence (left-padded batch), cut after <|im_end|>."""
    torch.manual_seed(seed)
    width = max(map(len, seqs))
    pad = tokenizer.pad_token_id
    input_ids = torch.tensor([[pad] * (width - len(s)) + s for s in seqs])  # (B, T)
    attention = torch.tensor([[0] * (width - len(s)) + [1] * len(s) for s in seqs])  # (B, T)
    kwargs = {"do_sample": True, "temperature": 1.0, "top_k": 0, "top_p": 1.0} if sample else {"do_sample": False}
    with torch.no_grad():
        out = model.generate(
            input_ids=input_ids,
            attention_mask=attention,
            max_new_tokens=48,
            eos_token_id=tokenizer.eos_token_id,
            pad_token_id=pad,
            **kwargs,
        )
    turns = []
    for row in out[:, width:].tolist():
        turns.append(row[: row.index(tokenizer.eos_token_id) + 1] if tokenizer.eos_token_id in row else row)
    return turns


def test_warm_start_sometimes_calls_the_tool_and_copies_when_it_does(built):
    _, tokenizer, model, _ = built
    rows = make_arithmetic_rows(60, 0, "eval")
    prompts = [
        list(tokenizer.apply_chat_template(r["prompt"], tools=TOOLS, add_generation_prompt=True, return_dict=False))
        for r in rows
    ]
    # Sampled at temperature 1 (as RL samples): the tool is called in roughly 1 of 4 trajectories.
    first = _generate(model, tokenizer, prompts, sample=True, seed=0)
    called = [bool(parse_tool_calls(tokenizer.decode(t)).calls) for t in first]
    assert 0.08 <= sum(called) / len(rows) <= 0.5, sum(called)
    # Once it opens a tool call, it copies the question into it and the result into its answer.
    tool_call = tokenizer.convert_tokens_to_ids("<tool_call>")
    forced = [p + [tool_call] for p in prompts]
    turns = [[tool_call] + t for t in _generate(model, tokenizer, forced, sample=False, seed=0)]
    env = CalculatorEnv()
    second, expected = [], []
    for row, prompt, turn in zip(rows, prompts, turns):
        calls = parse_tool_calls(tokenizer.decode(turn, skip_special_tokens=False)).calls
        if len(calls) == 1 and calls[0].name == "calculator":
            try:
                result = env.calculator(**calls[0].arguments)
            except ValueError:  # a miscopied expression ("92 + 04"): in a rollout an error observation; here wrong
                continue
            second.append(prompt + turn + encode_segments(tokenizer, tool_response_segments([result]))[0])
            expected.append(row["answer"])
    answers = [
        extract_final_answer(tokenizer.decode(t)) for t in _generate(model, tokenizer, second, sample=False, seed=0)
    ]
    correct = sum(a == e for a, e in zip(answers, expected))
    assert correct >= 0.8 * len(rows), (correct, len(second))


def test_config_knows_every_builtin_size():
    from agentrl_ray.config import BUILTIN_MODELS

    assert set(BUILTIN_MODELS) == set(recipes.RECIPES)
    with pytest.raises(ValueError, match="unknown built-in model size 'huge'"):
        builtin_model.ensure_builtin_model(size="huge")
