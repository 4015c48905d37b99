"""User code that misbehaves inside a real training run (real Ray, vLLM and Ray Train; the run starts its own Ray
with the test's environment, so that every actor can import the user code under tests/ray).

- A reward function failing on every sample trips `reward.max_failing_steps`: a deliberate stop, which must not be
  retried. Ray Train's FailureConfig restarts the learner from its latest checkpoint after any error of the worker
  group, so before the fix such a run was redone from the checkpoint, rollouts and all, only to stop again. Now the
  learner records the stop with the driver's log actor before raising it (`types.RunStopped`), the retried attempt
  ends at once, and the driver raises the guard's own message. The reward function counts the completions it is
  asked to score: a retry would score a second step.
- A user environment whose tool exits, raises SystemExit or KeyboardInterrupt, hangs, segfaults or returns what
  cannot be printed costs only the trajectory that called it (`env.isolation=auto` runs a user's environment at
  `process`): the run completes every step, on the same env host.
"""

import json
import os
from pathlib import Path

import pytest
import ray
from builders import TINY_RUN

from agentrl_ray.builtin.resolve import resolve_model
from agentrl_ray.driver import train
from agentrl_ray.infra.profiles import load_config
from agentrl_ray.rollout.pool import RolloutPool
from agentrl_ray.types import RunStopped

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture
def own_ray(monkeypatch):
    """No Ray yet: the run starts one that inherits this environment (PYTHONPATH with the repository root)."""
    monkeypatch.delenv("RAY_ADDRESS", raising=False)
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join(p for p in (str(ROOT), os.environ.get("PYTHONPATH")) if p))
    if ray.is_initialized():
        ray.shutdown()
    yield
    ray.shutdown()


def _config(tmp_path, name, extra):
    return load_config(
        None, [*TINY_RUN, "sync.max_staleness=0", *extra, f"run.output_dir={tmp_path}", f"run.name={name}"]
    )


def _steps(cfg):
    return [json.loads(line) for line in (cfg.run_dir / "metrics.jsonl").read_text().splitlines()]


@pytest.mark.long
def test_a_run_stopped_by_a_guard_is_not_retried_from_its_checkpoint(
    builtin_model_path, tmp_path, monkeypatch, own_ray
):
    scored = tmp_path / "scored.txt"
    monkeypatch.setenv("AGENTRL_TEST_SCORED", str(scored))
    extra = [
        "run.steps=3",
        "reward.functions=[tests.ray.failing_reward:always_fails]",
        "reward.max_failing_steps=1",
        "recovery.max_learner_failures=1",  # Ray Train may retry once: the retry must not redo the step
    ]
    cfg = _config(tmp_path, "stopped", extra)
    with pytest.raises(RunStopped) as stopped:
        train(cfg)
    message = str(stopped.value)
    assert "'tests.ray.failing_reward:always_fails'" in message and "reward.max_failing_steps=1" in message
    samples = cfg.rollout.prompts_per_step * cfg.rollout.group_size
    assert sum(int(n) for n in scored.read_text().split()) == samples  # one step scored, never redone
    assert [r["step"] for r in _steps(cfg)] == [1]  # the step that tripped the guard is logged, once


@pytest.mark.long
def test_a_sync_that_skips_one_tensor_stops_a_strict_run_in_the_step_it_shows(
    builtin_model_path, tmp_path, monkeypatch, own_ray
):
    """The integrity probe in a whole run (learner/integrity.py): every vLLM engine loads each update but one
    tensor. The weights pushed after step 1 are probed while step 2 trains; step 2, whose rollouts the stale engine
    sampled, reports it, and under run.strict_integrity the run stops there with one line naming the check (measured:
    a mean gap of 3.4 against the 5e-5 band)."""
    monkeypatch.setenv("AGENTRL_TEST_SKIP_TENSOR", "model.layers.0.self_attn.q_proj.weight")
    extra = [
        "run.steps=4",
        "run.strict_integrity=true",
        "reward.functions=[tests.ray.sync_faults:answer_match_after_a_partial_sync]",
        "recovery.max_learner_failures=1",  # a retry must not redo the stop
    ]
    cfg = _config(tmp_path, "partial_sync", extra)
    with pytest.raises(RunStopped) as stopped:
        train(cfg)
    message = str(stopped.value)
    assert message.startswith("integrity check weights: mean |log-prob gap| "), message
    assert "after the sync of weights 1" in message and message.endswith("(step 2; run.strict_integrity=true)")
    records = _steps(cfg)
    assert [r["step"] for r in records] == [1, 2]  # stopped in the step that showed it, the step logged
    assert "integrity/weights/mean_gap" not in records[0] and records[0]["integrity/failures"] == 0
    assert records[1]["integrity/weights/mean_gap"] > 100 * records[1]["integrity/weights/band"]
    # The engine's sampling log-probs on step 2's trained tokens are off by the same missing tensor, where any was
    # trained (the broken engine's answers may all score 0: no advantage, no trained row).
    if records[1]["integrity/behaviour_logprobs/tokens"]:
        assert "behaviour_logprobs: mean |log-prob gap|" in records[1]["integrity/failed"]
    assert records[1]["health/level"] >= 1 and "integrity weights:" in records[1]["health/reasons"]


@pytest.mark.long
def test_a_hostile_user_environment_costs_only_its_own_trajectories(builtin_model_path, tmp_path, own_ray):
    extra = ["run.steps=3", "env.name=tests.ray.hostile_env:HostileCalculator", "env.tool_timeout_s=2"]
    cfg = _config(tmp_path, "hostile", extra)
    env_vars = {"PYTHONPATH": os.environ["PYTHONPATH"], "TOKENIZERS_PARALLELISM": "false"}
    ray.init(num_cpus=4, include_dashboard=False, runtime_env={"env_vars": env_vars})  # room for the pool and the plan
    pool = RolloutPool.create(cfg, resolve_model(cfg.model.path))
    try:
        host = pool.env_hosts[0]
        pid = ray.get(host.pid.remote())
        train(cfg, pool=pool)
        stats = ray.get(host.stats.remote())
        assert ray.get(host.pid.remote()) == pid  # the same env host served the whole run: never restarted
    finally:
        pool.shutdown()
    records = _steps(cfg)
    assert [r["step"] for r in records] == [1, 2, 3]
    assert (cfg.run_dir / "checkpoint_000003" / "model" / "model.safetensors").exists()
    calls = sum(r["rollout/tool_calls_per_traj"] for r in records)
    errors = [r["rollout/tool_error_rate"] for r in records]
    print(f"hostile env: tool calls per trajectory {calls / 3:.2f}, error rates {errors}, env host {stats}")
    assert calls > 0 and max(errors) > 0  # the model did call the hostile tool, and its misdeeds became errors
    assert stats["children_died"] + stats["children_killed"] > 0  # crashes and hangs, contained per child
    assert stats["open"] == 0 and stats["children_alive"] == 0  # every trajectory's child gone at the end


@pytest.mark.long
def test_tools_from_an_mcp_server_train_as_the_built_in_ones(builtin_model_path, tmp_path, own_ray):
    """examples/mcp_calculator as its header runs it, shortened: every trajectory's calculator is a real MCP server
    (the SDK's MCPServer over stdio, started in the trajectory's env child); the model's calls reach it, its
    answers are the environment tokens, and the run trains on them."""
    cfg = load_config(
        str(ROOT / "examples" / "mcp_calculator" / "config.yaml"),
        [*TINY_RUN, "run.steps=2", f"run.output_dir={tmp_path}", "run.name=mcp"],
    )
    train(cfg)
    steps = _steps(cfg)
    assert [r["step"] for r in steps] == [1, 2]
    assert all(r["rollout/tool_calls_per_traj"] > 0 and r["rollout/env_tokens"] > 0 for r in steps)
    assert all(r["rollout/tool_error_rate"] < 1.0 for r in steps)  # answers come back, not only errors
