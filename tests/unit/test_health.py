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


# ----------------------------------------------------------------------------------------------------------------
# Verdicts on recorded-looking runs of the calculator task (128 samples a step).
#
# Steps 1-20 of the default run are recorded (torch backend, built-in model, example config, 2026-11-26): per step
# rollout/success (= reward/mean: rewards are 0 or 1), reward/group_std, rollout/zero_variance_groups,
# loss/entropy, loss/grad_norm, loss/mismatch_kl, loss/clip_frac_low, rollout/tool_calls_per_traj,
# rollout/tool_error_rate. Its steps 21-50 follow the end the default run reports (README, docs/default_run.md):
# training success around 0.92, entropy down to 0.011 against a baseline near 0.6, where the old rule said
# `health RED: entropy 0.011 vs baseline 0.557 (collapse)`.
DEFAULT_RUN_FIRST_20 = [
    (0.2656, 0.4047, 0.0625, 0.5984, 0.4733, 1.7e-09, 0.0, 0.2891, 0.0),
    (0.2891, 0.3582, 0.1875, 0.6192, 0.4301, 0.001687, 0.005197, 0.2891, 0.0),
    (0.3438, 0.4064, 0.125, 0.5474, 0.4631, 0.0004071, 0.0, 0.3438, 0.0),
    (0.3047, 0.4195, 0.0625, 0.5687, 0.4885, 0.0002588, 0.0008361, 0.3281, 0.0),
    (0.3359, 0.3622, 0.1875, 0.5545, 0.398, 0.0002682, 0.0, 0.3594, 0.0),
    (0.4453, 0.436, 0.0, 0.524, 0.3828, 0.0003832, 0.0, 0.4844, 0.0),
    (0.4531, 0.4753, 0.0, 0.5229, 0.4443, 0.0004265, 0.0, 0.4531, 0.0),
    (0.5078, 0.4583, 0.0, 0.4185, 0.436, 0.0007235, 0.0, 0.5391, 0.0),
    (0.3984, 0.3437, 0.25, 0.4059, 0.2659, 0.000912, 0.004551, 0.5391, 0.0),
    (0.5312, 0.4143, 0.0625, 0.3711, 0.3257, 0.00156, 0.02528, 0.5859, 0.02667),
    (0.5312, 0.3787, 0.125, 0.2684, 0.129, 0.001453, 0.02662, 0.6719, 0.0),
    (0.6875, 0.2901, 0.3125, 0.1676, 0.07281, 0.0009984, 0.01438, 0.7891, 0.0),
    (0.7656, 0.3565, 0.125, 0.1838, 0.4084, 0.002193, 0.009639, 0.7812, 0.0),
    (0.8203, 0.2736, 0.25, 0.07108, 0.188, 0.0003673, 0.00149, 0.8672, 0.009009),
    (0.7969, 0.3113, 0.1875, 0.0965, 0.3382, 0.000623, 0.001914, 0.8359, 0.009346),
    (0.7891, 0.2975, 0.3125, 0.08412, 0.2717, 0.0002996, 0.001858, 0.8438, 0.009259),
    (0.7578, 0.3255, 0.125, 0.1473, 0.3632, 0.0002909, 0.001892, 0.7969, 0.01961),
    (0.7422, 0.2111, 0.5, 0.05525, 0.3533, 6.601e-05, 0.0002962, 0.9141, 0.0),
    (0.8359, 0.1951, 0.5, 0.07225, 0.2705, 0.0001278, 0.0007164, 0.8828, 0.00885),
    (0.9297, 0.1718, 0.5, 0.03483, 0.2889, 0.0005611, 0.001353, 0.9531, 0.01639),
]
KEYS = (
    "rollout/success",
    "reward/group_std",
    "rollout/zero_variance_groups",
    "loss/entropy",
    "loss/grad_norm",
    "loss/mismatch_kl",
    "loss/clip_frac_low",
    "rollout/tool_calls_per_traj",
    "rollout/tool_error_rate",
)


def step(row) -> dict:
    m = dict(zip(KEYS, row, strict=True))
    return {**m, "reward/mean": m["rollout/success"], "loss/kl": 0.0, "loss/clip_frac_high": 0.0}


def default_run() -> list[dict]:
    steps = [step(r) for r in DEFAULT_RUN_FIRST_20]
    for i in range(30):  # steps 21-50: success around 0.92, entropy 0.035 -> 0.011 (0.02x the baseline)
        success = 0.92 + (0.03 if i % 2 else -0.02)
        entropy = 0.035 * (0.011 / 0.035) ** ((i + 1) / 30)
        steps.append(step((success, 0.17, 0.55, entropy, 0.27, 0.0004, 0.001, 1.0, 0.01)))
    return steps


def verdicts(steps: list[dict]):
    monitor = HealthMonitor()
    return [monitor.update(m) for m in steps]


def test_the_default_run_converges_ok():
    steps = default_run()
    assert steps[-1]["loss/entropy"] / 0.5984 < 0.02  # the old rule's red collapse
    out = verdicts(steps)
    assert [v.level for v in out] == [OK] * 50, [(i + 1, v.reasons) for i, v in enumerate(out) if v.level]


def test_a_run_converged_near_perfect_is_ok_as_its_group_variance_vanishes():
    """The default run on the shipped model ends near 0.985 training success: most groups all right, group std
    ~0.05 against a peak of 0.48. That is convergence; the same std at a middling success is still a warning."""
    steps = default_run()[:20] + [step((0.985, 0.05, 0.9, 0.02, 0.2, 0.0004, 0.001, 1.0, 0.0))] * 30
    assert [v.level for v in verdicts(steps)] == [OK] * 50
    stuck = default_run()[:20] + [step((0.5, 0.05, 0.0, 0.4, 0.3, 0.0004, 0.001, 1.0, 0.0))] * 10
    assert "reward variance collapsing" in " ".join(verdicts(stuck)[-1].reasons)


def test_entropy_collapse_with_falling_success_is_red():
    """The policy had converged, then its success falls while its entropy keeps collapsing: red, once the drop
    shows in the window, and the reason says what success did."""
    steps = default_run()[:30]
    for i in range(15):
        success = 0.9 - 0.04 * (i + 1)  # 0.86 -> 0.30
        steps.append(step((success, 0.25, 0.4, 0.004, 0.3, 0.001, 0.002, 1.0, 0.02)))
    out = verdicts(steps)
    assert all(v.level == OK for v in out[:30])
    first_red = next(i for i, v in enumerate(out) if v.level == RED)
    assert 30 <= first_red <= 34  # within the window after the drop starts
    assert all(v.level == RED for v in out[first_red:])
    assert "collapse; success" in out[-1].reasons[0] and "over the last 5 steps" in out[-1].reasons[0]


def test_entropy_collapse_at_a_low_success_is_red():
    """A too-high learning rate (docs/supervision.md: lr 1e-2): the policy turns deterministic on a wrong answer,
    success stays low. Trust-region signals left healthy here, so the entropy rule alone must say red."""
    steps = [step(r) for r in DEFAULT_RUN_FIRST_20[:3]]
    for i in range(10):
        entropy = 0.5 * 0.4 ** (i + 1)  # 0.2 -> 5e-5
        steps.append(step((0.25 if i < 2 else 0.05, 0.2, 0.6, entropy, 0.4, 0.001, 0.0, 0.3, 0.0)))
    out = verdicts(steps)
    assert out[-1].level == RED and "entropy" in out[-1].reasons[0] and "(collapse" in out[-1].reasons[0]
    assert any(v.level == RED for v in out[3:8])  # before the window of success is whole, too


def test_a_run_without_signal_keeps_its_verdict():
    """All-zero rewards: no learning signal (warn, then red after 3 steps), entropy untouched."""
    steps = [step((0.0, 0.0, 1.0, 0.6, 0.0, 0.0, 0.0, 0.0, 0.0)) for _ in range(6)]
    out = verdicts(steps)
    assert [v.level for v in out] == [WARN, WARN, RED, RED, RED, RED]
    assert all(v.reasons == [f"all groups zero-variance for {n} steps: no learning signal"] for n, v in
               zip(range(3, 7), out[2:], strict=True))  # fmt: skip


def test_a_diverged_run_is_red_whatever_its_success():
    """The NaN guard's case: a non-finite loss is red even at a converged success."""
    steps = default_run()
    steps[-1] = {**steps[-1], "loss/policy_loss": math.nan}
    assert verdicts(steps)[-1].level == RED
