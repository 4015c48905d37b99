"""Which failed rollout calls are redone (agentrl_ray/rollout/recovery.py): those an actor's death failed, directly
or through an env host the worker called; any other error is the run's own and is raised. Ray's real exception
types, no cluster needed."""

from __future__ import annotations

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
    from agentrl_ray.config import load_config
    from agentrl_ray.deadlines import Deadlines
    from agentrl_ray.rollout.recovery import Recovery

    deadlines = Deadlines.of(load_config(None, ["profile=cpu"]))
    recovery = Recovery(["w0", "w1"], ["h0"], deadlines, worker_restarts=0, host_restarts=3)
    assert recovery.bounds == {"rollout worker 0": 0, "rollout worker 1": 0, "env host 0": 3}
    recovery.restarts["env host 0"] = 2
    assert "may restart 3 time(s)" in recovery._bound_message("env host 0")
    assert recovery.max_rounds == 1 + 1 + 4 + 1
