"""Supervision on real runs: early stopping ends a run whose held-out success stalls, and a run driven into collapse
by a learning rate far too high gets a red health verdict before its reward falls apart.

The collapse run trains the calculator task overlapped (sync.max_staleness=1, the example's setting): step t trains
on samples of the weights before the previous update, so the learner/rollout KL of step t measures how far that
update moved the policy, one step before samples of the moved policy are scored.
"""

import json

import pytest

from agentrl_ray.driver import train
from agentrl_ray.infra.profiles import load_config

pytestmark = pytest.mark.long

SMALL = [
    "profile=cpu",
    "rollout.prompts_per_step=8",
    "rollout.group_size=8",
    "data.train_size=256",
    "data.eval_size=16",
    "run.eval_samples=2",
    "run.checkpoint_every=0",
    "run.keep_checkpoints=0",
    "run.plot=false",
    "run.eval_at_start=false",
]


def _records(run_dir):
    lines = (run_dir / "metrics.jsonl").read_text().splitlines()
    return [r for r in map(json.loads, lines) if "reward/mean" in r]


def test_early_stopping_ends_a_stalled_run(local_ray, builtin_model_path, tmp_path):
    # lr 1e-9: the policy cannot move, so held-out success only wobbles; no wobble beats the best by 0.5.
    cfg = load_config(
        "examples/calculator/config.yaml",
        SMALL
        + [
            f"run.output_dir={tmp_path}",
            "run.name=stall",
            "run.steps=12",
            "run.eval_every=1",
            "learner.lr=1e-9",
            "run.early_stopping_patience=2",
            "run.early_stopping_min_delta=0.5",
        ],
    )
    train(cfg)
    summary = json.loads((cfg.run_dir / "summary.json").read_text())
    assert summary["stopped_early"] and summary["steps_done"] == 3, summary  # best at 1, no gain at 2 and 3
    assert "eval/success has not improved" in summary["stop_reason"]
    assert summary["checkpoint"].endswith("checkpoint_000003")  # a final checkpoint at the stopping step
    assert [r["step"] for r in _records(cfg.run_dir)] == [1, 2, 3]


def test_collapse_turns_health_red_before_reward_falls_apart(local_ray, builtin_model_path, tmp_path):
    cfg = load_config(
        "examples/calculator/config.yaml",
        SMALL
        + [f"run.output_dir={tmp_path}", "run.name=collapse", "run.steps=6", "run.eval_every=0", "learner.lr=1e-2"],
    )
    train(cfg)
    records = _records(cfg.run_dir)
    start = (records[0]["reward/mean"] + records[1]["reward/mean"]) / 2
    assert start > 0.1  # the built-in model starts with some success
    collapsed = next(r["step"] for r in records if r["reward/mean"] <= 0.25 * start)
    red = next(r["step"] for r in records if r["health/level"] == 2)
    print(f"reward at start {start:.3f}; first red verdict at step {red}; reward collapsed at step {collapsed}")
    for r in records:
        print(r["step"], round(r["reward/mean"], 3), r["health/level"], r["health/reasons"])
    assert red < collapsed
    summary = json.loads((cfg.run_dir / "summary.json").read_text())
    assert summary["first_red_health_step"] == red
