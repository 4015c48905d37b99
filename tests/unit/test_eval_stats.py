"""Training's held-out evaluation reports pass@1 with a 95% bootstrap interval and pass@k (`eval_stats`), the same
numbers `agentrl-ray eval` reports for the same samples."""

import pytest
from builders import trajectory

from agentrl_ray.rewards.eval_stats import by_category, pass_rates, training_eval_metrics
from agentrl_ray.run.step_lines import eval_text
from agentrl_ray.trained.evaluate import summarize
from agentrl_ray.types import TrajectoryGroup


def _group(pid: str, rewards: list[float]) -> TrajectoryGroup:
    return TrajectoryGroup(pid, [trajectory(pid, i, r) for i, r in enumerate(rewards)])


def test_training_metrics_carry_pass_at_1_with_its_interval_and_pass_at_k():
    # 40 prompts x 4 samples: 10 always right, 10 right once, 20 never.
    groups = [_group(f"a{i}", [1.0] * 4) for i in range(10)]
    groups += [_group(f"b{i}", [1.0, 0.0, 0.0, 0.0]) for i in range(10)]
    groups += [_group(f"c{i}", [0.0] * 4) for i in range(20)]
    m = training_eval_metrics(groups, 1.0)
    assert m["eval/success"] == m["eval/pass@1"] == pytest.approx((40 + 10) / 160)
    assert m["eval/pass@2"] == pytest.approx((10 + 10 * 0.5) / 40)  # one right of 4: pass@2 = 1 - C(3,2)/C(4,2)
    assert m["eval/pass@4"] == pytest.approx(20 / 40)
    assert "eval/pass@8" not in m and m["eval/samples_per_prompt"] == 4
    lo, hi = m["eval/pass@1_ci95_lo"], m["eval/pass@1_ci95_hi"]
    assert 0.0 < lo < m["eval/pass@1"] < hi < 1.0
    # Resampling prompts, not samples: the interval is that of 40 prompts' means, wider than 160 coin flips' would be.
    assert hi - lo > 2 * 1.96 * (0.3125 * 0.6875 / 160) ** 0.5
    assert all(isinstance(v, float) for v in m.values())  # metrics.jsonl and the trackers take plain floats
    # `agentrl-ray eval` reports the same numbers for the same groups.
    report = summarize(groups, 1.0)
    assert report["pass@1_ci95"] == [lo, hi] and report["pass@2"] == m["eval/pass@2"]
    # Groups come back from the rollout workers in any order: the interval does not depend on it.
    shuffled = training_eval_metrics(groups[::-1], 1.0)
    assert [shuffled["eval/pass@1_ci95_lo"], shuffled["eval/pass@1_ci95_hi"]] == [lo, hi]


def test_one_greedy_sample_per_prompt_gets_an_interval_but_no_pass_at_k():
    groups = [_group(f"p{i}", [float(i % 5 != 0)]) for i in range(200)]  # 160 of 200 right
    m = training_eval_metrics(groups, 1.0)
    assert m["eval/pass@1"] == 0.8 and not any(k.startswith("eval/pass@2") for k in m)
    assert m["eval/pass@1_ci95_lo"] == pytest.approx(0.745, abs=0.02)  # the binomial interval, 0.8 +- 0.055
    assert m["eval/pass@1_ci95_hi"] == pytest.approx(0.855, abs=0.02)
    assert pass_rates([_group("all", [1.0])], 1.0)["pass@1_ci95"] == [1.0, 1.0]


def test_the_progress_line_shows_the_interval_and_pass_at_k():
    m = training_eval_metrics([_group("a", [1.0, 0.0]), _group("b", [0.0, 0.0])], 1.0)
    text = eval_text(m)
    assert text.startswith("success 0.250 (pass@1 95% CI 0.000-0.500") and "pass@2 0.500" in text
    assert eval_text({"eval/success": 0.5}) == "success 0.500"  # a run logged before the interval existed


def test_rows_with_a_category_get_pass_at_1_per_category():
    groups = [_group(f"s{i}", [1.0] if i < 3 else [0.0]) for i in range(4)]  # simple: 3 of 4
    groups += [_group(f"p{i}", [0.0]) for i in range(2)]  # parallel: 0 of 2
    rows = [{"id": g.prompt_id, "category": "simple" if g.prompt_id[0] == "s" else "parallel"} for g in groups]
    m = training_eval_metrics(groups, 1.0, rows)
    assert m["eval/simple/pass@1"] == 0.75 and m["eval/parallel/pass@1"] == 0.0
    assert m["eval/simple/pass@1_ci95_lo"] <= 0.75 <= m["eval/simple/pass@1_ci95_hi"]
    assert m["eval/pass@1"] == pytest.approx(0.5)  # the pooled number stays
    assert not any("/" in k.removeprefix("eval/") for k in training_eval_metrics(groups, 1.0))  # no column, none
    assert set(by_category(groups, rows, 1.0)) == {"parallel", "simple"}
