"""Bad input fails before step 1 (agentrl_ray/preflight.py): each case gets a message naming its row, column or key.

No Ray: the checks run in the driver's process before Ray starts. Uses the built-in tiny model's tokenizer.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from agentrl_ray.config import ConfigError
from agentrl_ray.data import load_rows
from agentrl_ray.infra.profiles import load_config
from agentrl_ray.run import preflight


class NeedsTarget:
    """An environment whose reset needs a `target` column and whose constructor takes `level`."""

    closed = 0

    def __init__(self, level: int = 1):
        if level < 0:
            raise ValueError("level must be >= 0")
        self.level = level

    def reset(self, target: int, **row: Any) -> str:
        return f" Reach {target}."

    def close(self) -> None:
        NeedsTarget.closed += 1

    def add(self, a: int, b: int) -> str:
        """Add two numbers.

        Args:
            a: first
            b: second
        """
        return str(a + b)


class LongReset(NeedsTarget):
    def reset(self, target: int, **row: Any) -> str:
        return " filler" * 400


def needs_difficulty(completions: list, difficulty: list, **kwargs: Any) -> list[float]:
    return [0.0] * len(completions)


def rows(n: int = 40, **extra: Any) -> list[dict[str, Any]]:
    return [{"prompt": f"What is {i} + 1?", "answer": str(i + 1), "id": str(i), "target": i, **extra} for i in range(n)]


def config(*overrides: str):
    env = f"env.name={__name__}:NeedsTarget"
    return load_config(overrides=[env, "rollout.max_total_tokens=512", *overrides])


def test_good_input_passes(builtin_model_path):
    NeedsTarget.closed = 0
    preflight.check(config(), builtin_model_path, rows(), rows(10))
    assert NeedsTarget.closed == preflight.SAMPLE_ROWS + 10  # every environment it made was closed


def test_empty_dataset_is_named(builtin_model_path, tmp_path):
    empty = tmp_path / "empty.jsonl"
    empty.write_text("\n")
    cfg = config(f"data.train={empty}")
    train = load_rows(cfg.data.train, cfg.data, split="train", size=cfg.data.train_size)
    with pytest.raises(ConfigError, match=r"data.train '.*empty.jsonl' has no rows"):
        preflight.check(cfg, builtin_model_path, train, rows())
    with pytest.raises(ConfigError, match=r"data.eval .* has no rows"):
        preflight.check(config(), builtin_model_path, rows(), [])


def test_prompt_over_the_token_budget_names_the_row(builtin_model_path):
    data = rows()
    data[23]["prompt"] = "one two three " * 200
    with pytest.raises(ConfigError, match=r"data.train .* row 23 \(id '23'\): the prompt is \d+ tokens .*max_total"):
        preflight.check(config(), builtin_model_path, data, rows(10))


def test_reset_text_and_tool_schemas_count_towards_the_prompt(builtin_model_path):
    # Every prompt is short, but what reset appends (on sampled rows) pushes row 0 over the budget.
    with pytest.raises(ConfigError, match=r"row 0 .* the prompt is \d+ tokens with the chat template and 1 tool"):
        preflight.check(config(f"env.name={__name__}:LongReset"), builtin_model_path, rows(), rows(10))


def test_a_column_reset_needs_names_the_row_and_the_exception(builtin_model_path):
    data = rows()
    del data[39]["target"]  # the last row is always sampled
    with pytest.raises(
        ConfigError, match=r"row 39 \(id '39'\): NeedsTarget.reset\(\*\*row\) raised TypeError: .*target"
    ):
        preflight.check(config(), builtin_model_path, data, rows(10))


def test_env_kwargs_that_do_not_fit_the_constructor(builtin_model_path):
    with pytest.raises(ConfigError, match=r"env.kwargs \['levle'\] do not fit the constructor .*NeedsTarget\(level"):
        preflight.check(config('env.kwargs={"levle": 2}'), builtin_model_path, rows(), rows(10))
    with pytest.raises(ConfigError, match=r"NeedsTarget\(\*\*env.kwargs\) raised ValueError: level must be >= 0"):
        preflight.check(config('env.kwargs={"level": -1}'), builtin_model_path, rows(), rows(10))
    preflight.check(config('env.kwargs={"level": 2}'), builtin_model_path, rows(), rows(10))


def test_reward_function_columns(builtin_model_path):
    cfg = config(f"reward.functions=[answer_match,{__name__}:needs_difficulty]", "reward.weights=[1.0,0.5]")
    with pytest.raises(ConfigError, match=r"'.*needs_difficulty' requires the column 'difficulty', which data.train"):
        preflight.check(cfg, builtin_model_path, rows(), rows(10))
    preflight.check(cfg, builtin_model_path, rows(difficulty=1), rows(10, difficulty=2))
    data = rows()
    del data[5]["answer"]
    with pytest.raises(ConfigError, match=r"'answer_match' requires the column 'answer', which .* row 5 \(id '5'\)"):
        preflight.check(config(), builtin_model_path, data, rows(10))


def test_answer_column_is_gone_with_a_clear_message(tmp_path):
    path = tmp_path / "old.yaml"
    path.write_text(json.dumps({"reward": {"answer_column": "solution"}}))
    with pytest.raises(ConfigError, match=r"reward.answer_column was removed: it was never read.*`answer`"):
        load_config(path)
    with pytest.raises(ConfigError, match="reward.answer_column was removed"):
        load_config(overrides=["reward.answer_column=solution"])


def test_sample_indices_spread_over_the_rows():
    assert preflight.sample_indices(3) == [0, 1, 2]
    picked = preflight.sample_indices(1000, 5)
    assert picked[0] == 0 and picked[-1] == 999 and len(picked) == 5


def add_numbers(a: int, b: int) -> str:
    """Add two numbers.

    Args:
        a: first
        b: second
    """
    return str(a + b)


def test_plain_function_tools_and_the_system_prompt_are_checked_as_the_worker_renders_them(builtin_model_path):
    # The Python API's shape: no environment class, only plain functions as tools (env.name empty).
    tools_only = ["env.name=", f"env.tools=[{__name__}:add_numbers]", "reward.functions=[format]"]
    preflight.check(config(*tools_only), builtin_model_path, rows(), rows(10))
    # The system prompt is part of every rendered prompt: a long one leaves no room to generate.
    long_system = "rollout.system_prompt=" + "be brief " * 300
    with pytest.raises(ConfigError, match=r"row 0 .* the prompt is \d+ tokens with the chat template and 1 tool"):
        preflight.check(config(*tools_only, long_system), builtin_model_path, rows(), rows(10))


def test_a_token_budget_past_the_models_context_is_named_before_any_engine_starts(builtin_model_path, tmp_path):
    context = json.loads((Path(builtin_model_path) / "config.json").read_text())["max_position_embeddings"]
    preflight.check(config(f"rollout.max_total_tokens={context}"), builtin_model_path, rows(), rows(10))  # fits
    message = rf"max_total_tokens={context + 1} is longer than the model's context \({context} tokens, .*or less"
    with pytest.raises(ConfigError, match=message):
        preflight.check(config(f"rollout.max_total_tokens={context + 1}"), builtin_model_path, rows(), rows(10))
    # Scaled positions state no one length: not refused here.
    scaled = {"max_position_embeddings": 256, "rope_scaling": {"rope_type": "yarn", "factor": 4.0}}
    (tmp_path / "config.json").write_text(json.dumps(scaled))
    preflight.check_context(1024, str(tmp_path))
    (tmp_path / "config.json").write_text(json.dumps({"n_positions": 256, "max_position_embeddings": 512}))
    with pytest.raises(ConfigError, match=r"context \(256 tokens"):  # the smallest stated binds
        preflight.check_context(300, str(tmp_path))
