"""Every example folder is complete and consistent: its config parses and names a loadable env and rewards, its
README gives the CPU, GPU and `ray job submit` commands, and its make_data.py writes rows that the data loader accepts,
that the environment's reset() accepts, and whose prompts fit the config's token budget with the built-in model.
(tests/unit/test_config.py parses every shipped YAML too; this adds what only makes sense per example.)"""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

from agentrl_ray.data import load_rows
from agentrl_ray.envs.loading import load_env_class
from agentrl_ray.envs.tools import tool_schemas
from agentrl_ray.infra.profiles import load_config
from agentrl_ray.rewards import load_reward_functions

ROOT = Path(__file__).resolve().parents[2]
EXAMPLES = sorted(p.parent for p in ROOT.glob("examples/*/config.yaml"))
WITH_DATA = [p for p in EXAMPLES if (p / "make_data.py").is_file()]
# An example's other configs (a variant of its task: gsm_symbolic.yaml, bfcl/multi_turn.yaml, grid/delayed.yaml).
VARIANTS = sorted(p for p in ROOT.glob("examples/*/*.yaml") if p.name != "config.yaml")


def _name(path: Path) -> str:
    return path.name


def _make_data(example: Path):
    spec = importlib.util.spec_from_file_location(f"make_data_{example.name}", example / "make_data.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_examples_are_shipped():
    assert {"calculator", "code_exec", "conversation"} <= {p.name for p in EXAMPLES}


@pytest.mark.parametrize("example", EXAMPLES, ids=_name)
def test_config_loads_its_env_and_rewards_and_readme_says_how_to_run(example):
    cfg = load_config(example / "config.yaml", ["profile=cpu"])
    if cfg.env.name or not cfg.env.mcp_servers:
        load_env_class(cfg.env.name)
    else:  # examples/mcp_calculator: the tools are its server's (tests/unit/test_mcp_tools.py starts it)
        assert cfg.env.tool_specs()
    load_reward_functions(cfg.reward.functions)
    readme = (example / "README.md").read_text()
    assert f"agentrl-ray train examples/{example.name}/config.yaml" in readme
    assert "profile=gpu" in readme and "ray job submit" in readme


@pytest.mark.parametrize("config", VARIANTS, ids=lambda p: f"{p.parent.name}/{p.name}")
def test_variant_configs_load_and_their_readme_says_how_to_run(config):
    cfg = load_config(config, ["profile=cpu"])
    load_env_class(cfg.env.name)
    load_reward_functions(cfg.reward.functions)
    command = f"agentrl-ray train examples/{config.parent.name}/{config.name}"
    assert command in config.read_text(), f"{config}'s header does not show how to run it"
    assert config.name in (config.parent / "README.md").read_text()


@pytest.mark.parametrize("example", WITH_DATA, ids=_name)
def test_make_data_rows_load_reset_and_fit(example, tmp_path, builtin_model_path):
    from transformers import AutoTokenizer

    cfg = load_config(example / "config.yaml", ["profile=cpu"])
    module = _make_data(example)
    paths = module.write(tmp_path)
    # The config reads what make_data.py writes by default (paths relative to the repository root).
    assert ROOT / cfg.data.train == module.OUT / paths["train"].name
    assert ROOT / cfg.data.eval == module.OUT / paths["eval"].name
    train = load_rows(str(paths["train"]), cfg.data, split="train", size=cfg.data.train_size)
    evals = load_rows(str(paths["eval"]), cfg.data, split="eval", size=cfg.data.eval_size)
    assert train and evals
    ids = [r["id"] for r in train + evals]
    assert len(set(ids)) == len(ids)
    # Steps draw prompts_per_step consecutive rows of an epoch's shuffle; when that divides the data no step draws a
    # row twice (two trajectories of one step would then share an environment key).
    assert len(train) % cfg.rollout.prompts_per_step == 0

    env_class = load_env_class(cfg.env.name)
    tokenizer = AutoTokenizer.from_pretrained(builtin_model_path)
    tools = tool_schemas(env_class)
    for row in train + evals:
        extra = env_class(**cfg.env.kwargs).reset(**row) or ""
        prompt = row["prompt"]
        messages = [{"role": "user", "content": prompt}] if isinstance(prompt, str) else [dict(m) for m in prompt]
        messages[-1]["content"] += extra
        ids = tokenizer.apply_chat_template(messages, tools=tools, add_generation_prompt=True, return_dict=False)
        # The rollout worker refuses a prompt without room for a turn; leave room for a whole one.
        assert len(ids) + cfg.rollout.max_tokens_per_turn <= cfg.rollout.max_total_tokens, row["id"]


def test_code_exec_reference_solutions_pass_their_tests_and_stubs_do_not():
    module = _make_data(ROOT / "examples" / "code_exec")
    rows = {r["entry_point"]: r for r in module.make_rows()}
    assert len(rows) == len(module.PROBLEMS) == 30
    for name, _, solution, tests in module.PROBLEMS:
        hidden = rows[name]["tests"]
        assert hidden == "\n".join(tests) and solution not in rows[name]["prompt"][0]["content"]
        exec(f"{solution}\n{hidden}", {})  # our own trusted code: no sandbox needed
        with pytest.raises(AssertionError):
            exec(f"def {name}(*args):\n    return None\n{hidden}", {})
