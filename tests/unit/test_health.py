"""Health verdicts, early stopping, LR schedules and stability presets, as pure functions."""

import math

import pytest

from agentrl_ray.config import ConfigError
from agentrl_ray.infra.profiles import load_config
from agentrl_ray.learner.health import OK, RED, WARN, EarlyStopper, HealthMonitor
from agentrl_ray.learner.schedule import lr_at

HEALTHY = {
    "reward/mean": 0.4,
    "reward/group_std": 0.4,
    "rollout/zero_variance_groups": 0.2,
    "loss/entropy": 0.7,
    "loss/kl": 0.0,
    "loss/mismatch_kl": 0.001,
    "loss/clip_frac_low": 0.01,
    "loss/clip_frac_high": 0.01,
    "loss/grad_norm": 1.0,
    "rollout/tool_calls_per_traj": 1.0,
    "rollout/tool_error_rate": 0.05,
}


def run(steps):
    monitor = HealthMonitor()
    return [monitor.update(dict(HEALTHY, **s)) for s in steps]


def test_healthy_steps_are_ok_and_the_verdict_lands_in_the_metrics():
    verdicts = run([{}] * 5)
    assert [v.level for v in verdicts] == [OK] * 5
    assert verdicts[0].metrics() == {"health/level": 0, "health/reasons": ""}


@pytest.mark.parametrize(
    "bad, level, reason",
    [
        ({"loss/mismatch_kl": 3.3}, RED, "KL 3.3 > 0.5"),
        ({"loss/kl": 0.1}, WARN, "KL 0.1 > 0.05"),
        ({"loss/clip_frac_low": 0.3, "loss/clip_frac_high": 0.3}, RED, "clip fraction 0.6 > 0.5"),
        ({"loss/grad_norm": 8.0}, WARN, "grad norm 8 / running median 1 = 8 > 5"),
        ({"loss/grad_norm": 50.0}, RED, "grad norm 50"),
        ({"loss/entropy": 0.01}, RED, "collapse"),
        ({"loss/entropy": 0.05}, WARN, "falling"),
        ({"loss/entropy": 3.5}, RED, "blow-up"),
        ({"rollout/tool_error_rate": 0.95}, RED, "tool-error rate 0.95 > 0.9"),
        ({"reward/group_std": 0.05}, WARN, "reward variance collapsing"),
        ({"loss/policy_loss": math.nan}, RED, "non-finite loss/policy_loss"),
    ],
)
def test_each_signal_after_a_healthy_start(bad, level, reason):
    verdict = run([{}] * 4 + [bad])[-1]
    assert verdict.level == level and any(reason in r for r in verdict.reasons), verdict


def test_zero_variance_warns_then_turns_red_when_it_persists():
    levels = [v.level for v in run([{}, *[{"rollout/zero_variance_groups": 1.0}] * 3, {}])]
    assert levels == [OK, WARN, WARN, RED, OK]


def test_grad_norm_spike_is_relative_to_the_running_median():
    # Large but steady grad norms are no spike; a jump against them is.
    assert [v.level for v in run([{"loss/grad_norm": 40.0}] * 5)] == [OK] * 5
    assert run([{"loss/grad_norm": 40.0}] * 4 + [{"loss/grad_norm": 900.0}])[-1].level == RED


def test_early_stopper_patience_min_delta_and_mode():
    stop = EarlyStopper("eval/success", patience=2, min_delta=0.05)
    assert stop.update(1, {"eval/success": 0.2}) is None
    assert stop.update(2, {"reward/mean": 0.9}) is None  # no evaluation this step: does not count
    assert stop.update(3, {"eval/success": 0.24}) is None  # +0.04 is within min_delta: stale 1
    assert stop.update(4, {"eval/success": 0.3}) is None  # a real gain resets the count
    assert stop.update(5, {"eval/success": 0.3}) is None
    reason = stop.update(6, {"eval/success": 0.28})
    assert reason.startswith("eval/success has not improved by more than 0.05 for 2 evaluations (best 0.3000 at step 4")
    lower = EarlyStopper("eval/echo_ce", patience=1, mode="min")
    assert lower.update(1, {"eval/echo_ce": 2.0}) is None and lower.update(2, {"eval/echo_ce": 1.5}) is None
    assert lower.update(3, {"eval/echo_ce": 1.6}) is not None
    assert EarlyStopper("eval/success", patience=0).update(1, {"eval/success": 0.0}) is None  # off


def test_lr_schedules():
    kw = dict(warmup_steps=2, total_steps=12, min_lr_ratio=0.1)
    assert [lr_at(s, 1.0, "constant", **kw) for s in (0, 1, 2, 11)] == [0.5, 1.0, 1.0, 1.0]
    assert lr_at(2, 1.0, "linear", **kw) == 1.0 and lr_at(11, 1.0, "linear", **kw) == pytest.approx(0.1)
    assert lr_at(6.5, 1.0, "linear", **kw) == pytest.approx(0.55)  # halfway through the decay
    assert lr_at(2, 1.0, "cosine", **kw) == 1.0 and lr_at(11, 1.0, "cosine", **kw) == pytest.approx(0.1)
    assert lr_at(6.5, 1.0, "cosine", **kw) == pytest.approx(0.55)  # cosine is symmetric about its midpoint
    assert lr_at(4, 1.0, "cosine", **kw) > lr_at(4, 1.0, "linear", **kw)  # and stays higher early on
    decay = [lr_at(s, 1.0, "cosine", **kw) for s in range(12)]
    assert all(a >= b for a, b in zip(decay[2:], decay[3:]))
    assert lr_at(0, 1.0, "cosine", warmup_steps=0, total_steps=1, min_lr_ratio=0.0) == 1.0  # one step: no decay
    with pytest.raises(ValueError, match="unknown lr schedule 'step'"):
        lr_at(0, 1.0, "step", **kw)


def test_stability_presets_layer_between_profile_and_user():
    balanced = load_config(overrides=["profile=cpu"])
    careful = load_config(overrides=["profile=cpu", "stability=conservative"])
    bold = load_config(overrides=["profile=cpu", "stability=aggressive"])
    assert careful.learner.lr == pytest.approx(balanced.learner.lr / 3) and bold.learner.lr == 3 * balanced.learner.lr
    assert careful.algorithm.beta > 0 and careful.learner.lr_schedule == "cosine"
    assert careful.rollout.prompts_per_step == 2 * balanced.rollout.prompts_per_step
    assert careful.learner.max_grad_norm < balanced.learner.max_grad_norm < bold.learner.max_grad_norm
    # Relative to the profile's own learning rate (LoRA's is 10x), and the user's keys win.
    lora = load_config(overrides=["profile=lora", "stability=conservative"])
    assert lora.learner.lr == pytest.approx(1e-3 / 3)
    mine = load_config(overrides=["profile=cpu", "stability=conservative", "learner.lr=5e-5"])
    assert mine.learner.lr == 5e-5 and mine.algorithm.epsilon == 0.1
    with pytest.raises(ConfigError, match="stability: 'wild' is not one of"):
        load_config(overrides=["stability=wild"])


def test_early_stopping_config_checks():
    with pytest.raises(ConfigError, match="must be a held-out eval/ metric"):
        load_config(overrides=["run.early_stopping_patience=2", "run.early_stopping_metric=reward/mean"])
    with pytest.raises(ConfigError, match="needs run.eval_every > 0"):
        load_config(overrides=["run.early_stopping_patience=2", "run.eval_every=0"])
    with pytest.raises(ConfigError, match="min_lr_ratio"):
        load_config(overrides=["learner.min_lr_ratio=2"])
