"""A turn-based environment trains end to end: the conversation example (ScriptedUserEnv), its own data builder and
config, two tiny steps through `driver.train` (what `agentrl-ray train` runs): vLLM rollouts whose assistant turns go
to the environment's `step` and whose observations come back as user turns, then learner steps and weight sync."""

import importlib.util
import json
from pathlib import Path

import pytest

from agentrl_ray.driver import train
from agentrl_ray.infra.profiles import load_config

pytestmark = pytest.mark.long
EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "conversation"


def _write_data(out_dir: Path) -> dict[str, Path]:
    spec = importlib.util.spec_from_file_location("conversation_make_data", EXAMPLE / "make_data.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.write(out_dir)


def _arithmetic_conversations(path: Path, n: int) -> Path:
    """Rows in the example's format whose messages are the built-in model's own arithmetic questions. That model was
    warmed up on calculator dialogues only: on the example's running-total wording it never ends a turn (every
    sampled turn runs to max_tokens_per_turn, so no turn reaches `step`), on these it does."""
    from agentrl_ray.tasks.arithmetic import evaluate, question, sample_problems

    problems = sample_problems(2 * n, seed=0, split="train")
    rows = []
    for (a, op, b), (c, op2, d) in zip(problems[::2], problems[1::2]):
        rows.append(
            {
                "prompt": question(a, op, b),
                "expected": [str(evaluate(a, op, b)), str(evaluate(c, op2, d))],
                "user_turns": [question(c, op2, d)],
            }
        )
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def test_conversation_example_trains_two_steps(local_ray, builtin_model_path, tmp_path):
    data = _write_data(tmp_path / "data")  # the example's builder; its eval rows are used as they are
    data["train"] = _arithmetic_conversations(tmp_path / "data" / "arithmetic_train.jsonl", 8)
    overrides = [
        "profile=cpu",
        f"data.train={data['train']}",
        f"data.eval={data['eval']}",
        "data.train_size=8",
        "data.eval_size=4",
        "rollout.prompts_per_step=2",
        "rollout.group_size=2",
        "run.steps=2",
        "run.eval_samples=1",
        "run.eval_at_start=false",
        "run.eval_every=0",
        "run.checkpoint_every=0",
        "run.plot=false",
        f"run.output_dir={tmp_path / 'runs'}",
        "run.name=conversation",
    ]
    metrics = train(load_config(EXAMPLE / "config.yaml", overrides))
    assert metrics["samples"] == 2 * 2 * 2
    assert "eval/success" in metrics
    records = [json.loads(line) for line in (tmp_path / "runs" / "conversation" / "metrics.jsonl").open()]
    assert [r["step"] for r in records] == [1, 2]
    for r in records:
        assert r["rollout/mean_length"] > 0 and r["rollout/sampled_tokens"] > 0
        assert 0.0 <= r["reward/mean"] <= 1.0 and r.get("reward/env_reward/error", 0.0) == 0.0
    # Some assistant turn was handed to the environment's step, and some observation came back as a user turn.
    assert sum(r["rollout/steps_per_traj"] for r in records) > 0
    assert sum(r["rollout/env_tokens"] for r in records) > 0
