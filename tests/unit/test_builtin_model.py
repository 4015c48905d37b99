"""The built-in model and task: the model the package ships (built once by its recipe, package data), checked the way
the rest of the system uses it — the recipe it names is the recipe in the code, loadable by transformers, prompt ids
from the chat template, tool results encoded as separate segments giving the same ids as the whole rendered
conversation, and a warm start that calls the calculator sometimes (not never, not always) and copies correctly when
it does. One test (marker `rebuild`, `make test-rebuild`; not in `make test`, whose 30-minute budget it would take a
third of) rebuilds it from its recipe (~10 min on 2 cores) and checks the rebuild's warm start the same way: the
recipe still makes a model as good as the one shipped. A recipe changed without re-shipping fails
`make test` at once (the shipped folder must be the code's recipe).

vLLM loading and the sampled success under vLLM are measured by `benchmarks/run.py real_model --mode
builtin_model_quality` and exercised by the tests in tests/ray, which roll out this model.
"""

from __future__ import annotations

import dataclasses
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


def _load(path: Path):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    return AutoTokenizer.from_pretrained(path), AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()


@pytest.fixture(scope="module")
def built(builtin_model_path):
    """The session's model: the shipped one (or, with a recipe changed since it was shipped, one built now)."""
    start = time.perf_counter()
    path = Path(builtin_model_path)
    tokenizer, model = _load(path)
    return path, tokenizer, model, time.perf_counter() - start


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


def test_shipped_model_is_the_recipe_in_the_code():
    """Every shipped folder is named by a recipe of the code, holds that recipe (recipe.json), and its config and
    tokenizer have that recipe's shape; the default model is shipped. A changed recipe names another folder: then
    this fails until the model is rebuilt and shipped again (docs/training.md, "The built-in models")."""
    shipped = sorted(p.name for p in builtin_model.SHIPPED.iterdir() if p.is_dir())
    names = {builtin_model.folder_name(size): size for size in recipes.RECIPES}
    assert builtin_model.folder_name("tiny") in shipped
    for folder in shipped:
        assert folder in names, f"{folder} is shipped but no recipe of the code names it (rebuild and ship it)"
        recipe = recipes.RECIPES[names[folder]]
        path = builtin_model.SHIPPED / folder
        provenance = json.loads((path / "recipe.json").read_text())
        fields = dataclasses.asdict(recipe)
        # Fields added to Recipe after the build stay out of its hash at their defaults (recipe_hash), so the
        # shipped folder is still this recipe's: its recipe.json just does not list them.
        later = {k for k in fields if k not in provenance["recipe"]}
        defaults = {f.name: f.default for f in dataclasses.fields(recipes.Recipe)}
        assert all(fields[k] == defaults[k] for k in later), later
        assert provenance["recipe"] == {k: v for k, v in fields.items() if k not in later}
        assert folder.endswith(provenance["recipe_hash"])
        config = json.loads((path / "config.json").read_text())
        shape = {
            "hidden_size": recipe.hidden_size,
            "intermediate_size": recipe.intermediate_size,
            "num_hidden_layers": recipe.num_layers,
            "num_attention_heads": recipe.num_heads,
            "num_key_value_heads": recipe.num_kv_heads,
            "max_position_embeddings": recipe.max_positions,
            "tie_word_embeddings": True,
        }
        assert {k: config[k] for k in shape} == shape
        tokenizer = json.loads((path / "tokenizer.json").read_text())
        assert config["vocab_size"] == len(tokenizer["model"]["vocab"]) <= recipe.vocab_size
        assert [t["content"] for t in tokenizer["added_tokens"]] == recipes.SPECIAL_TOKENS
        assert (path / "chat_template.jinja").read_text() == recipes.CHAT_TEMPLATE


def test_shipped_model_is_used_without_a_build(tmp_path, monkeypatch):
    def no_build(*args, **kwargs):
        raise AssertionError("the shipped model should have been used")

    monkeypatch.setattr(builtin_model, "build", no_build)
    path = ensure_builtin_model(tmp_path)
    assert path == builtin_model.SHIPPED / builtin_model.folder_name("tiny")
    assert not (tmp_path / "models").exists()


def test_build_is_cached_and_loadable(built):
    path, tokenizer, model, load_s = built
    print(f"built-in model {path.name} loaded in {load_s:.1f} s")
    for name in ("config.json", "model.safetensors", "tokenizer.json", "generation_config.json", "recipe.json"):
        assert (path / name).is_file(), name
    start = time.perf_counter()
    assert ensure_builtin_model() == path
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
    build_one = lambda: results.append(ensure_builtin_model(tmp_path, shipped=False))  # noqa: E731
    threads = [threading.Thread(target=build_one) for _ in range(3)]
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
    called, correct = _warm_start(tokenizer, model)
    assert 0.08 <= called <= 0.5, called
    assert correct >= COPY_GATE, correct


@pytest.mark.rebuild
def test_the_recipe_rebuilds_a_model_as_good_as_the_shipped_one(tmp_path):
    """The shipped weights are one build of the recipe; a build on this machine (another CPU rounds differently)
    must pass the same warm-start gate."""
    start = time.perf_counter()
    path = ensure_builtin_model(tmp_path, shipped=False)
    print(f"built-in model rebuilt in {time.perf_counter() - start:.0f} s")
    assert path.name == builtin_model.folder_name("tiny") and path.parent == tmp_path / "models"
    called, correct = _warm_start(*_load(path))
    print(f"rebuilt: tool called in {called:.2f} of sampled first turns, forced calls right {correct:.3f}")
    assert 0.08 <= called <= 0.5, called
    assert correct >= COPY_GATE, correct


# Greedy answers right after a forced tool call, over 200 held-out questions (the default run's): what greedy
# held-out success can reach once RL has made the model call the tool (docs/default_run.md, "Where the errors are").
# The shipped model: 0.985 (and the tool called in 0.29 of sampled first turns) on a 2-core AMD EPYC; 0.95 is
# the default run's target.
COPY_GATE = 0.95


def _warm_start(tokenizer, model) -> tuple[float, float]:
    """(share of held-out questions whose sampled first turn calls the tool, share answered right when the first turn
    is forced to open a tool call and everything after is greedy)."""
    rows = make_arithmetic_rows(200, 0, "eval")
    prompts = [
        list(tokenizer.apply_chat_template(r["prompt"], tools=TOOLS, add_generation_prompt=True, return_dict=False))
        for r in rows
    ]
    # Sampled at temperature 1 (as RL samples): the tool is called in roughly 1 of 4 trajectories.
    first = _generate(model, tokenizer, prompts, sample=True, seed=0)
    called = [bool(parse_tool_calls(tokenizer.decode(t)).calls) for t in first]
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
    return sum(called) / len(rows), correct / len(rows)


def test_config_knows_every_builtin_size():
    from agentrl_ray.config import BUILTIN_MODELS

    assert set(BUILTIN_MODELS) == set(recipes.RECIPES)
    with pytest.raises(ValueError, match="unknown built-in model size 'huge'"):
        builtin_model.ensure_builtin_model(size="huge")
