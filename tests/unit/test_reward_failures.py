"""A reward function failing on every sample for `reward.max_failing_steps` steps in a row stops the run with a
message naming it; failures on some samples, or broken runs of all-failed steps, do not."""

import pytest

from agentrl_ray.config import ConfigError
from agentrl_ray.infra.profiles import load_config
from agentrl_ray.rewards import score
from agentrl_ray.rewards.failures import RewardFailureWatch


def judge(completions, **_):
    raise SystemError("the judge is down")


def picky(completions, **_):
    return [None if c == "bad" else 1.0 for c in completions]


def _step_metrics(funcs, completions):
    """The step's `reward/*` metrics as the learner aggregates reward parts (the mean over samples)."""
    _, parts = score(funcs, [1.0] * len(funcs), completions, {})
    n = len(parts)
    metrics = {}
    for p in parts:
        for k, v in p.items():
            metrics[f"reward/{k}"] = metrics.get(f"reward/{k}", 0.0) + v / n
    return metrics


def test_failing_on_every_sample_for_k_steps_stops_naming_the_function():
    watch = RewardFailureWatch(["answer_match", "mypkg.rewards:judge"], ["picky", "judge"], limit=3)
    for step in (1, 2):
        watch.update(step, _step_metrics([picky, judge], ["a", "b"]))
    with pytest.raises(RuntimeError) as e:
        watch.update(3, _step_metrics([picky, judge], ["a", "b"]))
    message = str(e.value)
    assert "reward function 'judge'" in message and "'mypkg.rewards:judge'" in message
    assert "every sample for 3 steps in a row" in message and "reward.max_failing_steps=3" in message


def test_partial_failures_and_interrupted_streaks_do_not_stop():
    def flaky(completions, **_):
        if completions[0] == "fail":
            raise ValueError("flaky")
        return [1.0 for _ in completions]

    def half(completions, **_):
        return [float("nan"), 1.0]  # one sample fails, the other scores

    watch = RewardFailureWatch(["f", "h"], ["flaky", "half"], limit=2)
    for step, first in enumerate(["fail", "ok", "fail", "ok", "fail"], 1):
        watch.update(step, _step_metrics([flaky, half], [first, "x"]))
    assert watch.in_a_row == [1, 0]


def test_the_key_is_validated():
    with pytest.raises(ConfigError, match="reward.max_failing_steps must be at least 1"):
        load_config(None, ["profile=cpu", "reward.max_failing_steps=0"])
    with pytest.raises(ConfigError, match="env.isolation"):
        load_config(None, ["profile=cpu", "env.isolation=container"])
