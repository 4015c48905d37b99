"""Chaos in the stream pipeline (learner/stream.py): SIGKILL of the rollout worker, then of the env host, while
groups are in flight. Ray restarts each; every call that lost its work is sent again (after the restarted engine
got the newest weights), and counted. The run completes every step, logs each once, trains every step on whole
groups within the staleness bound, and trains no prompt twice. What the stream pipeline gives up next to the batch
one: the trained groups, and so the weights, depend on timing, so the run is not compared bit for bit."""

from __future__ import annotations

import json
import os
import signal
import threading
import time

import pytest
import ray

from agentrl_ray.builtin.resolve import resolve_model
from agentrl_ray.driver import train
from agentrl_ray.infra.profiles import load_config
from agentrl_ray.rollout.pool import RolloutPool

pytestmark = pytest.mark.long
STEPS, K, P, G = 6, 2, 4, 4


def _logged_steps(run_dir) -> list[int]:
    try:
        return [json.loads(line)["step"] for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    except (OSError, ValueError):
        return []


def _after_step(run_dir, step: int, worker) -> None:
    """Once `step` is logged and the worker runs a rollout call (on a loaded machine the engines can run ahead
    until every call out is back, and a kill then loses nothing)."""
    while max(_logged_steps(run_dir), default=-1) < step or ray.get(worker.active_calls.remote()) == 0:
        time.sleep(0.05)


def test_killed_engine_and_env_host_in_a_stream_run_lose_nothing(local_ray, tmp_path):
    cfg = load_config("examples/longtail/config.yaml", _overrides(tmp_path, "chaos", checkpoint_every=0))
    pool = RolloutPool.create(cfg, resolve_model(cfg.model.path))
    pids: dict[str, int] = {}

    def chaos():
        worker, host = pool.workers[0], pool.env_hosts[0]
        pids["worker"], pids["host"] = ray.get([worker.pid.remote(), host.pid.remote()])
        _after_step(cfg.run_dir, 1, worker)  # groups of the next steps are in flight now
        os.kill(pids["worker"], signal.SIGKILL)
        _after_step(cfg.run_dir, 3, worker)
        pids["worker_after"] = ray.get(worker.pid.remote())
        os.kill(pids["host"], signal.SIGKILL)

    thread = threading.Thread(target=chaos, daemon=True)
    try:
        thread.start()
        train(cfg, pool=pool)
        thread.join(timeout=5)
        after = ray.get([pool.workers[0].pid.remote(), pool.env_hosts[0].pid.remote()])
    finally:
        pool.shutdown()
    assert pids["worker_after"] != pids["worker"] and after[1] != pids["host"]  # both were killed and restarted
    records = [json.loads(line) for line in (cfg.run_dir / "metrics.jsonl").read_text().splitlines()]
    assert records[-1]["rollout/regenerated_groups"] >= 1  # the lost calls were sent again
    _check_complete(cfg.run_dir)


def _overrides(tmp_path, name: str, checkpoint_every: int = 1) -> list[str]:
    return [
        "profile=cpu",
        "sync.pipeline=stream",
        f"sync.max_staleness={K}",
        f"rollout.prompts_per_step={P}",
        f"rollout.group_size={G}",
        f"run.steps={STEPS}",
        "run.save_rollouts=1",
        f"run.checkpoint_every={checkpoint_every}",
        f"run.output_dir={tmp_path}",
        f"run.name={name}",
    ]


def _check_complete(run_dir) -> None:
    """Every step logged once, P whole groups each within the bound, no prompt trained twice, none lost (the saved
    rollouts of a step redone after a restart are the redone step's)."""
    records = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    steps = [r for r in records if r["step"] > 0]
    assert [r["step"] for r in steps] == list(range(1, STEPS + 1))
    assert steps[-1]["samples"] == STEPS * P * G
    trained = []
    for step in range(1, STEPS + 1):
        saved = [json.loads(x) for x in (run_dir / "rollouts" / f"step_{step:06d}.jsonl").read_text().splitlines()]
        assert all(step - 1 - t["policy_version"] <= K for t in saved)
        trained += [t["prompt_id"] for t in saved if t["sample_index"] == 0]
    assert len(trained) == len(set(trained)) == STEPS * P


def test_a_killed_learner_in_a_stream_run_restarts_and_trains_no_prompt_twice(local_ray, tmp_path):
    """SIGKILL of the learner worker while groups are in flight: Ray Train restarts it from the latest checkpoint,
    whose consumed slots the new learner's stream takes up (the others are sent again); the engines are left alone."""
    from test_chaos import _learner_pids

    cfg = load_config("examples/longtail/config.yaml", _overrides(tmp_path, "learner"))
    pool = RolloutPool.create(cfg, resolve_model(cfg.model.path))
    killed: list[int] = []

    def chaos():
        _after_step(cfg.run_dir, 2, pool.workers[0])
        killed.extend(_learner_pids())
        for pid in killed:
            os.kill(pid, signal.SIGKILL)

    thread = threading.Thread(target=chaos, daemon=True)
    try:
        before = ray.get(pool.workers[0].pid.remote())
        thread.start()
        train(cfg, pool=pool)
        thread.join(timeout=5)
        after = ray.get(pool.workers[0].pid.remote())
    finally:
        pool.shutdown()
    assert killed and before == after  # the learner died; the engine was left alone
    _check_complete(cfg.run_dir)


def test_a_killed_driver_of_a_stream_run_resumes_and_trains_no_prompt_twice(tmp_path):
    """`agentrl-ray train` of a stream run SIGKILLed with everything it started once checkpoint 3 is committed (groups
    of the next steps in flight); `run.resume=true` in a new process gives the engines the checkpoint's weights and
    version at once (else every group would come back past the bound, be dropped and sent again, for ever), sends
    the slots checkpoint 3 had not consumed again and completes the run: each step once, no prompt trained twice."""
    import subprocess
    import sys

    from test_chaos import kill_the_driver_once_committed

    cli = [sys.executable, "-m", "agentrl_ray.cli", "train", "examples/longtail/config.yaml"]
    cli += _overrides(tmp_path, "driver")
    run_dir = tmp_path / "driver"
    env = kill_the_driver_once_committed(cli, tmp_path, run_dir, "checkpoint_000003", STEPS)
    done = subprocess.run([*cli, "run.resume=true"], env=env, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-3000:]
    _check_complete(run_dir)
