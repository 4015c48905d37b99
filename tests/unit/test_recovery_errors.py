"""Which failed rollout calls are redone (agentrl_ray/rollout/recovery.py): those an actor's death failed, directly
or through an env host the worker called; any other error is the run's own and is raised. Ray's real exception
types, no cluster needed."""

from __future__ import annotations

import pytest
from ray.exceptions import ActorDiedError, ActorUnavailableError, RayTaskError

from agentrl_ray.rollout.recovery import lost_to_an_actor


def test_a_dead_worker_or_a_dead_env_host_behind_it_loses_the_work():
    assert lost_to_an_actor(ActorDiedError())  # the rollout worker itself
    assert lost_to_an_actor(ActorUnavailableError("unreachable", None))
    behind = RayTaskError("rollout", "traceback", ActorDiedError())  # the worker's call to an env host died
    assert lost_to_an_actor(behind)
    assert lost_to_an_actor(behind.as_instanceof_cause())


def test_the_runs_own_errors_are_not_redone():
    assert not lost_to_an_actor(ValueError("prompt 3 is 400 tokens, over rollout.max_total_tokens=320"))
    assert not lost_to_an_actor(RayTaskError("rollout", "traceback", KeyError("answer")))


def test_each_role_keeps_its_own_restart_bound():
    """Under the collective transport rollout workers are created with max_restarts=0 (the weight group cannot take
    a new member) while env hosts keep recovery.max_actor_restarts: a restarted env host must not end the run."""
    from agentrl_ray.infra.profiles import load_config
    from agentrl_ray.rollout.deadlines import Deadlines
    from agentrl_ray.rollout.recovery import Recovery

    deadlines = Deadlines.of(load_config(None, ["profile=cpu"]))
    recovery = Recovery(["w0", "w1"], ["h0"], deadlines, worker_restarts=0, host_restarts=3)
    assert recovery.bounds == {"rollout worker 0": 0, "rollout worker 1": 0, "env host 0": 3}
    recovery.restarts["env host 0"] = 2
    assert "may restart 3 time(s)" in recovery._bound_message("env host 0")
    assert recovery.max_rounds == 1 + 1 + 4 + 1


def test_every_deliberate_stop_is_a_run_stopped_and_no_crash_is():
    """What the learner records as a deliberate stop (so that Ray Train's retry ends at once, learner/loop.py): the
    guards' errors are RunStopped, including ActorFailed; the errors of a crash are not."""
    from agentrl_ray.learner import guards
    from agentrl_ray.rewards.failures import RewardFailureWatch
    from agentrl_ray.rollout.recovery import ActorFailed
    from agentrl_ray.types import RunStopped

    assert issubclass(ActorFailed, RunStopped)
    with pytest.raises(RunStopped, match="learner.max_nonfinite_steps=2"):
        guards.check_consecutive(2, 2, step=5)
    watch = RewardFailureWatch(["my.module:score"], ["score"], limit=1)
    with pytest.raises(RunStopped, match="reward.max_failing_steps=1"):
        watch.update(1, {"reward/score/error": 1.0})
    assert not issubclass(RayTaskError, RunStopped) and not issubclass(ActorDiedError, RunStopped)


def test_the_learner_deadline_is_set_for_the_fit_and_put_back(monkeypatch):
    """Ray Train takes its worker health-check timeout from the driver's environment at fit(); the driver sets it
    from recovery.learner_unresponsive_s for that call only and leaves a user's own value as it was."""
    import os

    from agentrl_ray.config import ConfigError
    from agentrl_ray.driver import HEALTH_CHECK_TIMEOUT, learner_deadline
    from agentrl_ray.infra.profiles import load_config

    monkeypatch.delenv(HEALTH_CHECK_TIMEOUT, raising=False)
    with learner_deadline(42.0):
        assert os.environ[HEALTH_CHECK_TIMEOUT] == "42.0"
    assert HEALTH_CHECK_TIMEOUT not in os.environ
    monkeypatch.setenv(HEALTH_CHECK_TIMEOUT, "7")
    with learner_deadline(42.0):
        assert os.environ[HEALTH_CHECK_TIMEOUT] == "42.0"
    assert os.environ[HEALTH_CHECK_TIMEOUT] == "7"
    with pytest.raises(ConfigError, match="deadlines must be > 0"):
        load_config(None, ["profile=cpu", "recovery.learner_unresponsive_s=0"])
